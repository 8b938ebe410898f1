//! `formats/`: real senders' bodies and protocols, read as the proxy's presets say.

use super::*;
use std::time::Duration;

/// The shed response names `stream`, read its time (an age) and its place (`rank`).
fn assert_explained(a: &RawAnswer, stream: &str, rank: u64) {
    let p: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(p["stream"], stream, "{p}");
    assert_eq!(p["rank"], rank, "{p}");
    let age = p["age_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("time not read: {p}"));
    assert!((-5.0..60.0).contains(&age), "{p}");
}

#[tokio::test]
async fn format_owntracks_location() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/owntracks-location.http", 0.75).await;
    assert_explained(&a, "owntracks.location", 50);
    let r = assert_forwarded(&s, "formats/owntracks-location.http", 0.3).await;
    assert!(r.body.starts_with(b"{\"_type\":\"location\""));
    assert_all_facts_read(&s).await;
}

#[tokio::test]
async fn format_owntracks_transition() {
    let s = setup().await;
    assert_forwarded(&s, "formats/owntracks-transition.http", 1.0).await;
}

#[tokio::test]
async fn format_traccar_position() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/traccar-position.http", 0.75).await;
    assert_explained(&a, "traccar.position", 50);
    assert_all_facts_read(&s).await;
}

#[tokio::test]
async fn format_traccar_events() {
    let s = setup().await;
    assert_forwarded(&s, "formats/traccar-event-geofence.http", 1.0).await;
    assert_forwarded(&s, "formats/traccar-event-no-position.http", 1.0).await;
}

#[tokio::test]
async fn format_overland_batch() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/overland-batch.http", 0.75).await;
    assert_explained(&a, "overland.location", 50);
    let r = assert_forwarded(&s, "formats/overland-batch.http", 0.3).await;
    assert!(r.body.starts_with(b"{\"locations\":["), "forwarded whole");
    assert_all_facts_read(&s).await;
}

#[tokio::test]
async fn format_cloudevents_binary_position() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/cloudevents-binary-position.http", 0.75).await;
    assert_explained(&a, "com.example.fleet.position", 50);
    assert_all_facts_read(&s).await;
}

/// A CloudEvents binary-mode request (HTTP binding section 3.1): the attributes in `ce-`
/// headers, the data as a JSON body (added by the caller).
fn ce_binary(url: &str, ce_type: &str, ce_time: &str) -> http::request::Builder {
    http::Request::post(url)
        .header("ce-specversion", "1.0")
        .header("ce-type", ce_type)
        .header("ce-source", "/fleet/vehicles/311")
        .header("ce-id", "1")
        .header("ce-time", ce_time)
        .header("content-type", "application/json")
}

/// A route's `stream_map` applies to CloudEvents' `type` in every content mode: `ce-type` in
/// binary mode is the same attribute as `/type` in structured mode, so the same event must
/// land in the same stream either way.
#[tokio::test]
async fn cloudevents_type_is_mapped_in_binary_and_structured_mode() {
    let streams = r#"
[streams."vehicle.position"]
supersession = "self-superseding"

[[routes]]
prefix = "/ce"
format = "cloudevents"
stream_map = { "com.example.fleet.position" = "vehicle.position" }
"#;
    let policy = PolicyDir::new(streams, None);
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.75).await;
    let now = rfc3339(now_utc(), true) + "Z";
    let url = format!("http://{}/ce", proxy.proxy_addr);
    let binary = ce_binary(&url, "com.example.fleet.position", &now)
        .body(http_body_util::Full::new(bytes::Bytes::from(
            r#"{"lat":-1.28638,"lon":36.81723}"#,
        )))
        .unwrap();
    let structured = http::Request::post(&url)
        .header("content-type", "application/cloudevents+json")
        .body(http_body_util::Full::new(bytes::Bytes::from(format!(
            r#"{{"specversion":"1.0","type":"com.example.fleet.position","source":"/fleet/vehicles/311","id":"2","time":"{now}","data":{{"lat":-1.28638,"lon":36.81723}}}}"#
        ))))
        .unwrap();
    for (mode, req) in [("binary", binary), ("structured", structured)] {
        let a = send(req).await;
        assert_eq!(a.status, http::StatusCode::SERVICE_UNAVAILABLE, "{mode}");
        let body = a.json();
        assert_eq!(body["stream"], "vehicle.position", "{mode}: {body}");
        assert_eq!(body["rank"], 50, "{mode}: {body}");
    }
    assert_eq!(upstream.count(), 0);
}

