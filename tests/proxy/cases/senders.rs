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
    let req = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: vehicle.position\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
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

/// A route's `stale_body` overrides the preset's; a 4xx or bodiless stale status never
/// carries one.
#[tokio::test]
async fn a_route_stale_body_overrides_the_preset() {
    let streams = r#"
[defaults]
stale_after = "30s"

[streams."vehicle.position"]
supersession = "self-superseding"

[[routes]]
prefix = "/ingest/fleet"
stream = "vehicle.position"
stale_body = '{"status":"accepted"}'
"#;
    let policy = PolicyDir::new(streams, None);
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.0).await;
    let body = format!(
        r#"{{"lat":48.1,"lon":11.5,"occurred_at":{}}}"#,
        now_utc().unix_timestamp() - 600
    );
    let req = format!(
        "POST /ingest/fleet HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
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
