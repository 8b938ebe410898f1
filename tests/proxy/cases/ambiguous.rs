//! Ambiguous input and edge hygiene: a fact the request states twice, differently, is
//! unreadable, never resolved by guessing (a stream becomes unknown, so never shed; a time not
//! stale; coordinates the default rank), and counted as `fact="ambiguous"`; request targets
//! and forwarding headers that would make the upstream see something else than the proxy.

use super::*;

async fn ambiguous_count(s: &Setup) -> f64 {
    unreadable(s, &[("fact", "ambiguous")]).await
}

/// Two `X-Stream` values, sheddable first, never second: unknown, so forwarded at 0.99
/// with both lines; in the other order too (a sender cannot dodge or force shedding).
#[tokio::test]
async fn case_duplicate_stream_header() {
    let s = setup().await;
    let case = "faults/duplicate-stream-header.http";
    let r = assert_forwarded(&s, case, 0.99).await;
    let streams: Vec<_> = r.headers.get_all("x-stream").iter().collect();
    assert_eq!(streams.len(), 2, "both lines reach the upstream");
    let swapped = String::from_utf8(render(case))
        .unwrap()
        .replacen("X-Stream: vehicle.position", "X-Stream: tmp", 1)
        .replacen(
            "X-Stream: geofence.transition",
            "X-Stream: vehicle.position",
            1,
        )
        .replacen("X-Stream: tmp", "X-Stream: geofence.transition", 1);
    assert_forwarded_bytes(&s, case, swapped.as_bytes(), 0.99).await;
    // The same value twice is one statement: a sheddable stream, shed at 0.99.
    let same = String::from_utf8(render(case)).unwrap().replacen(
        "X-Stream: geofence.transition",
        "X-Stream: vehicle.position",
        1,
    );
    pin(&s.proxy, 0.99).await;
    assert_eq!(exchange(&s.proxy, same.as_bytes()).await.status, 503);
    assert_eq!(ambiguous_count(&s).await, 2.0);
}

/// The time key twice, fresh then 10 minutes old: unreadable, so not stale (forwarded at 0.3,
/// where a stale event would be answered 202), and counted.
#[tokio::test]
async fn case_duplicate_time_key() {
    let s = setup().await;
    let case = "faults/duplicate-time-key.http";
    assert_forwarded(&s, case, 0.3).await;
    // Stale first, fresh second: a first-wins reader would answer it stale.
    let text = String::from_utf8(render(case)).unwrap();
    let (fresh, stale) = (
        rfc3339(now_utc(), false),
        rfc3339(now_utc() - time::Duration::seconds(600), false),
    );
    let swapped = text
        .replacen(&fresh, "FRESH", 1)
        .replacen(&stale, &fresh, 1)
        .replacen("FRESH", &stale, 1);
    assert_ne!(swapped, text);
    assert_forwarded_bytes(&s, case, swapped.as_bytes(), 0.3).await;
    assert_eq!(ambiguous_count(&s).await, 2.0);
    assert_eq!(unreadable(&s, &[("fact", "time")]).await, 2.0);
}

