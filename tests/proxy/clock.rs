//! A clock that disagrees: the proxy's wall clock ahead of or behind the upstream's, whose
//! `Date` header corrects it, and a genuine backlog that stays stale whichever clock is
//! right. The world's time is an atomic the test advances: the upstream sends it as `Date`,
//! the proxy reads it plus its own error.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use shedgate::config::ServeArgs;

use super::*;

struct World {
    now: Arc<AtomicI64>,
    upstream: MockUpstream,
    proxy: shedgate::app::Running,
    _policy: PolicyDir,
}

/// A proxy whose clock is `error_ms` off the world's, in front of an upstream on the
/// world's clock.
async fn world(error_ms: i64) -> World {
    let now = Arc::new(AtomicI64::new(NOW.0));
    let upstream = MockUpstream::with(Behaviour {
        clock: Some(Arc::clone(&now)),
        ..Behaviour::default()
    })
    .await;
    let policy = PolicyDir::new(SEED_STREAMS, Some(BERLIN_AREA));
    let args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.url()),
        policies: Some(policy.path().to_owned()),
        ..ServeArgs::default()
    };
    let proxy = start_with_clock(args, &now, error_ms).await;
    World {
        now,
        upstream,
        proxy,
        _policy: policy,
    }
}

impl World {
    /// A Munich event `age_ms` old by the world's clock, as unix milliseconds.
    async fn send(&self, age_ms: i64) -> StatusCode {
        let t = self.now.load(Ordering::SeqCst) - age_ms;
        let body = format!(r#"{{"lat":48.137,"lon":11.575,"occurred_at":{t}}}"#);
        post(&self.proxy, "vehicle.position", body).await.status
    }

    /// Events the upstream received (probes are `OPTIONS`).
    fn events_received(&self) -> usize {
        let seen = self.upstream.seen.lock().unwrap();
        seen.iter()
            .filter(|r| r.method == http::Method::POST)
            .count()
    }

    fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// 60 events aged 10 minutes to 2 hours by the world's clock: all answered stale, none
    /// forwarded.
    async fn assert_backlog_stale(&self) {
        let before = self.events_received();
        for i in 0..60 {
            let age = 600_000 + i * (7_200_000 - 600_000) / 59;
            assert_eq!(self.send(age).await, StatusCode::ACCEPTED, "aged {age} ms");
        }
        assert_eq!(self.events_received(), before, "no stale event forwarded");
    }
}

/// The proxy's clock 90 s fast (`faketime +90s`): at first fresh events are answered stale,
/// and within seconds (the README's "after the first minute", and then some) they are
/// forwarded, ages judged against the upstream's `Date`, which the gauges show. A backlog is
/// still stale.
#[tokio::test]
async fn a_local_clock_ahead_is_corrected_by_the_upstreams_date() {
    let w = world(90_000).await;
    pin(&w.proxy, 0.0).await;
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(w.send(0).await);
        // Let a probe's answer land before the world moves on.
        tokio::time::sleep(Duration::from_millis(5)).await;
        w.advance(1_000);
    }
    assert_eq!(
        statuses[0],
        StatusCode::ACCEPTED,
        "stale before any Date was seen"
    );
    // One probe a second until three samples exist: corrected within seconds.
    assert!(
        statuses[10..].iter().all(|s| *s == StatusCode::OK),
        "forwarded after the first seconds: {statuses:?}"
    );
    let m = scrape(&w.proxy).await;
    let offset = metric(
        &m,
        "shedgate_clock_offset_seconds",
        &[("upstream", "default")],
    );
    assert!((-91.5..=-88.5).contains(&offset), "{offset}");
    assert_eq!(
        metric(&m, "shedgate_clock_corrected", &[("upstream", "default")]),
        1.0
    );
    assert!(
        metric(
            &m,
            "shedgate_clock_probes_total",
            &[("upstream", "default")]
        ) >= 1.0,
        "{m}"
    );
    // Probes are OPTIONS *, never an event.
    let probes = w
        .upstream
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.method == http::Method::OPTIONS)
        .map(|r| r.uri.to_string())
        .collect::<Vec<_>>();
    assert!(
        !probes.is_empty() && probes.iter().all(|u| u == "*"),
        "{probes:?}"
    );
    w.assert_backlog_stale().await;
    // Event ages are exported per stream, judged by the corrected clock.
    assert!(
        metric(
            &scrape(&w.proxy).await,
            "shedgate_event_age_seconds_count",
            &[("stream", "vehicle.position")]
        ) >= 90.0
    );
}

/// The proxy's clock 90 s slow: fresh events are forwarded anyway (they look like the
/// future), which gives the samples; once corrected, an event 45 s old is stale as it should
/// be, and a backlog too.
#[tokio::test]
async fn a_local_clock_behind_is_corrected_too() {
    let w = world(-90_000).await;
    pin(&w.proxy, 0.0).await;
    for _ in 0..10 {
        assert_eq!(w.send(0).await, StatusCode::OK);
        w.advance(1_000);
    }
    let m = scrape(&w.proxy).await;
    let offset = metric(
        &m,
        "shedgate_clock_offset_seconds",
        &[("upstream", "default")],
    );
    assert!((88.5..=91.5).contains(&offset), "{offset}");
    assert_eq!(
        metric(&m, "shedgate_clock_corrected", &[("upstream", "default")]),
        1.0
    );
    assert_eq!(w.send(45_000).await, StatusCode::ACCEPTED);
    w.assert_backlog_stale().await;
}

/// With the right clock nothing is corrected, and a backlog is stale from the first event
/// (a probe may be sent, but no stale event is forwarded for it).
#[tokio::test]
async fn with_the_right_clock_a_backlog_is_stale() {
    let w = world(0).await;
    pin(&w.proxy, 0.0).await;
    w.assert_backlog_stale().await;
    for _ in 0..6 {
        assert_eq!(w.send(0).await, StatusCode::OK);
        w.advance(1_000);
    }
    let m = scrape(&w.proxy).await;
    assert_eq!(
        metric(&m, "shedgate_clock_corrected", &[("upstream", "default")]),
        0.0
    );
    assert!(
        metric(
            &m,
            "shedgate_clock_offset_seconds",
            &[("upstream", "default")]
        )
        .abs()
            <= 1.0
    );
}
