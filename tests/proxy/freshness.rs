//! The freshness floor (docs/decision.md "Devices"): a device silent past its `max_silence` is
//! admitted where the curve sheds its whole rank, within the floor's budget; its silence runs
//! from its last fix the upstream answered 2xx, by the proxy's clock. Through the running
//! proxy over loopback, pressure pinned at 1.0, with a clock the test advances.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use http::StatusCode;
use shedgate::config::ServeArgs;

use super::support::*;

/// A sheddable stream whose fixes name their device, with a 5 s floor; Munich is at the
/// default rank, shed whole at pressure 1.0.
const FLOORED: &str = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
device = "/device_id"
max_silence = "5s"
"#;

/// A proxy with `streams` in front of an upstream answering `status`, whose clock (and the
/// upstream's `Date`) is an atomic the test advances.
struct World {
    now: Arc<AtomicI64>,
    upstream: MockUpstream,
    proxy: shedgate::app::Running,
    _policy: PolicyDir,
}

async fn world(streams: &str, status: StatusCode) -> World {
    world_with(streams, status, std::time::Duration::ZERO, |_| {}).await
}

/// As [`world`], the upstream answering after `delay`, the proxy's settings tweaked.
async fn world_with(
    streams: &str,
    status: StatusCode,
    delay: std::time::Duration,
    tweak: impl FnOnce(&mut ServeArgs),
) -> World {
    let now = Arc::new(AtomicI64::new(NOW.0));
    let upstream = MockUpstream::with(Behaviour {
        status,
        delay,
        clock: Some(Arc::clone(&now)),
        ..Behaviour::default()
    })
    .await;
    let policy = PolicyDir::new(streams, None);
    let mut args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.url()),
        policies: Some(policy.path().to_owned()),
        ..ServeArgs::default()
    };
    tweak(&mut args);
    let proxy = start_with_clock(args, &now, 0).await;
    pin(&proxy, 1.0).await;
    World {
        now,
        upstream,
        proxy,
        _policy: policy,
    }
}

impl World {
    fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// A fresh fix of `device` in Munich, stamped now.
    async fn fix(&self, device: &str) -> Answer {
        send(self.request(device)).await
    }

    /// The request of [`World::fix`].
    fn request(&self, device: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(self.now.load(Ordering::SeqCst)) * 1_000_000,
        )
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
        let body = format!(
            r#"{{"device_id":"{device}","lat":{},"lon":{},"occurred_at":"{t}"}}"#,
            MUNICH.0, MUNICH.1
        );
        http::Request::post(format!("http://{}/ingest", self.proxy.proxy_addr))
            .header("x-stream", "vehicle.position")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    }
}

/// Devices sending a fix a second for 16 s at pressure 1.0: each is delivered at least every
/// `max_silence` plus one interval (6 s here), and most of their fixes are still shed.
#[tokio::test]
async fn devices_are_kept_within_their_floor_while_their_rank_is_shed() {
    let w = world(FLOORED, StatusCode::OK).await;
    let devices = ["veh-1", "veh-2", "veh-3"];
    let mut delivered: Vec<Vec<i64>> = vec![Vec::new(); devices.len()];
    let mut shed = 0;
    for second in 0..16 {
        for (i, d) in devices.iter().enumerate() {
            let a = w.fix(d).await;
            match a.status {
                StatusCode::OK => delivered[i].push(second),
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(a.header("x-shed-reason"), Some("pressure"));
                    shed += 1;
                }
                other => panic!("{d} at {second} s: {other}"),
            }
        }
        w.advance(1_000);
    }
    for (d, seconds) in devices.iter().zip(&delivered) {
        // The first fix ends a silence that began before the proxy knew the device.
        assert_eq!(seconds.first(), Some(&0), "{d}: {seconds:?}");
        let longest = seconds
            .windows(2)
            .map(|w| w[1] - w[0])
            .chain(std::iter::once(16 - seconds.last().unwrap()))
            .max()
            .unwrap();
        assert!(
            longest <= 6,
            "{d} silent {longest} s: delivered at {seconds:?}"
        );
        assert_eq!(seconds, &[0, 6, 12], "{d}");
    }
    assert_eq!(shed, devices.len() * 13);
    assert_eq!(w.upstream.count(), devices.len() * 3);
    let m = scrape(&w.proxy).await;
    let admitted = metric(
        &m,
        "shedgate_freshness_total",
        &[("stream", "vehicle.position"), ("outcome", "admitted")],
    );
    assert!((admitted - 9.0).abs() < f64::EPSILON, "{admitted}");
}