/// Duplicate keys in every place a fact is read: coordinates take the default rank (a
/// Berlin/Munich pair is not kept at 0.75 as Berlin would be), a body-named stream is
/// unknown (never shed), an object on the way to the facts stated twice is never merged, and
/// an events array stated twice believes nothing. Identical repeats are one statement.
#[tokio::test]
async fn duplicate_json_keys_are_never_merged_or_picked() {
    let s = setup().await;
    let now = now_utc().unix_timestamp();
    let vp = "X-Stream: vehicle.position\r\n";
    pin(&s.proxy, 0.75).await;
    for body in [
        // Munich, then Berlin (rank 5): not Berlin, as a last-wins reader would say.
        format!(r#"{{"lat":48.137,"lon":13.405,"lat":52.52,"occurred_at":{now}}}"#),
        // A pointer's parent object twice: lat from one, lon from the other would be a merge.
        format!(r#"{{"data":{{"lat":52.52}},"data":{{"lon":13.405}},"occurred_at":{now}}}"#),
    ] {
        let path = if body.contains("data") {
            "/ingest/hooks"
        } else {
            "/ingest"
        };
        let req = if path == "/ingest/hooks" {
            let hook = format!(
                r#"{{"type":"vehicle.position","timestamp":"{}Z",{}"#,
                rfc3339(now_utc(), false),
                &body[1..]
            );
            post_raw(path, "", &hook)
        } else {
            post_raw(path, vp, &body)
        };
        let a = exchange(&s.proxy, req.as_bytes()).await;
        assert_eq!(a.status, 503, "{body}: default rank, shed at 0.75");
    }
    // The same key twice with the same value: Berlin, kept.
    let same = format!(r#"{{"lat":52.52,"lon":13.405,"lat":52.52,"occurred_at":{now}}}"#);
    assert_eq!(
        exchange(&s.proxy, post_raw("/ingest", vp, &same).as_bytes())
            .await
            .status,
        200
    );
    // A body-named stream stated twice: unknown, never shed even at 1.0.
    pin(&s.proxy, 1.0).await;
    let ot =
        format!(r#"{{"_type":"location","_type":"transition","lat":48.1,"lon":11.5,"tst":{now}}}"#);
    assert_eq!(
        exchange(&s.proxy, post_raw("/ingest/owntracks", "", &ot).as_bytes())
            .await
            .status,
        200
    );
    // An Overland events array stated twice: nothing believed; the route's stream is fixed
    // and sheddable, so it is decided at the default rank, not stale (shed at 0.75, never 202).
    pin(&s.proxy, 0.0).await;
    let old = rfc3339(now_utc() - time::Duration::seconds(600), false);
    let point = format!(
        r#"{{"geometry":{{"coordinates":[13.405,52.52]}},"properties":{{"timestamp":"{old}Z"}}}}"#
    );
    let twice = format!(r#"{{"locations":[{point}],"locations":[{point}]}}"#);
    let a = exchange(
        &s.proxy,
        post_raw("/ingest/overland", "", &twice).as_bytes(),
    )
    .await;
    assert_eq!(a.status, 200, "not answered stale");
    assert_eq!(ambiguous_count(&s).await, 4.0);
}

/// Two `Host` lines, or none on HTTP/1.1: 400 with `Connection: close`, nothing forwarded, no
/// latency sample. HTTP/1.0 may omit it.
#[tokio::test]
async fn case_duplicate_host() {
    let s = setup().await;
    pin(&s.proxy, 0.0).await;
    let a = exchange(&s.proxy, &render("faults/duplicate-host.raw")).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.header("connection"), Some("close"));
    assert!(a.closed);
    let none =
        b"POST /ingest HTTP/1.1\r\nX-Stream: geofence.transition\r\nContent-Length: 2\r\n\r\n{}";
    let a = exchange(&s.proxy, none).await;
    assert_eq!((a.status, a.closed), (400, true));
    assert_eq!(s.upstream.count(), 0, "nothing forwarded");
    let old =
        b"POST /ingest HTTP/1.0\r\nX-Stream: geofence.transition\r\nContent-Length: 2\r\n\r\n{}";
    assert_eq!(exchange(&s.proxy, old).await.status, 200);
    let m = scrape(&s.proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_upstream_latency_seconds_count",
            &[("upstream", "default")]
        ),
        1.0,
        "{m}"
    );
}

/// `CONNECT` to an internal host: 405 answered locally with `Allow` and close, nothing
/// forwarded. `OPTIONS *`: answered locally, nothing forwarded, no latency sample.
#[tokio::test]
async fn case_connect_method_and_server_options_are_answered_locally() {
    let s = setup().await;
    let a = exchange(&s.proxy, &render("faults/connect-method.raw")).await;
    assert_eq!(a.status, 405);
    assert!(a.header("allow").is_some_and(|v| !v.contains("CONNECT")));
    assert!(a.closed);
    let a = exchange(
        &s.proxy,
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(a.header("allow").is_some());
    assert_eq!(
        s.upstream.seen.lock().unwrap().len(),
        0,
        "nothing forwarded"
    );
    let m = scrape(&s.proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_upstream_latency_seconds_count",
            &[("upstream", "default")]
        ),
        0.0
    );
}

/// An absolute-form target whose authority differs from `Host`: the upstream sees the
/// target's authority (RFC 9112 §3.2.2). A scheme other than http or https: 400.
#[tokio::test]
async fn case_absolute_form_authority() {
    let s = setup().await;
    let r = assert_forwarded(&s, "faults/absolute-form-authority.http", 1.0).await;
    assert_eq!(r.headers["host"], "tenant-a.example.test");
    assert_eq!(r.uri.path(), "/ingest");
    let before = s.upstream.count();
    for target in [
        "ftp://tenant-a.example.test/ingest",
        "http://user@tenant-a.example.test/ingest",
        "/ingest/overland/..%2Ffleet",
        "/ingest/overland/..%5cfleet",
    ] {
        let req = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        assert_eq!(
            exchange(&s.proxy, req.as_bytes()).await.status,
            400,
            "{target}"
        );
    }
    let trace = b"TRACE /ingest HTTP/1.1\r\nHost: x\r\nCookie: secret\r\n\r\n";
    assert_eq!(exchange(&s.proxy, trace).await.status, 405);
    assert_eq!(s.upstream.count(), before);
}

/// Forwarding headers: from a trusted peer (`--trusted-proxies`) they are kept and extended
/// (`X-Forwarded-Proto` stays `https`, not `https, http`); from anyone else they are replaced.
#[tokio::test]
async fn forwarding_headers_are_kept_only_from_trusted_peers() {
    let req = b"POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: admin.example.test\r\nContent-Length: 2\r\n\r\n{}";
    for (trusted, xff, proto) in [
        (
            vec!["127.0.0.0/8".parse().unwrap()],
            "203.0.113.7, 127.0.0.1",
            "https",
        ),
        (vec!["10.0.0.0/8".parse().unwrap()], "127.0.0.1", "http"),
    ] {
        let upstream = MockUpstream::start().await;
        let proxy = spawn_proxy_with(&upstream.url(), &cases_policy(), |a| {
            a.trusted_proxies = Some(trusted);
        })
        .await;
        assert_eq!(exchange(&proxy, req).await.status, 200);
        let r = upstream.last();
        assert_eq!(r.headers["x-forwarded-for"], xff);
        assert_eq!(r.headers["x-forwarded-proto"], proto);
        assert_eq!(r.headers.contains_key("x-forwarded-host"), proto == "https");
    }
}

/// Routes match the normalised path: `/ingest/./owntracks` (the case), `//ingest/owntracks`
/// and an encoded `o` are the OwnTracks route (a Munich location, shed at 0.99), not an
/// unknown stream that is never shed; the path is forwarded as sent when admitted.
#[tokio::test]
async fn case_dot_segment_path() {
    let s = setup().await;
    let case = "faults/dot-segment-path.http";
    assert_shed(&s, case, 0.99).await;
    let sent = String::from_utf8(render(case)).unwrap();
    for path in [
        "//ingest/owntracks",
        "/ingest/%6Fwntracks",
        "/ingest/overland/../owntracks",
    ] {
        let req = sent.replacen("/ingest/./owntracks", path, 1);
        pin(&s.proxy, 0.99).await;
        let a = exchange(&s.proxy, req.as_bytes()).await;
        assert_eq!(a.status, 503, "{path}");
    }
    let r = assert_forwarded(&s, case, 0.3).await;
    assert_eq!(r.uri.path(), "/ingest/./owntracks", "forwarded as sent");
}

/// Request heads have limits, nginx's by default: a 30 KB `X-Stream` line (over 8 KiB per
/// line) and a head of five 7 KB lines (over 32 KiB) get 431 with the connection closed,
/// nothing forwarded.
#[tokio::test]
async fn oversized_header_lines_and_heads_get_431() {
    let s = setup().await;
    let long = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "v".repeat(30_000)
    );
    let a = exchange(&s.proxy, long.as_bytes()).await;
    assert_eq!((a.status, a.closed), (431, true));
    let lines: String = (0..5)
        .map(|i| format!("X-Pad-{i}: {}\r\n", "p".repeat(7_000)))
        .collect();
    let big = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\n{lines}Content-Length: 2\r\n\r\n{{}}"
    );
    let a = exchange(&s.proxy, big.as_bytes()).await;
    assert_eq!((a.status, a.closed), (431, true));
    assert_eq!(s.upstream.count(), 0);
    // Within both limits: forwarded.
    let fine = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\nX-Pad: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "p".repeat(7_000)
    );
    assert_eq!(exchange(&s.proxy, fine.as_bytes()).await.status, 200);
}