/// A stream whose own `format` is `cloudevents` (named by the stream header, no route) is
/// read in every content mode, `ce-time` included: an old binary-mode event is stale, and a
/// structured one is located from `/data`.
#[tokio::test]
async fn a_stream_level_cloudevents_format_reads_every_content_mode() {
    let streams = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
format = "cloudevents"
stale_after = "1m"
"#;
    let policy = PolicyDir::new(streams, Some(BERLIN_AREA));
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    let url = format!("http://{}/anything", proxy.proxy_addr);
    let old = rfc3339(now_utc() - time::Duration::minutes(10), false) + "Z";
    let binary = ce_binary(&url, "whatever", &old)
        .header("x-stream", "vehicle.position")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            r#"{"lat":52.52,"lon":13.4049}"#,
        )))
        .unwrap();
    let a = send(binary).await;
    assert_eq!(a.header("x-shed-reason"), Some("stale"), "{}", a.status);
    // Structured, fresh, in Berlin (rank 5): kept at 0.75, where rank 50 would be shed.
    pin(&proxy, 0.75).await;
    let now = rfc3339(now_utc(), true) + "Z";
    let structured = http::Request::post(&url)
        .header("x-stream", "vehicle.position")
        .header("content-type", "application/cloudevents+json")
        .body(http_body_util::Full::new(bytes::Bytes::from(format!(
            r#"{{"specversion":"1.0","type":"t","source":"s","id":"1","time":"{now}","data":{{"lat":52.52,"lon":13.4049}}}}"#
        ))))
        .unwrap();
    let a = send(structured).await;
    assert_eq!(a.status, http::StatusCode::OK);
    assert_eq!(upstream.count(), 1);
}

