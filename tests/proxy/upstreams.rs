//! Named upstreams (`[upstreams.NAME]`, `upstream = "NAME"`): `shedgate check` accepts them
//! and warns about one nothing names; each request goes to its route's or stream's upstream
//! and is decided against that upstream's pressure; a reload moves routes and streams between
//! upstreams (`upstream_reload.rs` changes the upstreams themselves).

use std::path::Path;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::*;

/// Two upstreams: `tracking`, which a stream names, and `events`, which nothing names.
fn two_upstreams() -> String {
    format!(
        "{}\n[upstreams.tracking]\nurl = \"http://127.0.0.1:3001\"\nlatency_target = \"50ms\"\n\
         \n[upstreams.events]\nurl = \"http://127.0.0.1:3002\"\n",
        SEED_STREAMS.replace(
            "[streams.\"vehicle.position\"]\n",
            "[streams.\"vehicle.position\"]\nupstream = \"tracking\"\n",
        )
    )
}

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/examples/several-upstreams")
}

fn check(dir: &Path) -> (std::process::ExitStatus, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("check")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_upstreams_and_warns_about_one_nothing_names() {
    let policy = PolicyDir::new(&two_upstreams(), Some(BERLIN_AREA));
    let (status, out, err) = check(policy.path());
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains(
            "streams.toml: warning: upstream \"events\" is defined but no route or stream \
             names it"
        ),
        "{out}"
    );
    assert!(out.contains("1 warning(s)"), "{out}");
    // The worked example in the repository checks clean.
    let (status, out, err) = check(&example());
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(out.contains("0 warning(s)"), "{out}");
    // An unknown name is an error naming its line and field.
    let unknown = two_upstreams().replace("upstream = \"tracking\"", "upstream = \"trackng\"");
    let policy = PolicyDir::new(&unknown, Some(BERLIN_AREA));
    let (status, _, err) = check(policy.path());
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("streams.toml:3:12: field `streams.\"vehicle.position\".upstream`: no upstream \"trackng\" (defined: default, events, tracking)"),
        "{err}"
    );
}

/// Three upstreams behind one proxy: `default` (`--upstream`), `tracking` (named by the
/// `vehicle.position` stream) and `events` (named by the `/events` route, whose stream is
/// `vehicle.position` too: the route's wins).
struct Three {
    default: MockUpstream,
    tracking: MockUpstream,
    events: MockUpstream,
    policy: PolicyDir,
    proxy: shedgate::app::Running,
}

fn three_streams(tracking: &str, events: &str, stream_upstream: &str) -> String {
    format!(
        "{}\n[upstreams.tracking]\nurl = \"{tracking}\"\n\n[upstreams.events]\nurl = \"{events}\"\n\n\
         [[routes]]\nprefix = \"/events\"\nstream = \"vehicle.position\"\nupstream = \"events\"\n",
        SEED_STREAMS.replace(
            "[streams.\"vehicle.position\"]\n",
            &format!("[streams.\"vehicle.position\"]\nupstream = \"{stream_upstream}\"\n"),
        )
    )
}

async fn three() -> Three {
    let (default, tracking, events) = (
        MockUpstream::start().await,
        MockUpstream::start().await,
        MockUpstream::start().await,
    );
    let policy = PolicyDir::new(
        &three_streams(&tracking.url(), &events.url(), "tracking"),
        Some(BERLIN_AREA),
    );
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    Three {
        default,
        tracking,
        events,
        policy,
        proxy,
    }
}