/// httpd PR #558, caddy#7808: `X_Stream` beside `X-Stream` is the same header to a CGI or WSGI
/// upstream. Before, the twin was ignored and the request shed as the dash form said; now the
/// stream is ambiguous, so unknown: forwarded at 0.99 with both lines, and counted. A twin
/// that agrees is one statement; a twin alone is ambiguous too.
#[tokio::test]
async fn case_underscore_stream_twin() {
    let s = setup().await;
    let case = "faults/underscore-stream-twin.http";
    let r = assert_forwarded(&s, case, 0.99).await;
    assert_eq!(r.headers["x-stream"], "vehicle.position");
    assert_eq!(r.headers["x_stream"], "geofence.transition");
    assert_eq!(ambiguous_count(&s).await, 1.0);
    let text = String::from_utf8(render(case)).unwrap();
    let agreeing = text.replace(
        "X_Stream: geofence.transition",
        "X_Stream: vehicle.position",
    );
    pin(&s.proxy, 0.99).await;
    assert_eq!(exchange(&s.proxy, agreeing.as_bytes()).await.status, 503);
    let alone = text.replace("X-Stream: vehicle.position\r\n", "");
    let alone = alone.replace(
        "X_Stream: geofence.transition",
        "X_Stream: vehicle.position",
    );
    assert_forwarded_bytes(&s, case, alone.as_bytes(), 0.99).await;
    assert_eq!(ambiguous_count(&s).await, 2.0);
}

