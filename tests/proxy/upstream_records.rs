//! The upstream named on record, with two upstreams behind one proxy: each access-log line
//! names the upstream whose pressure decided it (none for an answer given before routing),
//! replay reproduces every decision at its own upstream's pressure and counts as `moved` the
//! lines a candidate sends elsewhere (so does the preview), and the 503 body, `/devices` and
//! `explain` name the upstream.

use std::path::Path;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use shedgate::record::replay::Run;

use super::access_log::{fix, lines, logging};
use super::replay::replay_command;
use super::support::*;

/// `vehicle.position` goes to `tracking`, `cargo.position` to `default` unless `cargo_to`
/// names another, the `/fleet` route (whose stream is `cargo.position`) to `tracking`
/// whatever its stream's, and the `never` stream to `default`.
fn streams(tracking: &str, cargo_to: Option<&str>) -> String {
    let cargo = cargo_to.map_or_else(String::new, |u| format!("upstream = \"{u}\"\n"));
    format!(
        r#"
[upstreams.tracking]
url = "{tracking}"

[streams."vehicle.position"]
supersession = "self-superseding"
stale_after = "60s"
device = "/device_id"
upstream = "tracking"
[streams."cargo.position"]
supersession = "self-superseding"
stale_after = "60s"
device = "/device_id"
{cargo}[streams."geofence.transition"]
supersession = "never"

[[routes]]
prefix = "/fleet"
stream = "cargo.position"
upstream = "tracking"
"#
    )
}

async fn post_at(
    proxy: &shedgate::app::Running,
    path: &str,
    stream: &str,
    body: impl Into<Bytes>,
) -> Answer {
    let req = Request::post(format!("http://{}{path}", proxy.proxy_addr))
        .header("x-stream", stream)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap();
    send(req).await
}

async fn pin_at(proxy: &shedgate::app::Running, upstream: &str, pressure: f64) {
    let req = Request::put(format!(
        "http://{}/pressure?upstream={upstream}",
        proxy.admin_addr
    ))
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from(format!("{{\"pin\":{pressure}}}"))))
    .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK, "pin {upstream}");
}

fn compiled(dir: &Path) -> shedgate::policy::Policy {
    shedgate::policy::load_dir(dir)
        .expect("policy compiles")
        .policy
}