impl Three {
    async fn post_to(&self, path: &str, stream: &str) -> Answer {
        let req = Request::post(format!("http://{}{path}", self.proxy.proxy_addr))
            .header("x-stream", stream)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(event(MUNICH, 0))))
            .unwrap();
        send(req).await
    }

    async fn status(&self, path: &str, stream: &str) -> StatusCode {
        self.post_to(path, stream).await.status
    }

    fn counts(&self) -> (usize, usize, usize) {
        (
            self.default.count(),
            self.tracking.count(),
            self.events.count(),
        )
    }

    async fn pin(&self, upstream: &str, pressure: f64) -> Answer {
        let req = Request::put(format!(
            "http://{}/pressure?upstream={upstream}",
            self.proxy.admin_addr
        ))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"pin\":{pressure}}}"))))
        .unwrap();
        send(req).await
    }

    async fn reload(&self, streams: &str) -> Answer {
        let tmp = self.policy.path().join(".streams.tmp");
        std::fs::write(&tmp, streams).unwrap();
        std::fs::rename(&tmp, self.policy.path().join("streams.toml")).unwrap();
        let req = Request::post(format!("http://{}/reload", self.proxy.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        send(req).await
    }
}

/// A request goes to its route's upstream, else its stream's, else `default`; never-shed and
/// sheddable streams alike.
#[tokio::test]
async fn each_request_goes_to_its_routes_or_streams_upstream() {
    let t = three().await;
    assert_eq!(
        t.status("/ingest", "vehicle.position").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (0, 1, 0));
    assert_eq!(
        t.status("/ingest", "geofence.transition").await,
        StatusCode::OK
    );
    assert_eq!(t.status("/ingest", "sensor.reading").await, StatusCode::OK);
    assert_eq!(
        t.status("/ingest", "not.in.the.policy").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (3, 1, 0));
    // The route names `events`: over its stream's `tracking`.
    assert_eq!(
        t.status("/events", "vehicle.position").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (3, 1, 1));
}

/// Each upstream has its own pressure: `tracking` pinned at 1.0 sheds every sheddable request
/// bound there, and none bound to `default`, whose pressure is its own; an unknown name is a
/// 404 naming the upstreams there are.
#[tokio::test]
async fn a_pinned_upstream_sheds_only_what_goes_to_it() {
    let t = three().await;
    assert_eq!(t.pin("tracking", 1.0).await.status, StatusCode::OK);
    for _ in 0..20 {
        assert_eq!(
            t.status("/ingest", "vehicle.position").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(t.status("/ingest", "sensor.reading").await, StatusCode::OK);
        assert_eq!(
            t.status("/events", "vehicle.position").await,
            StatusCode::OK
        );
        // Never shed, on the pinned upstream too.
        let req = Request::post(format!("http://{}/ingest", t.proxy.proxy_addr))
            .header("x-stream", "geofence.transition")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(event(MUNICH, 0))))
            .unwrap();
        assert_eq!(send(req).await.status, StatusCode::OK);
    }
    assert_eq!(t.counts(), (40, 0, 20));
    let p = admin_get(&t.proxy, "/pressure?upstream=tracking")
        .await
        .json();
    assert_eq!(
        (
            p["upstream"].as_str(),
            p["value"].as_f64(),
            p["pinned"].as_bool()
        ),
        (Some("tracking"), Some(1.0), Some(true))
    );
    let p = admin_get(&t.proxy, "/pressure").await.json();
    assert_eq!(p["pinned"].as_bool(), Some(false), "{p}");
    let stats = admin_get(&t.proxy, "/stats").await.json();
    let names: Vec<&str> = stats["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "events", "tracking"]);
    let a = t.pin("trackng", 1.0).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let body = String::from_utf8_lossy(&a.body).into_owned();
    assert!(body.contains("default, events, tracking"), "{body}");
}

/// A reload that moves a stream to another upstream sends its next request there, and so
/// does one that moves a route.
#[tokio::test]
async fn a_reload_moves_a_stream_or_a_route_between_upstreams() {
    let t = three().await;
    assert_eq!(
        t.status("/ingest", "vehicle.position").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (0, 1, 0));
    let moved = three_streams(&t.tracking.url(), &t.events.url(), "events");
    assert_eq!(t.reload(&moved).await.status, StatusCode::OK);
    assert_eq!(
        t.status("/ingest", "vehicle.position").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (0, 1, 1));
    // The `/events` route moved from `events` to `tracking`.
    assert_eq!(
        t.status("/events", "vehicle.position").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (0, 1, 2));
    let route_moved = moved.replace(
        "stream = \"vehicle.position\"\nupstream = \"events\"",
        "stream = \"vehicle.position\"\nupstream = \"tracking\"",
    );
    assert_ne!(route_moved, moved);
    assert_eq!(t.reload(&route_moved).await.status, StatusCode::OK);
    assert_eq!(
        t.status("/events", "vehicle.position").await,
        StatusCode::OK
    );
    assert_eq!(t.counts(), (0, 2, 2));
}

/// `shedgate serve` starts on the worked example (its upstreams' names resolve only when a
/// request is sent, so start does not need them up) and answers for each of them.
#[tokio::test]
async fn serve_starts_on_the_worked_example() {
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), &example()).await;
    let stats = admin_get(&proxy, "/stats").await.json();
    assert_eq!(
        stats["upstreams"].as_array().map(Vec::len),
        Some(4),
        "{stats}"
    );
    let p = admin_get(&proxy, "/pressure?upstream=alerting")
        .await
        .json();
    assert_eq!(p["pinned"].as_bool(), Some(false), "{p}");
}