/// `shedgate explain --body` reads a body in the content mode its `--content-type` picks, as
/// the proxy does: a structured CloudEvent in Berlin is located (rank 5) and kept at 0.75.
#[test]
fn explain_reads_the_content_mode_the_content_type_picks() {
    let streams = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
format = "cloudevents"
"#;
    let policy = PolicyDir::new(streams, Some(BERLIN_AREA));
    let body = policy.path().join("event.json");
    std::fs::write(
        &body,
        r#"{"specversion":"1.0","type":"t","source":"s","id":"1","data":{"lat":52.52,"lon":13.4049}}"#,
    )
    .unwrap();
    let explain = |content_type: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"));
        cmd.arg("explain")
            .arg("--policies")
            .arg(policy.path())
            .args([
                "--stream",
                "vehicle.position",
                "--pressure",
                "0.75",
                "--json",
                "--body",
            ])
            .arg(&body);
        if let Some(ct) = content_type {
            cmd.args(["--content-type", ct]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let structured = explain(Some("application/cloudevents+json"));
    assert_eq!(structured["rank"], 5, "{structured}");
    assert_eq!(structured["decision"], "admit", "{structured}");
    // Read as binary mode (the body is the data), the envelope has no /lat: unlocated.
    let binary = explain(None);
    assert_ne!(binary["rank"], 5, "{binary}");
}

#[tokio::test]
async fn format_cloudevents_structured_geofence() {
    let s = setup().await;
    assert_forwarded(&s, "formats/cloudevents-structured-geofence.http", 1.0).await;
}

#[tokio::test]
async fn format_cloudevents_batch_with_a_never_event() {
    let s = setup().await;
    assert_forwarded(&s, "formats/cloudevents-batch-mixed.http", 1.0).await;
}

#[tokio::test]
async fn format_standard_webhooks_position() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/standard-webhooks-position.http", 0.75).await;
    assert_explained(&a, "vehicle.position", 50);
    let case = "formats/standard-webhooks-position.http";
    let r = assert_forwarded(&s, case, 0.3).await;
    assert!(
        signature_verifies(&r),
        "the upstream verifies the signature"
    );
    assert_all_facts_read(&s).await;
}

#[tokio::test]
async fn format_geojson_feature() {
    let s = setup().await;
    let a = assert_shed(&s, "formats/geojson-feature.http", 0.75).await;
    assert_explained(&a, "sensor.reading", 50);
    assert_all_facts_read(&s).await;
}

/// A webhook-timestamp header (a delivery attempt's time) is never the event's time: an
/// event an hour old with a fresh delivery timestamp is stale.
#[tokio::test]
async fn standard_webhooks_delivery_time_is_not_the_event_time() {
    let s = setup().await;
    pin(&s.proxy, 0.0).await;
    let hour_ago = now_utc() - time::Duration::hours(1);
    let body = format!(
        r#"{{"type":"vehicle.position","timestamp":"{}Z","data":{{"lat":35.68,"lon":139.69}}}}"#,
        rfc3339(hour_ago, false)
    );
    let now = now_utc().unix_timestamp();
    let req = post_raw(
        "/ingest/hooks",
        &format!("webhook-id: m1\r\nwebhook-timestamp: {now}\r\n"),
        &body,
    );
    let a = exchange(&s.proxy, req.as_bytes()).await;
    assert_eq!(a.status, 202);
    assert_eq!(a.header("x-shed-reason"), Some("stale"));
}

/// Batches: stale only if the newest event is; the most important rank of their points.
#[tokio::test]
async fn overland_batch_with_one_fresh_point_is_not_stale() {
    let s = setup().await;
    pin(&s.proxy, 0.0).await;
    let point = |lon: f64, lat: f64, age: i64| {
        let t = now_utc() - time::Duration::seconds(age);
        format!(
            r#"{{"type":"Feature","geometry":{{"type":"Point","coordinates":[{lon},{lat}]}},"properties":{{"timestamp":"{}Z"}}}}"#,
            rfc3339(t, false)
        )
    };
    let send_batch = |points: Vec<String>| {
        let body = format!(r#"{{"locations":[{}]}}"#, points.join(","));
        post_raw("/ingest/overland", "", &body)
    };
    let stale_and_fresh = send_batch(vec![point(11.57, 48.13, 600), point(11.58, 48.14, 1)]);
    assert_eq!(
        exchange(&s.proxy, stale_and_fresh.as_bytes()).await.status,
        200
    );
    let all_stale = send_batch(vec![point(11.57, 48.13, 600), point(11.58, 48.14, 300)]);
    let a = exchange(&s.proxy, all_stale.as_bytes()).await;
    assert_eq!((a.status, a.header("x-shed-reason")), (202, Some("stale")));
    // One point in Berlin (rank 5) keeps a batch of Munich points at 0.75.
    pin(&s.proxy, 0.75).await;
    let mixed = send_batch(vec![point(11.57, 48.13, 1), point(13.405, 52.52, 1)]);
    assert_eq!(exchange(&s.proxy, mixed.as_bytes()).await.status, 200);
    let munich = send_batch(vec![point(11.57, 48.13, 1), point(11.58, 48.14, 1)]);
    assert_eq!(exchange(&s.proxy, munich.as_bytes()).await.status, 503);
}

/// Unreadable is never a reason to shed: a sheddable stream's body that is not JSON is
/// decided at the default rank (forwarded below the floor) and counted.
#[tokio::test]
async fn unreadable_bodies_are_admitted_and_counted() {
    let s = setup().await;
    pin(&s.proxy, 0.3).await;
    for body in ["not json at all", "{\"lat\": 52.5, \"lon\"", "[1,2,3]"] {
        let req = post_raw("/ingest", "X-Stream: vehicle.position\r\n", body);
        assert_eq!(
            exchange(&s.proxy, req.as_bytes()).await.status,
            200,
            "{body}"
        );
    }
    // A body-named stream that cannot be read is unknown: never shed, even at 1.0.
    pin(&s.proxy, 1.0).await;
    let req = "POST /ingest/owntracks HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nnope!";
    assert_eq!(exchange(&s.proxy, req.as_bytes()).await.status, 200);
    let m = scrape(&s.proxy).await;
    assert_eq!(
        metric(&m, "shedgate_unreadable_facts_total", &[("fact", "body")]),
        2.0
    );
}

/// A clock far off is not believed: no readable time, counted, so not stale.
#[tokio::test]
async fn implausible_times_are_not_believed() {
    let s = setup().await;
    pin(&s.proxy, 0.0).await;
    for t in [
        "\"1970-01-01T00:00:05Z\"",
        "86400",
        "\"2099-01-01T00:00:00Z\"",
    ] {
        let body = format!(r#"{{"lat":48.1,"lon":11.5,"occurred_at":{t}}}"#);
        let req = post_raw("/ingest", "X-Stream: vehicle.position\r\n", &body);
        assert_eq!(exchange(&s.proxy, req.as_bytes()).await.status, 200, "{t}");
    }
    let m = scrape(&s.proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_unreadable_facts_total",
            &[("fact", "time_implausible")]
        ),
        3.0
    );
}

/// authentik#25410, haproxy#462, go#21868: every forwarded header name went out in lower
/// case. Now each name goes out as the sender wrote it (the case file's `Webhook-Id:`,
/// `X-Fleet-Tenant:`), and the names the proxy adds in their conventional case; with
/// `--upstream-header-case title` or `lower`, as named.
#[tokio::test]
async fn format_header_case() {
    let upstream = RawUpstream::start(|_| RawReply::AfterBody(OK_EMPTY, Duration::ZERO)).await;
    let policy = PolicyDir::seed();
    let send_case = |proxy: shedgate::app::Running| async move {
        let bytes = render("formats/header-case.http");
        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        tcp.write_all(&bytes).await.unwrap();
        let head = read_head(&mut tcp).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        drop(proxy);
    };
    let last_head = || upstream.requests().last().unwrap().head.clone();
    send_case(spawn_proxy(&upstream.url(), policy.path()).await).await;
    let head = last_head();
    for name in [
        "Webhook-Id: msg_2bVf8kQ1",
        "X-Fleet-Tenant: Acme-North",
        "X-Stream: geofence.transition",
        "Content-Type: application/json",
        "Host: ingest.example.test",
        "X-Forwarded-For: 127.0.0.1",
        "X-Forwarded-Proto: http",
        "Forwarded: for=127.0.0.1;proto=http",
    ] {
        assert!(
            head.contains(&format!("\r\n{name}\r\n")),
            "{name} in {head}"
        );
    }
    use shedgate::upstream::HeaderCase;
    for (case, expected) in [
        (HeaderCase::Title, "Webhook-Id:"),
        (HeaderCase::Lower, "webhook-id:"),
    ] {
        let flag = format!("{case:?}");
        let proxy = spawn_proxy_with(&upstream.url(), policy.path(), |a| {
            a.upstream_header_case = Some(case);
        })
        .await;
        send_case(proxy).await;
        assert!(last_head().contains(expected), "{flag}: {}", last_head());
        assert_eq!(
            last_head().contains("X-Fleet-Tenant:"),
            case == HeaderCase::Title,
            "{flag}: {}",
            last_head()
        );
    }
    assert!(last_head().contains("x-fleet-tenant: Acme-North"));
}
