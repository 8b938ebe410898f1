//! The guard as a pure function: every kind of request against every kind of peer.

use std::net::SocketAddr;

use axum::http::{HeaderMap, HeaderValue, Method, Uri, Version};

use super::*;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn loopback() -> Option<SocketAddr> {
    Some("127.0.0.1:50000".parse().unwrap())
}

fn remote() -> Option<SocketAddr> {
    Some("10.1.2.3:50000".parse().unwrap())
}

/// A request's parts: method, headers (name, value), from `peer`, HTTP/1.1, origin-form.
fn verdict(
    method: &Method,
    headers: &[(&str, &str)],
    peer: Option<SocketAddr>,
    access: &AdminAccess,
) -> Result<(), Refusal> {
    verdict_at(method, Version::HTTP_11, "/pressure", headers, peer, access)
}

fn verdict_at(
    method: &Method,
    version: Version,
    target: &str,
    headers: &[(&str, &str)],
    peer: Option<SocketAddr>,
    access: &AdminAccess,
) -> Result<(), Refusal> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    let target: Uri = target.parse().unwrap();
    check(method, version, &target, &map, peer, access)
}

fn open() -> AdminAccess {
    AdminAccess::new(vec!["shedgate-admin.ops.svc".to_owned()], None)
}

fn with_token() -> AdminAccess {
    AdminAccess::new(vec![], Some(TOKEN))
}

// === Host ===

#[test]
fn ip_literals_and_localhost_are_served() {
    for host in [
        "127.0.0.1",
        "127.0.0.1:9901",
        "10.42.0.7:9901",
        "[::1]",
        "[::1]:9901",
        "[fd00::7]:9901",
        "localhost",
        "localhost:9901",
        "LocalHost.:9901",
        "shedgate-admin.ops.svc",
        "SHEDGATE-ADMIN.ops.svc.:80",
        "127.0.0.1:",
    ] {
        for method in [Method::GET, Method::POST] {
            assert_eq!(
                verdict(&method, &[("host", host)], loopback(), &open()),
                Ok(()),
                "{host}"
            );
        }
    }
}

#[test]
fn other_names_are_misdirected_for_every_method() {
    for host in [
        "rebind.attacker.example:9901",
        "rebind.attacker.example",
        "localhost.attacker.example",
        "evil.localhost",
        "ops.svc",
        "0.0.0.0",
        "0.0.0.0:9901",
        "[::]:9901",
        "[::ffff:0.0.0.0]:9901",
        "::1",
        "[::1]x",
        "127.0.0.1:99999999",
        "127.0.0.1:port",
        "2130706433",
        "user@127.0.0.1",
        "",
    ] {
        for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
            let v = verdict(&method, &[("host", host)], loopback(), &open());
            assert!(
                matches!(&v, Err(Refusal::Misdirected(h)) if h == host),
                "{method} {host}: {v:?}"
            );
            assert_eq!(v.unwrap_err().status(), StatusCode::MISDIRECTED_REQUEST);
        }
    }
}

#[test]
fn host_missing_or_twice() {
    let v = verdict(&Method::GET, &[], loopback(), &open());
    assert!(matches!(v, Err(Refusal::HostHeader(_))), "{v:?}");
    let two = [("host", "127.0.0.1"), ("host", "127.0.0.1")];
    let v = verdict(&Method::GET, &two, loopback(), &open());
    assert!(matches!(v, Err(Refusal::HostHeader(_))), "{v:?}");
    // HTTP/1.0 needs none.
    let v = verdict_at(
        &Method::GET,
        Version::HTTP_10,
        "/",
        &[],
        loopback(),
        &open(),
    );
    assert_eq!(v, Ok(()));
}

#[test]
fn an_absolute_form_target_must_name_the_listener_too() {
    let host = [("host", "127.0.0.1:9901")];
    for (target, served) in [
        ("http://127.0.0.1:9901/metrics", true),
        ("http://localhost/metrics", true),
        ("http://rebind.attacker.example:9901/metrics", false),
        ("http://user@rebind.attacker.example/metrics", false),
    ] {
        let v = verdict_at(
            &Method::GET,
            Version::HTTP_11,
            target,
            &host,
            loopback(),
            &open(),
        );
        assert_eq!(v.is_ok(), served, "{target}: {v:?}");
    }
}

// === Origin ===