/// A twin of a header a fact is read from in the body's format (CloudEvents binary mode's
/// `ce-time`) makes that fact unreadable: an old time beside a fresh twin is not stale.
#[tokio::test]
async fn an_underscore_twin_of_a_time_header_makes_the_time_unreadable() {
    let s = setup().await;
    let old = rfc3339(now_utc() - time::Duration::seconds(600), false) + "Z";
    let now = rfc3339(now_utc(), false) + "Z";
    let body = r#"{"lat":52.52,"lon":13.4049}"#;
    let head = format!(
        "ce-specversion: 1.0\r\nce-type: com.example.fleet.position\r\nce-source: /fleet\r\n\
         ce-id: 1\r\nce-time: {old}\r\nce_time: {now}\r\nContent-Type: application/json\r\n"
    );
    let bytes = post_raw("/ingest/ce", &head, body);
    let r = assert_forwarded_bytes(&s, "ce-time twin", bytes.as_bytes(), 0.3).await;
    assert_eq!(r.headers["ce_time"], now.as_str(), "forwarded unchanged");
    assert_eq!(ambiguous_count(&s).await, 1.0);
}

/// Twins of the forwarding headers are removed from every peer, trusted ones included: a
/// WSGI upstream would read `X_Forwarded_For` as `X-Forwarded-For`. Other underscore headers
/// pass.
#[tokio::test]
async fn underscore_twins_of_forwarding_headers_never_reach_the_upstream() {
    for trusted in [false, true] {
        let upstream = MockUpstream::start().await;
        let proxy = spawn_proxy_with(&upstream.url(), &cases_policy(), |a| {
            if trusted {
                a.trusted_proxies = Some(vec!["127.0.0.0/8".parse().unwrap()]);
            }
        })
        .await;
        let s = Setup { upstream, proxy };
        let head = "X-Stream: geofence.transition\r\nX_Forwarded_For: 203.0.113.9\r\n\
                    X_Forwarded_Proto: https\r\nForwarded_: x\r\nX_Fleet_Tenant: acme\r\n";
        let bytes = post_raw("/ingest", head, r#"{"lat":1,"lon":2}"#);
        let r = assert_forwarded_bytes(&s, "twins", bytes.as_bytes(), 0.0).await;
        for twin in ["x_forwarded_for", "x_forwarded_proto"] {
            assert!(!r.headers.contains_key(twin), "{twin} (trusted {trusted})");
        }
        assert_eq!(r.headers["x-forwarded-for"], "127.0.0.1");
        assert_eq!(r.headers["x_fleet_tenant"], "acme");
        assert_eq!(r.headers["forwarded_"], "x", "not a twin of any name");
    }
}
