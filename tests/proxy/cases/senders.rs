//! Senders as they really behave: the success body a stale answer must carry in each
//! sender's own protocol, backlogs with a fresh `current` point, positions in the query
//! string or a form body, encoded bodies, a clock that disagrees, and opaque envelopes.

use super::*;

/// A stale event is answered with the sender's own success body, so that it is deleted
/// from the sender's queue and not resent: OwnTracks' `[]`, Overland's `{"result":"ok"}`.
#[tokio::test]
async fn stale_answers_are_success_in_the_senders_own_protocol() {
    let s = setup().await;
    pin(&s.proxy, 0.0).await;
    for (case, body) in [
        ("formats/owntracks-stale.http", &b"[]"[..]),
        ("formats/overland-stale.http", &br#"{"result":"ok"}"#[..]),
    ] {
        let a = exchange(&s.proxy, &render(case)).await;
        assert_eq!(a.status, 202, "{case}");
        assert_eq!(a.header("content-type"), Some("application/json"), "{case}");
        assert_eq!(a.header("x-shed-reason"), Some("stale"), "{case}");
        assert_eq!(a.body, body, "{case}");
    }
    assert_eq!(s.upstream.count(), 0, "stale events are not forwarded");
    // Other formats keep the problem document.
    let body = format!(
        r#"{{"lat":48.1,"lon":11.5,"occurred_at":{}}}"#,
        now_utc().unix_timestamp() - 600
    );
    let req = post_raw("/ingest", "X-Stream: vehicle.position\r\n", &body);
    let a = exchange(&s.proxy, req.as_bytes()).await;
    assert_eq!(a.status, 202);
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let m = scrape(&s.proxy).await;
    assert_eq!(
        metric(&m, "shedgate_shed_total", &[("reason", "stale")]),
        3.0
    );
}

/// A 503 never carries a success body: a fresh OwnTracks location shed by pressure gets the
/// problem document and `Retry-After`.
#[tokio::test]
async fn a_shed_under_pressure_never_carries_a_success_body() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/owntracks-location.http", 0.75).await;
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_ne!(a.body, b"[]");
}

/// A route's `stale_body` overrides its preset's (OwnTracks' `[]` here).
#[tokio::test]
async fn a_route_stale_body_overrides_the_preset() {
    let streams = r#"
[defaults]
stale_after = "30s"

[streams."owntracks.location"]
supersession = "self-superseding"

[[routes]]
prefix = "/ingest/fleet"
format = "owntracks"
stale_body = '{"status":"accepted"}'
"#;
    let policy = PolicyDir::new(streams, None);
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.0).await;
    let body = format!(
        r#"{{"_type":"location","lat":48.1,"lon":11.5,"tst":{}}}"#,
        now_utc().unix_timestamp() - 600
    );
    let req = post_raw("/ingest/fleet", "", &body);
    let a = exchange(&proxy, req.as_bytes()).await;
    assert_eq!(a.status, 202);
    assert_eq!(a.body, br#"{"status":"accepted"}"#);
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(upstream.count(), 0);
}

