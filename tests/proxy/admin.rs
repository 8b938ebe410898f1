//! Integration tests of the admin listener and metrics: pressure pinning, latency samples,
//! the metric catalog, warn mode, live disable, the example policies and the README's
//! metric table.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use super::support::*;

#[tokio::test]
async fn pressure_can_be_pinned_unpinned_and_read() {
    let (_upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 0.8).await;
    let v = admin_get(&proxy, "/pressure").await.json();
    assert_eq!(v["value"], 0.8);
    assert_eq!(v["pinned"], true);
    // No safety cap by default: the controller learns what "full" is.
    assert!(v["controller"]["max_inflight"].is_null());
    assert!(v["controller"]["latency_target_ms"].as_f64().is_some());
    assert!(v["controller"]["concurrency_share"].as_f64().is_some());
    let m = scrape(&proxy).await;
    assert_eq!(
        metric(&m, "shedgate_pressure_pinned", &[("upstream", "default")]),
        1.0
    );
    let req = Request::delete(format!("http://{}/pressure", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let v = send(req).await.json();
    assert_eq!(v["pinned"], false);
    assert!(v["value"].as_f64().unwrap() < 0.5);
    for bad in ["{\"pin\": 1.5}", "{\"pin\": -0.1}", "{}", "nope"] {
        let req = Request::put(format!("http://{}/pressure", proxy.admin_addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bad)))
            .unwrap();
        let a = send(req).await;
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
    }
}

/// Only answers the upstream gave, and not its 5xx, are latency samples (docs/pressure.md
/// "Pressure": only upstream latency is a sample): a fast 503 says nothing about
/// how long served requests take. The same requests answered 200 are samples.
#[tokio::test]
async fn upstream_5xx_are_not_latency_samples() {
    for (status, sampled) in [
        (StatusCode::SERVICE_UNAVAILABLE, false),
        (StatusCode::OK, true),
    ] {
        let behaviour = Behaviour {
            status,
            ..Behaviour::default()
        };
        let (upstream, _policy, proxy) = seeded_with(behaviour, |_| {}).await;
        for _ in 0..30 {
            let a = post(&proxy, "geofence.transition", event(BERLIN, 0)).await;
            assert_eq!(a.status, status);
        }
        // Several controller ticks (50 ms each), then until the samples show, if they do.
        let mut rate = 0.0;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let v = admin_get(&proxy, "/pressure").await.json();
            rate = v["controller"]["sample_rate"].as_f64().unwrap();
            if rate > 0.0 || !sampled {
                break;
            }
        }
        assert_eq!(rate > 0.0, sampled, "{status}: sample rate {rate}");
        assert_eq!(upstream.count(), 30);
    }
}