/// Over real sockets, two upstreams of fixed capacity behind one proxy: `busy` (2 workers ×
/// 20 ms, 100 req/s) offered three times its capacity and `default` (4 × 20 ms, 200 req/s)
/// half of its, for 3 s, open loop. Each has its own pressure: the overloaded one sheds and
/// the healthy one sheds none of its requests, never-shed and sheddable alike (one shared
/// pressure would shed positions bound for the healthy one).
#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_upstream_sheds_nothing_bound_for_a_healthy_one() {
    use shedgate::demo::sim::{ServiceTime, Simulator};
    use std::sync::Arc;
    use std::time::Duration;
    let service = ServiceTime::Fixed(Duration::from_millis(20));
    let busy = Simulator::new(2, service, Vec::new(), 1);
    let healthy = Simulator::new(4, service, Vec::new(), 2);
    let (busy_addr, _busy) = Arc::clone(&busy).serve_http().await.unwrap();
    let (healthy_addr, _healthy) = Arc::clone(&healthy).serve_http().await.unwrap();
    let streams = format!(
        "{}\n[upstreams.busy]\nurl = \"http://{busy_addr}\"\n",
        SEED_STREAMS
            .replace(
                "[streams.\"vehicle.position\"]\n",
                "[streams.\"vehicle.position\"]\nupstream = \"busy\"\n",
            )
            .replace(
                "[streams.\"dlq.replay\"]\n",
                "[streams.\"dlq.replay\"]\nupstream = \"busy\"\n",
            )
    );
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&format!("http://{healthy_addr}"), policy.path()).await;
    let url = format!("http://{}/ingest", proxy.proxy_addr);
    // (stream, requests a second): to `busy` 300 (a twentieth never shed), to `default` 100
    // (a tenth never shed).
    let load = [
        ("vehicle.position", 285.0),
        ("dlq.replay", 15.0),
        ("sensor.reading", 90.0),
        ("geofence.transition", 10.0),
    ];
    let c = client();
    let start = tokio::time::Instant::now();
    let mut sent = [0u32; 4];
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    while start.elapsed() < Duration::from_secs(3) {
        tick.tick().await;
        let due = start.elapsed().as_secs_f64();
        for (i, (stream, rate)) in load.iter().enumerate() {
            #[expect(clippy::cast_possible_truncation, reason = "a few hundred requests")]
            #[expect(clippy::cast_sign_loss, reason = "a few hundred requests")]
            let want = (rate * due) as u32;
            while sent[i] < want {
                sent[i] += 1;
                let req = Request::post(&url)
                    .header("x-stream", *stream)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(event(MUNICH, 0))))
                    .unwrap();
                let c = c.clone();
                tasks.spawn(async move {
                    let status = tokio::time::timeout(Duration::from_secs(10), c.request(req))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|r| r.status());
                    (i, status)
                });
            }
        }
    }
    // (answered 2xx, shed 503, anything else) per stream.
    let mut outcome = [(0u32, 0u32, 0u32); 4];
    while let Some(done) = tasks.join_next().await {
        let (i, status) = done.unwrap();
        match status {
            Some(s) if s.is_success() => outcome[i].0 += 1,
            Some(StatusCode::SERVICE_UNAVAILABLE) => outcome[i].1 += 1,
            _ => outcome[i].2 += 1,
        }
    }
    let [position, dlq, sensor, geofence] = outcome;
    // The healthy upstream's: every one answered by it.
    assert_eq!((sensor.1, sensor.2), (0, 0), "sensor.reading {sensor:?}");
    assert_eq!(
        (geofence.1, geofence.2),
        (0, 0),
        "geofence.transition {geofence:?}"
    );
    // The overloaded one's: positions shed, its never-shed stream not.
    assert!(
        position.1 > 0,
        "vehicle.position {position:?}: nothing shed"
    );
    assert_eq!(dlq.1, 0, "dlq.replay {dlq:?}");
}