/// `tracking` pinned at 0.9, `default` at 0.3. Every line names its upstream and was decided
/// at that upstream's pressure; the 413 refused before routing names none. The 503 names
/// `tracking`, and `/devices` names each device's upstream. The log replays exactly under
/// its own policy; a candidate that sends `cargo.position` to `tracking` moves exactly the
/// cargo lines read without the route (the route's upstream wins), and decides the rest. A
/// line written before lines named upstreams replays as bound for `default`.
#[tokio::test]
async fn lines_name_their_upstream_and_replay_counts_the_moved() {
    let (default, tracking) = (MockUpstream::start().await, MockUpstream::start().await);
    let policy = PolicyDir::new(&streams(&tracking.url(), None), Some(BERLIN_AREA));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let proxy = logging(
        &default.url(),
        policy.path(),
        &log,
        &shedgate::signals::Signals::none(),
        |a| a.max_body = Some(2048),
    )
    .await;
    pin_at(&proxy, "tracking", 0.9).await;
    pin_at(&proxy, "default", 0.3).await;
    let n = 6;
    for i in 0..n {
        let at = if i % 2 == 0 { BERLIN } else { MUNICH };
        post(&proxy, "vehicle.position", fix(&format!("v{i}"), at, 3)).await;
        post(&proxy, "cargo.position", fix(&format!("c{i}"), at, 3)).await;
        post_at(
            &proxy,
            "/fleet",
            "cargo.position",
            fix(&format!("f{i}"), at, 3),
        )
        .await;
        post(&proxy, "geofence.transition", r#"{"lat":1,"lon":2}"#).await;
    }
    // Munich (rank 50) at `tracking`'s 0.9 is shed: the body names the upstream.
    let shed = post(&proxy, "vehicle.position", fix("v-shed", MUNICH, 3)).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    let body = shed.json();
    assert_eq!(
        (&body["upstream"], body["pressure"].as_f64()),
        (&serde_json::json!("tracking"), Some(0.9)),
        "{body}"
    );
    let big = post(&proxy, "cargo.position", "x".repeat(3000)).await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);

    // `/devices` names the upstream a device's requests go to.
    for (query, upstream) in [
        ("stream=vehicle.position&id=v0", "tracking"),
        ("stream=cargo.position&id=c0", "default"),
        ("route=/fleet&id=f0", "tracking"),
    ] {
        let a = admin_get(&proxy, &format!("/devices?{query}")).await;
        assert_eq!(a.status, StatusCode::OK, "{query}: {:?}", a.body);
        assert_eq!(a.json()["upstream"], upstream, "{query}");
    }
    proxy.shutdown().await;
    assert_eq!(
        (tracking.count(), default.count()),
        (n, 2 * n),
        "Munich's vehicle and route fixes shed at tracking's 0.9; all pass default's 0.3"
    );

    let written = lines(&log);
    assert_eq!(written.len(), n * 4 + 2);
    let bound = |l: &serde_json::Value| -> &'static str {
        if l["route"] == "/fleet" || l["stream"] == "vehicle.position" {
            "tracking"
        } else {
            "default"
        }
    };
    for l in &written {
        if l["status"] == 413 {
            assert!(l.get("upstream").is_none(), "refused before routing: {l}");
            continue;
        }
        assert_eq!(l["upstream"], bound(l), "{l}");
        if l.get("draw").is_some() {
            let at = if bound(l) == "tracking" { 0.9 } else { 0.3 };
            assert_eq!(l["pressure"].as_f64(), Some(at), "{l}");
        }
    }
    let decided = |pick: &dyn Fn(&serde_json::Value) -> bool| {
        let n = written
            .iter()
            .filter(|l| l.get("draw").is_some() && pick(l))
            .count();
        u32::try_from(n).unwrap()
    };
    let cargo_unrouted = decided(&|l| l["stream"] == "cargo.position" && l["route"].is_null());
    let all = decided(&|_| true);
    assert_eq!(usize::try_from(cargo_unrouted).unwrap(), n);

    // Its own policy reproduces every decision, each at its upstream's pressure.
    let live = compiled(policy.path());
    let file = std::fs::File::open(&log).unwrap();
    let run = Run::read(std::io::BufReader::new(file), &live).unwrap();
    let stats = run.replay.stats;
    assert_eq!(stats.mismatched, 0, "{:#?}", run.replay.mismatches);
    assert_eq!((stats.reproduced, stats.moved), (u64::from(all), 0));

    // A candidate sending `cargo.position` to `tracking`: the cargo lines read without the
    // route are moved, never decided; the route's stay where the route sends them.
    let candidate = PolicyDir::new(
        &streams(&tracking.url(), Some("tracking")),
        Some(BERLIN_AREA),
    );
    let moving = compiled(candidate.path());
    let file = std::fs::File::open(&log).unwrap();
    let run = Run::read(std::io::BufReader::new(file), &moving).unwrap();
    let stats = run.replay.stats;
    assert_eq!(
        (stats.moved, stats.compared, stats.mismatched),
        (
            u64::from(cargo_unrouted),
            u64::from(all - cargo_unrouted),
            0
        )
    );
    let rows = run.replay.tally.rows(&moving, 0.0);
    let moved: f64 = rows.iter().map(|r| r.counts.moved).sum();
    assert_eq!(moved, f64::from(cargo_unrouted));
    assert!(
        rows.iter()
            .filter(|r| r.counts.moved > 0.0)
            .all(|r| r.stream == "cargo.position"),
        "{rows:#?}"
    );
    let (code, text, err) = replay_command(&log, candidate.path());
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(
        text.contains(&format!(
            "sent to another upstream:     {cargo_unrouted} of the other policies' decisions: \
             not decided"
        )),
        "{text}"
    );

    // Lines written before lines named upstreams: bound for `default`. A cargo line
    // reproduces; a vehicle line, which the policy sends to `tracking`, does not.
    let text = std::fs::read_to_string(&log).unwrap();
    let old = |stream: &str| {
        text.lines()
            .find(|l| {
                l.contains(&format!("\"stream\":\"{stream}\""))
                    && l.contains("\"draw\"")
                    && !l.contains("\"route\"")
            })
            .unwrap()
            .replace(",\"upstream\":\"tracking\"", "")
            .replace(",\"upstream\":\"default\"", "")
    };
    let mut replay = shedgate::record::replay::Replay::new(&live);
    replay.line(1, &old("cargo.position")).unwrap();
    replay.line(2, &old("vehicle.position")).unwrap();
    assert_eq!(
        (replay.stats.reproduced, replay.stats.mismatched),
        (1, 1),
        "{:#?}",
        replay.mismatches
    );
    let m = &replay.mismatches[0];
    assert_eq!(m.line, 2);
    assert!(m.recorded.ends_with("at upstream default"), "{m:?}");
    assert_eq!(m.replayed, "sent to upstream tracking, not decided");
}