#[test]
fn any_origin_on_a_state_changing_request_is_forbidden() {
    for origin in ["http://evil.example", "null", "http://127.0.0.1:9901", ""] {
        for method in [Method::PUT, Method::POST, Method::DELETE, Method::PATCH] {
            let headers = [
                ("host", "127.0.0.1:9901"),
                ("origin", origin),
                ("content-type", "application/json"),
            ];
            for access in [open(), with_token()] {
                let v = verdict(&method, &headers, loopback(), &access);
                assert_eq!(v, Err(Refusal::BrowserOrigin), "{method} {origin:?}");
            }
        }
        // Reads stay open: a page cannot read another origin's answer without CORS headers.
        let headers = [("host", "127.0.0.1:9901"), ("origin", origin)];
        assert_eq!(verdict(&Method::GET, &headers, loopback(), &open()), Ok(()));
    }
}

// === Content-Type ===

#[test]
fn only_json_or_no_body_changes_state() {
    let refused = [
        vec![("content-type", "text/plain")],
        vec![("content-type", "text/plain;charset=UTF-8")],
        vec![
            ("content-type", "application/x-www-form-urlencoded"),
            ("content-length", "0"),
        ],
        vec![("content-type", "multipart/form-data; boundary=x")],
        vec![("content-type", "application/octet-stream")],
        vec![("content-type", "application/jsonx")],
        vec![
            ("content-type", "application/json"),
            ("content-type", "text/plain"),
        ],
        // A `fetch` with a `Blob` body, or `sendBeacon`: no type, a body.
        vec![("content-length", "10")],
        vec![("transfer-encoding", "chunked")],
    ];
    for extra in refused {
        let mut headers = vec![("host", "127.0.0.1:9901")];
        headers.extend(extra.iter().copied());
        let v = verdict(&Method::POST, &headers, loopback(), &open());
        assert!(matches!(v, Err(Refusal::NotJson(_))), "{extra:?}: {v:?}");
        let refusal = v.unwrap_err();
        assert_eq!(refusal.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(refusal.title_and_detail().1.contains("application/json"));
        // Reads are not asked for a type.
        assert_eq!(verdict(&Method::GET, &headers, loopback(), &open()), Ok(()));
    }
    let accepted = [
        vec![],
        vec![("content-length", "0")],
        vec![("content-type", "application/json")],
        vec![("content-type", "Application/JSON; charset=utf-8")],
        vec![
            ("content-type", "application/json"),
            ("content-length", "12"),
        ],
    ];
    for extra in accepted {
        let mut headers = vec![("host", "127.0.0.1:9901")];
        headers.extend(extra.iter().copied());
        let v = verdict(&Method::POST, &headers, loopback(), &open());
        assert_eq!(v, Ok(()), "{extra:?}");
    }
}

// === Peer and token ===

#[test]
fn beyond_loopback_state_changes_need_the_token() {
    let host = ("host", "10.42.0.7:9901");
    let json = ("content-type", "application/json");
    let right = format!("Bearer {TOKEN}");
    let right_lower = format!("bearer   {TOKEN}");
    let wrong = format!("Bearer {TOKEN}x");
    let basic = "Basic dXNlcjpwYXNz";
    // Access, peer, Authorization sent, verdict.
    type Case<'a> = (
        AdminAccess,
        Option<SocketAddr>,
        Option<&'a str>,
        Result<(), Refusal>,
    );
    let cases: &[Case<'_>] = &[
        // No token configured: loopback only, whatever is sent.
        (open(), loopback(), None, Ok(())),
        (open(), loopback(), Some(basic), Ok(())),
        (open(), remote(), None, Err(Refusal::NotLoopback)),
        (open(), remote(), Some(&right), Err(Refusal::NotLoopback)),
        (open(), None, None, Err(Refusal::NotLoopback)),
        // A token configured.
        (with_token(), remote(), None, Err(Refusal::TokenMissing)),
        (with_token(), None, None, Err(Refusal::TokenMissing)),
        (with_token(), remote(), Some(&right), Ok(())),
        (with_token(), remote(), Some(&right_lower), Ok(())),
        (
            with_token(),
            remote(),
            Some(&wrong),
            Err(Refusal::TokenInvalid),
        ),
        (
            with_token(),
            remote(),
            Some(basic),
            Err(Refusal::TokenInvalid),
        ),
        (
            with_token(),
            remote(),
            Some("Bearer"),
            Err(Refusal::TokenInvalid),
        ),
        (
            with_token(),
            remote(),
            Some(TOKEN),
            Err(Refusal::TokenInvalid),
        ),
        (with_token(), loopback(), None, Ok(())),
        (with_token(), loopback(), Some(&right), Ok(())),
        (
            with_token(),
            loopback(),
            Some(&wrong),
            Err(Refusal::TokenInvalid),
        ),
    ];
    for (access, peer, authorization, expected) in cases {
        let mut headers = vec![host, json];
        if let Some(a) = authorization {
            headers.push(("authorization", a));
        }
        let v = verdict(&Method::PUT, &headers, *peer, access);
        assert_eq!(&v, expected, "{peer:?} {authorization:?} {access:?}");
        // Reads need nothing, from anywhere.
        assert_eq!(verdict(&Method::GET, &[host], *peer, access), Ok(()));
    }
    let twice = [
        host,
        json,
        ("authorization", right.as_str()),
        ("authorization", right.as_str()),
    ];
    let v = verdict(&Method::PUT, &twice, remote(), &with_token());
    assert_eq!(v, Err(Refusal::TokenInvalid));
}