/// An Overland backlog (points 2 h old, Munich) with a fresh `current` point in Berlin: the
/// batch is not stale and takes Berlin's rank, so it is kept at 0.75, and forwarded whole.
#[tokio::test]
async fn an_overland_backlog_with_a_fresh_current_point_drains() {
    let s = setup().await;
    let case = "formats/overland-backlog-current.http";
    let sent = render(case);
    let r = assert_forwarded_bytes(&s, case, &sent, 0.75).await;
    let body_start = sent.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(r.body, &sent[body_start..], "forwarded whole");
    // Without `current`, the same backlog is stale: answered with Overland's success.
    pin(&s.proxy, 0.0).await;
    let text = String::from_utf8(sent[body_start..].to_vec()).unwrap();
    let backlog = &text[..text.find(",\"current\"").unwrap()];
    let req = format!(
        "POST /ingest/overland HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{backlog}}}",
        backlog.len() + 1
    );
    let a = exchange(&s.proxy, req.as_bytes()).await;
    assert_eq!((a.status, a.header("x-shed-reason")), (202, Some("stale")));
    assert_eq!(a.body, br#"{"result":"ok"}"#);
}

/// Traccar Client's OsmAnd protocol: the facts are in the query string and the body is empty.
/// Munich and fresh: shed at 0.75, forwarded at 0.3 with the query unchanged.
#[tokio::test]
async fn osmand_positions_in_the_query_string() {
    let s = setup().await;
    let case = "formats/osmand-query.http";
    let a = assert_shed(&s, case, 0.75).await;
    let p: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(
        (p["stream"].as_str(), p["rank"].as_u64()),
        (Some("osmand.position"), Some(50))
    );
    assert!(
        p["age_seconds"].as_f64().is_some_and(|a| a.abs() < 5.0),
        "{p}"
    );
    let sent = render(case);
    let r = assert_forwarded_bytes(&s, case, &sent, 0.3).await;
    let target = String::from_utf8_lossy(&sent)
        .split(' ')
        .nth(1)
        .unwrap()
        .to_owned();
    assert_eq!(
        r.uri.to_string(),
        target,
        "the query is forwarded unchanged"
    );
    assert_all_facts_read(&s).await;
}

/// The same OsmAnd position as a form body, as Traccar Client's JSON, and with the
/// timestamp written `YYYY-MM-DD HH:MM:SS` (space as `%20` or `+`): each read as Berlin
/// (kept at 0.75) and fresh; a stale one answered stale; the body forwarded byte for byte.
#[tokio::test]
async fn osmand_positions_in_a_form_body_or_traccar_client_json() {
    let s = setup().await;
    let now = now_utc();
    let unix = now.unix_timestamp();
    let spaced = now
        .format(time::macros::format_description!(
            "[year]-[month]-[day] [hour]:[minute]:[second]"
        ))
        .unwrap();
    let json = format!(
        r#"{{"device_id":"4711","location":{{"timestamp":"{}Z","coords":{{"latitude":52.52,"longitude":13.405}}}}}}"#,
        rfc3339(now, false)
    );
    let form = "application/x-www-form-urlencoded";
    let cases: Vec<(String, &str, String)> = vec![
        (
            String::new(),
            form,
            format!("id=4711&lat=52.52&lon=13.405&timestamp={unix}"),
        ),
        (String::new(), "application/json", json),
        (
            format!(
                "?id=4711&lat=52.52&lon=13.405&timestamp={}",
                spaced.replace(' ', "%20")
            ),
            "",
            String::new(),
        ),
        (
            format!(
                "?id=4711&lat=52.52&lon=13.405&timestamp={}",
                spaced.replace(' ', "+")
            ),
            "",
            String::new(),
        ),
    ];
    for (query, content_type, body) in &cases {
        let ct = if content_type.is_empty() {
            String::new()
        } else {
            format!("Content-Type: {content_type}\r\n")
        };
        let req = post_raw(&format!("/ingest/osmand{query}"), &ct, body);
        let r = assert_forwarded_bytes(&s, "osmand", req.as_bytes(), 0.75).await;
        assert_eq!(r.body, body.as_bytes(), "{query} {body}");
    }
    pin(&s.proxy, 0.0).await;
    let stale = format!("id=4711&lat=52.52&lon=13.405&timestamp={}", unix - 600);
    let req = post_raw(
        "/ingest/osmand",
        &format!("Content-Type: {form}\r\n"),
        &stale,
    );
    let a = exchange(&s.proxy, req.as_bytes()).await;
    assert_eq!((a.status, a.header("x-shed-reason")), (202, Some("stale")));
    assert_all_facts_read(&s).await;
}

/// Unreadable facts are counted by route, so a sender whose format changed shows up on its
/// own route: an OsmAnd request without coordinates counts on `/ingest/osmand`, one without
/// a route on `none`.
#[tokio::test]
async fn unreadable_facts_are_counted_by_route() {
    let s = setup().await;
    pin(&s.proxy, 0.3).await;
    let unix = now_utc().unix_timestamp();
    let req = format!(
        "POST /ingest/osmand?id=1&timestamp={unix} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    );
    assert_eq!(exchange(&s.proxy, req.as_bytes()).await.status, 200);
    let body = "{}";
    let req = post_raw("/other", "X-Stream: vehicle.position\r\n", body);
    assert_eq!(exchange(&s.proxy, req.as_bytes()).await.status, 200);
    let m = scrape(&s.proxy).await;
    let count = |route: &str, fact: &str| {
        metric(
            &m,
            "shedgate_unreadable_facts_total",
            &[("route", route), ("fact", fact)],
        )
    };
    assert_eq!(count("/ingest/osmand", "coordinates"), 1.0, "{m}");
    assert_eq!(count("/ingest/osmand", "time"), 0.0, "{m}");
    assert_eq!(count("none", "coordinates"), 1.0, "{m}");
    assert_eq!(count("none", "time"), 1.0, "{m}");
}

/// A body that starts with a UTF-8 byte order mark is read as JSON (Berlin, rank 5, kept at
/// 0.75) and forwarded with the mark.
#[tokio::test]
async fn case_bom_body() {
    let s = setup().await;
    let case = "faults/bom-body.http";
    let sent = render(case);
    let r = assert_forwarded_bytes(&s, case, &sent, 0.75).await;
    assert!(
        r.body.starts_with(b"\xEF\xBB\xBF{"),
        "forwarded with the BOM"
    );
    assert_all_facts_read(&s).await;
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A `Content-Encoding: gzip` Berlin event is read from its inflated bytes (kept at 0.75)
/// and forwarded compressed, unchanged; one that inflates past `--max-body` gets 413; a coding
/// the proxy does not read is decided at the default rank and counted.
#[tokio::test]
async fn gzip_bodies_are_read_inflated_and_forwarded_compressed() {
    let s = setup().await;
    let json = format!(
        r#"{{"lat":52.52,"lon":13.405,"occurred_at":{}}}"#,
        now_utc().unix_timestamp()
    );
    let send = |coding: &str, body: &[u8]| {
        let mut req = format!(
            "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: vehicle.position\r\nContent-Encoding: {coding}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        req
    };
    let compressed = gzip(json.as_bytes());
    let r = assert_forwarded_bytes(&s, "gzip", &send("gzip", &compressed), 0.75).await;
    assert_eq!(r.body, compressed, "forwarded compressed, unchanged");
    assert_eq!(r.headers["content-encoding"], "gzip");
    // A bomb: a few KB that inflate past the 1 MiB limit.
    let bomb = gzip(&vec![b' '; 4 << 20]);
    let before = s.upstream.count();
    let a = exchange(&s.proxy, &send("gzip", &bomb)).await;
    assert_eq!(a.status, 413);
    assert_eq!(s.upstream.count(), before, "nothing forwarded");
    // Brotli is not read: default rank (shed at 0.75), its body counted unreadable.
    let a = exchange(&s.proxy, &send("br", b"\x0b\x02\x80{}\x03")).await;
    assert_eq!(a.status, 503);
    assert_eq!(unreadable(&s, &[("fact", "body")]).await, 1.0);
}

/// An encrypted OwnTracks envelope may hold a transition: never shed (forwarded at 1.0),
/// unchanged, and counted apart.
#[tokio::test]
async fn owntracks_encrypted_envelopes_are_never_shed_and_counted_apart() {
    let s = setup().await;
    let case = "formats/owntracks-encrypted.http";
    let sent = render(case);
    let r = assert_forwarded_bytes(&s, case, &sent, 1.0).await;
    let body_start = sent.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(r.body, &sent[body_start..], "forwarded unchanged");
    let m = scrape(&s.proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_opaque_envelopes_total",
            &[("route", "/ingest/owntracks")]
        ),
        1.0,
        "{m}"
    );
}