/// A preview of a candidate that sends `cargo.position` to `tracking` counts those requests
/// `moved` and decides the others; the metric counts them under `candidate="moved"`.
#[tokio::test]
async fn a_preview_counts_what_its_candidate_sends_elsewhere() {
    let (default, tracking) = (MockUpstream::start().await, MockUpstream::start().await);
    let policy = PolicyDir::new(&streams(&tracking.url(), None), Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    let start = serde_json::json!({
        "files": {
            "streams.toml": streams(&tracking.url(), Some("tracking")),
            "areas.toml": BERLIN_AREA,
        },
        "seconds": 600,
    })
    .to_string();
    let req = Request::post(format!("http://{}/policy/preview", proxy.admin_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(start)))
        .unwrap();
    let started = send(req).await;
    assert_eq!(started.status, StatusCode::OK, "{:?}", started.body);
    let (cargo, vehicle) = (5, 3);
    for i in 0..cargo {
        let a = post(&proxy, "cargo.position", fix(&format!("c{i}"), BERLIN, 3)).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    for i in 0..vehicle {
        let a = post(&proxy, "vehicle.position", fix(&format!("v{i}"), BERLIN, 3)).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    let report = admin_get(&proxy, "/policy/preview").await.json();
    let rows = report["rows"].as_array().unwrap();
    let sum = |stream: &str, key: &str| -> f64 {
        rows.iter()
            .filter(|r| r["stream"] == stream)
            .map(|r| r[key].as_f64().unwrap())
            .sum()
    };
    assert_eq!(
        (
            sum("cargo.position", "moved"),
            sum("cargo.position", "now_admitted")
        ),
        (f64::from(cargo), 0.0),
        "{rows:#?}"
    );
    assert_eq!(
        (
            sum("vehicle.position", "moved"),
            sum("vehicle.position", "now_admitted")
        ),
        (0.0, f64::from(vehicle)),
        "{rows:#?}"
    );
    let text = scrape(&proxy).await;
    assert_eq!(
        metric(
            &text,
            "shedgate_preview_decisions_total",
            &[("stream", "cargo.position"), ("candidate", "moved")]
        ),
        f64::from(cargo)
    );
}

fn explain(policies: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("explain")
        .arg("--policies")
        .arg(policies)
        .args(["--lat", "48.1372", "--lon", "11.5756", "--pressure", "0.5"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `explain` names the upstream: the stream's, the route's over it, `default` otherwise; a
/// route the policy does not have is refused with the ones it has.
#[test]
fn explain_names_the_upstream_its_request_goes_to() {
    let policy = PolicyDir::new(&streams("http://127.0.0.1:3001", None), Some(BERLIN_AREA));
    let (code, out, err) = explain(policy.path(), &["--stream", "vehicle.position"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("upstream:    tracking (the stream's: --pressure is its)"),
        "{out}"
    );
    let (code, out, err) = explain(policy.path(), &["--stream", "cargo.position", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["upstream"], "default");
    let (code, out, err) = explain(
        policy.path(),
        &["--stream", "cargo.position", "--route", "/fleet"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("upstream:    tracking (route /fleet's: --pressure is its)"),
        "{out}"
    );
    let (code, _, err) = explain(
        policy.path(),
        &["--stream", "cargo.position", "--route", "/nope"],
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--route \"/nope\" is not a route of the policy (its routes: /fleet)"),
        "{err}"
    );
}