#[test]
fn loopback_in_every_spelling() {
    for peer in [
        "127.0.0.1:1",
        "127.9.9.9:1",
        "[::1]:1",
        "[::ffff:127.0.0.1]:1",
    ] {
        let peer: SocketAddr = peer.parse().unwrap();
        let v = verdict(
            &Method::DELETE,
            &[("host", "localhost")],
            Some(peer),
            &open(),
        );
        assert_eq!(v, Ok(()), "{peer}");
    }
    for peer in ["[::ffff:10.0.0.1]:1", "[fe80::1]:1", "192.0.2.1:1"] {
        let peer: SocketAddr = peer.parse().unwrap();
        let v = verdict(
            &Method::DELETE,
            &[("host", "localhost")],
            Some(peer),
            &open(),
        );
        assert_eq!(v, Err(Refusal::NotLoopback), "{peer}");
    }
}

#[test]
fn refusals_answer_problem_json_with_a_challenge_for_401() {
    let r = Refusal::TokenInvalid.into_response();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let challenge = r.headers()[header::WWW_AUTHENTICATE].to_str().unwrap();
    assert!(challenge.contains("invalid_token"), "{challenge}");
    let r = Refusal::TokenMissing.into_response();
    assert_eq!(
        r.headers()[header::WWW_AUTHENTICATE],
        "Bearer realm=\"shedgate-admin\""
    );
    let r = Refusal::Misdirected("x".to_owned()).into_response();
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        crate::edge::rejection::PROBLEM_JSON
    );
    assert!(!r.headers().contains_key(header::WWW_AUTHENTICATE));
}

#[test]
fn safe_methods_are_the_rfc_ones() {
    for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
        assert!(!is_state_changing(&m), "{m}");
    }
    let custom = Method::from_bytes(b"PURGE").unwrap();
    for m in [
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        custom,
    ] {
        assert!(is_state_changing(&m), "{m}");
    }
}

// === Settings ===

#[test]
fn token_file_content() {
    assert_eq!(token_text(format!("{TOKEN}\n").as_bytes()), Ok(TOKEN));
    assert_eq!(token_text(format!("{TOKEN}\r\n").as_bytes()), Ok(TOKEN));
    assert_eq!(token_text(TOKEN.as_bytes()), Ok(TOKEN));
    let b64 = "q0Z+3v/9aB-c_d.e~fGhIjKlMnOpQrStUv==";
    assert_eq!(token_text(b64.as_bytes()), Ok(b64));
    for bad in [
        format!("{TOKEN}\n\n"),
        format!(" {TOKEN}"),
        format!("{TOKEN} x"),
        format!("{TOKEN}=x"),
        format!("{TOKEN}é"),
        "short".to_owned(),
        String::new(),
        "\n".to_owned(),
    ] {
        assert!(token_text(bad.as_bytes()).is_err(), "{bad:?}");
    }
    assert!(
        token_text(b"0123456789abcdef")
            .unwrap_err()
            .contains("at least 32")
    );
}

#[test]
fn allowed_names() {
    assert_eq!(
        AdminAccess::allowed_name("Shedgate-Admin.ops.svc.").as_deref(),
        Ok("shedgate-admin.ops.svc")
    );
    for bad in [
        "10.0.0.1",
        "[::1]",
        "::1",
        "host:9901",
        "http://host",
        "localhost",
        "",
        "-x.example",
        "a..b",
        "under_score.example",
    ] {
        let e = AdminAccess::allowed_name(bad).unwrap_err();
        assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
    }
}

#[test]
fn the_token_is_not_in_debug_output() {
    let text = format!("{:?}", with_token());
    assert!(!text.contains(TOKEN) && text.contains("<set>"), "{text}");
}