/// A floor admission the upstream answers 5xx delivers nothing: the device stays silent, and
/// its next fix is admitted by the floor again; one answered 2xx ends the silence.
#[tokio::test]
async fn an_admission_answered_5xx_leaves_the_device_silent() {
    for (status, second_fix) in [
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let w = world(FLOORED, status).await;
        assert_eq!(w.fix("veh-1").await.status, status);
        w.advance(1_000);
        assert_eq!(w.fix("veh-1").await.status, second_fix, "upstream {status}");
    }
}

/// The floor overrides the curve only: a stream with no floor is shed whole at 1.0, and a
/// request that names no device has no silence to end.
#[tokio::test]
async fn without_a_floor_or_a_device_the_curve_decides() {
    let w = world(
        &FLOORED.replace("max_silence = \"5s\"\n", ""),
        StatusCode::OK,
    )
    .await;
    assert_eq!(w.fix("veh-1").await.status, StatusCode::SERVICE_UNAVAILABLE);
    let w = world(FLOORED, StatusCode::OK).await;
    let body = format!(r#"{{"lat":{},"lon":{}}}"#, MUNICH.0, MUNICH.1);
    let a = post(&w.proxy, "vehicle.position", body).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
}

/// Floor admissions and denials replay exactly under their own policy: the line carries the
/// device's delivery age and the floor's budget as the decision read them.
#[tokio::test]
async fn floor_decisions_replay_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    // A budget of one admission (a tenth of 10 in flight), and an upstream slow enough that
    // fixes sent together meet it full.
    let delay = std::time::Duration::from_millis(100);
    let w = world_with(FLOORED, StatusCode::OK, delay, |a| {
        a.access_log = Some(log.display().to_string());
        a.max_inflight = Some(10);
    })
    .await;
    for _ in 0..8 {
        let mut sent = tokio::task::JoinSet::new();
        for i in 0..6 {
            let req = w.request(&format!("veh-{i}"));
            sent.spawn(send(req));
        }
        while sent.join_next().await.is_some() {}
        w.advance(1_000);
    }
    let World {
        proxy,
        _policy: policy,
        ..
    } = w;
    let m = scrape(&proxy).await;
    let denied = metric(
        &m,
        "shedgate_freshness_total",
        &[("stream", "vehicle.position"), ("outcome", "denied")],
    );
    assert!(denied > 0.0, "no candidate met a full budget");
    proxy.shutdown().await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("\"rule\":\"freshness\""), "{text}");
    assert!(text.contains("\"since_delivered_ms\""), "{text}");
    let decided = text.lines().filter(|l| l.contains("\"draw\"")).count();
    let (code, said, _) = super::replay::replay_command(&log, policy.path());
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("{decided} reproduced, 0 mismatched")),
        "{said}"
    );
}

/// A preview decides with the candidate's floor over the live deliveries: the live policy
/// previewed against itself counts every decision the same, and a candidate without the floor
/// sheds what the floor admitted.
#[tokio::test]
async fn a_preview_decides_with_the_candidates_floor() {
    let no_floor = FLOORED.replace("max_silence = \"5s\"\n", "");
    for (candidate, admitted) in [(FLOORED, 9.0), (no_floor.as_str(), 0.0)] {
        let w = world(FLOORED, StatusCode::OK).await;
        let body = serde_json::json!({"files": {"streams.toml": candidate}, "seconds": 600});
        let req = http::Request::post(format!("http://{}/policy/preview", w.proxy.admin_addr))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap();
        let started = send(req).await;
        assert_eq!(started.status, StatusCode::OK, "{:?}", started.body);
        for _ in 0..16 {
            for d in ["veh-1", "veh-2", "veh-3"] {
                w.fix(d).await;
            }
            w.advance(1_000);
        }
        let report = admin_get(&w.proxy, "/policy/preview").await.json();
        let row = &report["rows"].as_array().unwrap()[0];
        assert_eq!(row["then_admitted"].as_f64(), Some(9.0), "{report:#}");
        assert_eq!(row["now_admitted"].as_f64(), Some(admitted), "{report:#}");
        assert_eq!(
            row["now_shed"].as_f64(),
            Some(48.0 - admitted),
            "{report:#}"
        );
    }
}