#[tokio::test]
async fn metrics_expose_the_catalog_with_policy_names_only() {
    let (_upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 0.75).await;
    post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    post(&proxy, "vehicle.position", r#"{"lat":"x"}"#).await;
    post(&proxy, "evil\"} 1 hacked{a=\"", event(MUNICH, 0)).await;
    post(&proxy, "no.such.stream", event(MUNICH, 0)).await;
    // Let the ticker publish gauges and the upkeep run.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let m = scrape(&proxy).await;
    // Every declared metric this traffic touches is exposed (would-sheds need warn mode, the
    // disabled gauge a disabled stream, opaque envelopes an owntracks route, the schedule
    // gauge a schedule, leads an event in the future: their own tests), and nothing
    // undeclared is.
    for (name, _, _) in shedgate::metrics::CATALOG {
        if ![
            shedgate::metrics::WOULD_SHED,
            shedgate::metrics::DISABLED_UNTIL,
            shedgate::metrics::OPAQUE,
            shedgate::metrics::SCHEDULE_ACTIVE,
            // A time in the future (`held.rs`), a device's second admitted fix, an untrusted
            // device id (`devices.rs`).
            shedgate::metrics::EVENT_LEAD,
            shedgate::metrics::DEVICE_GAP,
            shedgate::metrics::DEVICE_UNTRUSTED,
            // A policy with `max_silence` under pressure (`devices.rs`).
            shedgate::metrics::FRESHNESS,
            shedgate::metrics::DEVICE_SILENCE,
            // A policy preview running (`preview.rs`).
            shedgate::metrics::PREVIEW_DECISIONS,
        ]
        .contains(name)
        {
            assert!(
                m.contains(&format!("# TYPE {name} ")),
                "{name} missing:\n{m}"
            );
        }
    }
    for line in m.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = line.split(' ').next().unwrap();
        assert!(
            shedgate::metrics::CATALOG
                .iter()
                .any(|(n, _, _)| *n == name),
            "undeclared {name}"
        );
    }
    assert_eq!(
        metric(
            &m,
            "shedgate_requests_total",
            &[
                ("stream", "unknown"),
                ("outcome", "forwarded"),
                ("upstream", "default")
            ]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "shedgate_requests_total",
            &[
                ("stream", "vehicle.position"),
                ("outcome", "shed"),
                ("upstream", "default")
            ]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "shedgate_unreadable_facts_total",
            &[("stream", "vehicle.position"), ("fact", "coordinates")]
        ),
        1.0
    );
    assert!(
        !m.contains("hacked") && !m.contains("no.such.stream"),
        "client values never become labels"
    );
    assert!(
        !m.contains("841f1d5ffffffff"),
        "cell ids never become labels"
    );
    assert_eq!(
        metric(&m, "shedgate_pressure", &[("upstream", "default")]),
        0.75
    );
    // The upstream's series carry its name, and only labelled series exist.
    assert!(
        !m.lines()
            .any(|l| l.starts_with("shedgate_pressure ")
                || l.starts_with("shedgate_inflight_requests ")),
        "{m}"
    );
    assert_eq!(
        metric(&m, "shedgate_rank_cutoff", &[("upstream", "default")]),
        25.0
    );
    assert!(
        m.contains("shedgate_upstream_latency_seconds_bucket"),
        "histogram with buckets"
    );
    let p = admin_get(&proxy, "/policy").await.json();
    assert_eq!(p["areas"][0]["name"], "berlin");
    assert_eq!(p["streams"].as_array().unwrap().len(), 6);
    assert_eq!(admin_get(&proxy, "/healthz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn warn_mode_forwards_and_counts_would_sheds() {
    let upstream = MockUpstream::start().await;
    let streams = SEED_STREAMS.replace(
        "[streams.\"vehicle.position\"]\nsupersession = \"self-superseding\"",
        "[streams.\"vehicle.position\"]\nsupersession = \"self-superseding\"\nmode = \"warn\"",
    );
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.75).await;
    assert_eq!(
        post(&proxy, "vehicle.position", event(MUNICH, 0))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        post(&proxy, "vehicle.position", event(MUNICH, 600))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        post(&proxy, "sensor.reading", event(MUNICH, 0))
            .await
            .status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(upstream.count(), 2);
    let m = scrape(&proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_would_shed_total",
            &[("stream", "vehicle.position"), ("reason", "pressure")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "shedgate_would_shed_total",
            &[("stream", "vehicle.position"), ("reason", "stale")]
        ),
        1.0
    );
    assert_eq!(
        metric(&m, "shedgate_shed_total", &[("stream", "vehicle.position")]),
        0.0
    );
}

#[tokio::test]
async fn disabled_stream_is_shed_with_reason_disabled() {
    let upstream = MockUpstream::start().await;
    let streams = format!(
        "{SEED_STREAMS}\n[streams.\"debug.trace\"]\nsupersession = \"self-superseding\"\nenabled = false\n"
    );
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    let a = post(&proxy, "debug.trace", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.header("x-shed-reason"), Some("disabled"));
    assert!(a.header("retry-after").is_some());
    assert_eq!(upstream.count(), 0);
}

#[test]
fn the_example_policies_compile() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["policies", "policies/examples/cases"] {
        let c =
            shedgate::policy::load_dir(&root.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert!(c.warnings.is_empty(), "{dir}: {:?}", c.warnings);
        assert!(!c.policy.areas().is_empty());
    }
    let seed = shedgate::policy::load_dir(&root.join("policies"))
        .unwrap()
        .policy;
    for s in ["vehicle.position", "sensor.reading", "tile.render"] {
        let id = seed.stream(s).unwrap();
        assert_eq!(
            seed.stream_policy(id).supersession,
            shedgate::policy::Supersession::SelfSuperseding
        );
    }
    for s in ["feature.boundary_edit", "geofence.transition", "dlq.replay"] {
        let id = seed.stream(s).unwrap();
        assert_eq!(
            seed.stream_policy(id).supersession,
            shedgate::policy::Supersession::Never
        );
    }
}

#[test]
fn same_meridian_and_poles_give_the_same_cell() {
    let dir = PolicyDir::seed();
    let p = shedgate::policy::load_dir(dir.path()).unwrap().policy;
    let cell = |lat, lon| {
        h3o::LatLng::new(lat, lon)
            .unwrap()
            .to_cell(h3o::Resolution::Four)
    };
    assert_eq!(cell(0.0, 180.0), cell(0.0, -180.0));
    for lon in [-180.0, -90.0, 0.0, 45.0, 179.9] {
        assert_eq!(cell(90.0, lon), cell(90.0, 0.0));
        assert_eq!(cell(-90.0, lon), cell(-90.0, 0.0));
    }
    assert_eq!(p.area_at(0.0, 180.0), p.area_at(0.0, -180.0));
}

/// The README's demo, shortened: every never-shed event is delivered at every phase, and
/// every stale event is shed as stale (what the demo's tables must show).
#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_delivers_every_never_shed_event() {
    let args = shedgate::demo::DemoArgs {
        policies: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"),
        workers: 4,
        service_ms: 20,
        phase_seconds: 1,
        overload: 4.0,
        seed: 3,
        report_seconds: 1.0,
        // A floor shorter than the overload, on a copy of the policy: never-shed events are
        // delivered all the same.
        max_silence: Some(shedgate::demo::floor::MaxSilence::On(
            std::time::Duration::from_millis(500),
        )),
    };
    let report = shedgate::demo::run_demo(&args, false).await.unwrap();
    let policy = shedgate::policy::load_dir(&args.policies).unwrap().policy;
    assert_eq!(report.phases.len(), 3);
    let mut never = 0;
    for ((phase, stream), t) in &report.by_stream {
        let sheddable = policy.stream(stream).is_some_and(|id| {
            policy.stream_policy(id).supersession == shedgate::policy::Supersession::SelfSuperseding
        });
        if !sheddable {
            assert_eq!(t.delivered, t.sent, "phase {phase}: {stream} {t:?}");
            never += t.sent;
        }
    }
    assert!(never > 0);
    let stale: Vec<_> = report
        .by_area
        .iter()
        .filter(|((_, a), _)| a.contains("stale"))
        .collect();
    assert!(!stale.is_empty());
    for (_, t) in stale {
        assert_eq!(t.stale, t.sent, "{t:?}");
    }
}

/// The metrics reference (docs/metrics.md) lists every declared metric.
#[test]
fn the_metrics_reference_lists_every_metric() {
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
    )
    .unwrap();
    for (name, _, _) in shedgate::metrics::CATALOG {
        assert!(
            reference.contains(&format!("`{name}`")),
            "docs/metrics.md misses {name}"
        );
    }
}
