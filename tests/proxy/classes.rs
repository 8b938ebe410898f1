//! Priority classes with budgets, warn before enforce, live disable, Retry-After spread, and
//! the `/stats` summary.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use super::support::*;

const CLASSED: &str = r#"
[classes.best-effort]
budget = 0.5

[streams."vehicle.position"]
supersession = "self-superseding"
class = "best-effort"
[streams."sensor.reading"]
supersession = "self-superseding"
class = "important"
[streams."geofence.transition"]
supersession = "never"
class = "critical"
"#;

/// Sends in the background; the answer comes back through the handle.
fn spawn_post(
    proxy: &Arc<shedgate::app::Running>,
    stream: &'static str,
) -> tokio::task::JoinHandle<Answer> {
    let proxy = Arc::clone(proxy);
    tokio::spawn(async move { post(&proxy, stream, event(MUNICH, 0)).await })
}

async fn until_in_flight(proxy: &shedgate::app::Running, n: u32) {
    for _ in 0..1000 {
        if proxy.parts.pressure.inflight() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never reached {n} in flight");
}

/// A proxy with capacity `max_inflight` in front of an upstream that takes `delay` per
/// request, pressure pinned at 0 (so only class budgets shed), shared for spawned posts.
async fn budgeted(
    streams: &str,
    delay_ms: u64,
    max_inflight: u32,
) -> (MockUpstream, PolicyDir, Arc<shedgate::app::Running>) {
    let upstream = MockUpstream::with(Behaviour {
        delay: Duration::from_millis(delay_ms),
        ..Behaviour::default()
    })
    .await;
    let policy = PolicyDir::new(streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy_with(&upstream.url(), policy.path(), |a| {
        a.max_inflight = Some(max_inflight);
    })
    .await;
    pin(&proxy, 0.0).await;
    (upstream, policy, Arc::new(proxy))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_over_budget_is_shed_while_critical_passes() {
    let (_upstream, _policy, proxy) = budgeted(CLASSED, 800, 2).await;
    // best-effort holds its budget (1 of 2), critical takes the other slot.
    let a = spawn_post(&proxy, "vehicle.position");
    until_in_flight(&proxy, 1).await;
    let b = spawn_post(&proxy, "geofence.transition");
    until_in_flight(&proxy, 2).await;
    let c = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(c.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(c.header("x-shed-reason"), Some("budget"));
    assert_eq!(c.json()["class"], "best-effort");
    // Critical (never) traffic passes even with the upstream at capacity.
    let d = post(&proxy, "geofence.transition", event(MUNICH, 0)).await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(a.await.unwrap().status, StatusCode::OK);
    assert_eq!(b.await.unwrap().status, StatusCode::OK);
    let m = scrape(&proxy).await;
    assert_eq!(
        metric(&m, "shedgate_shed_total", &[("reason", "budget")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_budget_is_borrowed_and_given_back() {
    let (_upstream, _policy, proxy) = budgeted(CLASSED, 600, 3).await;
    // Budget 0.5 of 3 = 2. Nothing else runs: best-effort borrows the idle third slot.
    let held: Vec<_> = (0..3)
        .map(|_| spawn_post(&proxy, "vehicle.position"))
        .collect();
    until_in_flight(&proxy, 3).await;
    // The upstream is full: the borrower gets no more.
    let over = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(over.header("x-shed-reason"), Some("budget"));
    // Another class is not refused for the borrowing: important has no budget.
    let important = post(&proxy, "sensor.reading", event(MUNICH, 0)).await;
    assert_eq!(important.status, StatusCode::OK);
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    // Given back: once the borrowed requests end, best-effort is admitted again.
    until_in_flight(&proxy, 0).await;
    assert_eq!(
        post(&proxy, "vehicle.position", event(MUNICH, 0))
            .await
            .status,
        StatusCode::OK
    );
}

/// The same recorded traffic at the same pinned pressure: enforce sheds exactly what warn
/// counts as would-sheds, by reason, and warn forwards everything.
#[tokio::test]
async fn warn_mode_counts_exactly_what_enforce_sheds() {
    let mut traffic = Vec::new();
    for i in 0..60 {
        let at = if i % 3 == 0 { BERLIN } else { MUNICH };
        let age = if i % 5 == 0 { 120 } else { 0 };
        traffic.push(event(at, age));
    }
    let mut results = Vec::new();
    for warn in [false, true] {
        let streams = if warn {
            format!("[defaults]\nmode = \"warn\"\n{SEED_STREAMS}")
        } else {
            SEED_STREAMS.to_owned()
        };
        let upstream = MockUpstream::start().await;
        let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
        let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
        pin(&proxy, 0.75).await;
        let mut forwarded = 0;
        for body in &traffic {
            if post(&proxy, "vehicle.position", body.clone()).await.status == StatusCode::OK {
                forwarded += 1;
            }
        }
        let m = scrape(&proxy).await;
        let name = if warn {
            "shedgate_would_shed_total"
        } else {
            "shedgate_shed_total"
        };
        let by_reason: Vec<f64> = ["pressure", "stale"]
            .iter()
            .map(|r| metric(&m, name, &[("reason", r)]))
            .collect();
        results.push((forwarded, by_reason, upstream.count()));
    }
    let (enforce, warn) = (&results[0], &results[1]);
    assert_eq!(warn.0, traffic.len(), "warn forwards everything");
    assert_eq!(warn.2, traffic.len());
    assert!(enforce.1.iter().all(|n| *n > 0.0), "{enforce:?}");
    assert_eq!(enforce.1, warn.1, "would-sheds equal sheds, by reason");
}

#[test]
fn disable_until_switches_at_the_boundary() {
    use shedgate::admission::{Load, Verdict, decide};
    use shedgate::clock::UnixMillis;
    use shedgate::extract::Facts;
    use shedgate::pressure::Pressure;
    let streams = format!(
        "{SEED_STREAMS}\n[streams.\"debug.trace\"]\nsupersession = \"self-superseding\"\nenabled = false\nuntil = \"2026-12-01T06:00:00Z\"\n"
    );
    let dir = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let p = shedgate::policy::load_dir(dir.path()).unwrap().policy;
    let id = p.stream("debug.trace");
    let until = UnixMillis(1_796_104_800_000); // 2026-12-01T06:00:00Z
    let at = |now| {
        decide(
            &p,
            id,
            &Facts::UNREAD,
            now,
            Pressure::ZERO,
            0.5,
            &Load::IDLE,
            None,
        )
        .verdict
    };
    assert!(
        matches!(at(UnixMillis(until.0 - 3_600_000)), Verdict::Shed(_)),
        "an hour before: active"
    );
    assert!(
        matches!(at(UnixMillis(until.0 - 1)), Verdict::Shed(_)),
        "a millisecond before: active"
    );
    assert_eq!(at(until), Verdict::Admit, "at the boundary: re-enabled");
    assert_eq!(
        at(UnixMillis(until.0 + 1)),
        Verdict::Admit,
        "after: inactive"
    );
}

#[tokio::test]
async fn disable_with_until_in_the_past_is_inactive_and_in_the_future_active() {
    let upstream = MockUpstream::start().await;
    let streams = format!(
        "{SEED_STREAMS}\n[streams.\"old.switch\"]\nsupersession = \"self-superseding\"\nenabled = false\nuntil = \"2020-01-01T00:00:00Z\"\n\
         [streams.\"new.switch\"]\nsupersession = \"self-superseding\"\nenabled = false\nuntil = \"2099-01-01T00:00:00Z\"\n\
         [classes.best-effort]\nenabled = false\n[streams.\"be\"]\nsupersession = \"self-superseding\"\nclass = \"best-effort\"\n"
    );
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    assert_eq!(
        post(&proxy, "old.switch", event(BERLIN, 0)).await.status,
        StatusCode::OK
    );
    let a = post(&proxy, "new.switch", event(BERLIN, 0)).await;
    assert_eq!(
        (a.status, a.header("x-shed-reason")),
        (StatusCode::SERVICE_UNAVAILABLE, Some("disabled"))
    );
    let a = post(&proxy, "be", event(BERLIN, 0)).await;
    assert_eq!(
        a.header("x-shed-reason"),
        Some("disabled"),
        "a disabled class"
    );
    // Exported when the policy loads, not only at the next periodic export.
    let m = scrape(&proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_disabled_until_timestamp_seconds",
            &[("scope", "stream"), ("name", "new.switch")]
        ),
        4_070_908_800.0
    );
    assert_eq!(
        metric(
            &m,
            "shedgate_disabled_until_timestamp_seconds",
            &[("scope", "class"), ("name", "best-effort")]
        ),
        f64::INFINITY,
        "disabled until further notice"
    );
    let stats = admin_get(&proxy, "/stats").await.json();
    assert_eq!(stats["disabled"].as_array().unwrap().len(), 2, "{stats}");
}

#[test]
fn check_refuses_a_disabled_never_stream() {
    let dir = PolicyDir::new(
        "[streams.\"geofence.transition\"]\nsupersession = \"never\"\nenabled = false\n",
        Some(BERLIN_AREA),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("check")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be disabled"));
}

/// 1,000 sheds at one pressure: Retry-After values are integers in [1, max], spread over
/// several distinct seconds.
#[tokio::test]
async fn retry_after_spreads_over_several_seconds() {
    let upstream = MockUpstream::start().await;
    let streams = format!("[retry_after]\nbase = 2\nmax = 20\n{SEED_STREAMS}");
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.9).await;
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..1000 {
        let a = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        let secs: u32 = a.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=20).contains(&secs), "{secs}");
        *seen.entry(secs).or_insert(0) += 1;
    }
    assert!(seen.len() >= 5, "spread: {seen:?}");
    assert!(
        seen.values().all(|n| *n < 500),
        "no second takes half the crowd: {seen:?}"
    );
}

#[tokio::test]
async fn stats_summarise_per_stream_and_class() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(CLASSED, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.75).await;
    post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    post(&proxy, "vehicle.position", event(BERLIN, 300)).await;
    post(&proxy, "geofence.transition", event(MUNICH, 0)).await;
    let s = admin_get(&proxy, "/stats").await.json();
    let v = &s["streams"]["vehicle.position"];
    assert_eq!(v["since_start"]["accepted"], 1);
    assert_eq!(v["since_start"]["shed"]["pressure"], 1);
    assert_eq!(v["since_start"]["shed"]["stale"], 1);
    assert_eq!(v["last_minute"]["shed_total"], 2);
    assert_eq!(s["classes"]["best-effort"]["since_start"]["shed_total"], 2);
    assert_eq!(s["classes"]["critical"]["since_start"]["accepted"], 1);
    assert_eq!(s["rank_cutoff"], 25.0);
    assert_eq!(s["streams"]["vehicle.position"]["active"], 0);
    let req = Request::get(format!("http://{}/stats", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
}

/// A capped `never` class over its budget with the upstream full: its requests wait for
/// room, then get 503 + Retry-After (reason budget) — whether the stream is named in a
/// header or in the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_never_class_waits_then_answers_503() {
    let streams = r#"
[classes.critical]
budget = 0.5
wait = "200ms"
[streams."sensor.reading"]
supersession = "self-superseding"
class = "important"
[streams."geofence.transition"]
supersession = "never"
class = "critical"
[streams."owntracks.transition"]
supersession = "never"
class = "critical"
[[routes]]
prefix = "/ingest/owntracks"
format = "owntracks"
"#;
    let (upstream, _policy, proxy) = budgeted(streams, 1500, 2).await;
    // critical holds its budget (1 of 2), important fills the upstream.
    let held = spawn_post(&proxy, "geofence.transition");
    until_in_flight(&proxy, 1).await;
    let filler = spawn_post(&proxy, "sensor.reading");
    until_in_flight(&proxy, 2).await;
    let a = post(&proxy, "geofence.transition", event(MUNICH, 0)).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.header("x-shed-reason"), Some("budget"));
    assert!(a.header("retry-after").is_some());
    let now = now_utc().unix_timestamp();
    let req = Request::post(format!("http://{}/ingest/owntracks", proxy.proxy_addr))
        .body(Full::new(Bytes::from(format!(
            r#"{{"_type":"transition","event":"enter","lat":48.13,"lon":11.57,"tst":{now}}}"#
        ))))
        .unwrap();
    let b = send(req).await;
    assert_eq!(
        b.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "body-named never stream is capped too"
    );
    assert_eq!(b.header("x-shed-reason"), Some("budget"));
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(filler.await.unwrap().status, StatusCode::OK);
    // With room again, the capped class passes.
    until_in_flight(&proxy, 0).await;
    assert_eq!(
        post(&proxy, "geofence.transition", event(MUNICH, 0))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        upstream.count(),
        3,
        "the refused ones never reached the upstream"
    );
}

/// A class's `max_request_time`: an admitted request whose upstream answer has not begun
/// within it is answered 504 (`class-timeout`, counted `kind="class_timeout"` and as an
/// upstream error), and its slot and budget share are free at that moment, although the
/// upstream is still working: the next request of the class is admitted, not shed for the
/// budget. A `never` stream's sender gets the 504 too, and resends.
#[tokio::test(start_paused = true)]
async fn a_class_request_time_limit_answers_504_and_frees_the_slot() {
    let streams = r#"
[classes.best-effort]
budget = 0.5
max_request_time = "2s"
[classes.critical]
max_request_time = "3s"
[streams."vehicle.position"]
supersession = "self-superseding"
class = "best-effort"
[streams."geofence.transition"]
supersession = "never"
class = "critical"
"#;
    let (_upstream, _policy, proxy) = budgeted(streams, 60_000, 2).await;
    for (stream, limit) in [
        ("vehicle.position", 2),
        ("vehicle.position", 2),
        ("geofence.transition", 3),
    ] {
        let started = tokio::time::Instant::now();
        let a = post(&proxy, stream, event(MUNICH, 0)).await;
        let waited = started.elapsed();
        assert_eq!(
            a.status,
            StatusCode::GATEWAY_TIMEOUT,
            "{stream}: {:?}",
            a.body
        );
        assert_eq!(a.json()["type"], "urn:shedgate:problem:class-timeout");
        assert!(
            waited >= Duration::from_secs(limit) && waited < Duration::from_secs(limit + 1),
            "{stream}: answered after {waited:?} (paused time)"
        );
        assert_eq!(proxy.parts.pressure.inflight(), 0, "{stream}: slot held");
    }
    let m = scrape(&proxy).await;
    assert_eq!(proxy_errors(&m, "class_timeout"), 3.0);
    assert_eq!(
        metric(&m, "shedgate_shed_total", &[("reason", "budget")]),
        0.0
    );
    assert_eq!(
        metric(
            &m,
            "shedgate_requests_total",
            &[("upstream", "default"), ("outcome", "upstream_error")]
        ),
        3.0
    );
}
