//! Test harness: a recording mock upstream, a policy directory builder, an in-process proxy
//! on ephemeral loopback ports, a client, and metric scraping.

#![allow(dead_code, reason = "not every module uses every helper")]
#![allow(unreachable_pub, reason = "not every module uses every helper")]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use shedgate::app::Running;
use shedgate::clock::{Sources, UnixMillis};
use shedgate::config::{Config, ServeArgs};
use tokio::net::TcpListener;

/// The wall clock of every test proxy: a fixed instant (2026-05-28T20:26:40Z), so event
/// ages are exact whatever the machine's clock says or how long a test takes.
pub const NOW: UnixMillis = UnixMillis(1_780_000_000_000);

/// The controller's tuned values for the closed-loop scenario tests: the defaults, or those
/// `SHEDGATE_TUNING` overrides (`NAME=VALUE,...`, `shedgate::pressure::Tuning::with_overrides`)
/// so that an ablation runs the scenarios without a rebuild (docs/pressure.md "Ablation").
/// Panics on an override it cannot read: a run that would silently use the defaults would
/// measure nothing.
pub fn tuning() -> &'static shedgate::pressure::Tuning {
    static TUNING: std::sync::OnceLock<&'static shedgate::pressure::Tuning> =
        std::sync::OnceLock::new();
    TUNING.get_or_init(|| {
        let overrides = std::env::var("SHEDGATE_TUNING").unwrap_or_default();
        shedgate::pressure::Tuning::with_overrides(&overrides)
            .unwrap_or_else(|e| panic!("SHEDGATE_TUNING: {e}"))
            .leak()
    })
}

/// [`NOW`] as a date-time, for building event times.
pub fn now_utc() -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(NOW.0 / 1000).unwrap()
}

/// The test proxies' sources: the fixed clock [`NOW`] and the system's random draw.
pub fn sources() -> Sources {
    Sources::system().with_clock(|| NOW)
}

/// What the mock upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    /// The HTTP version the upstream received (the mock speaks HTTP/1.x only).
    pub version: http::Version,
    pub uri: http::Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    /// The proxy's own `OPTIONS *`, sent to read the upstream's clock.
    pub fn is_clock_probe(&self) -> bool {
        self.method == Method::OPTIONS && self.uri == "*"
    }
}

/// How the mock upstream answers.
#[derive(Debug, Clone)]
pub struct Behaviour {
    pub status: StatusCode,
    /// Before the response headers.
    pub delay: Duration,
    /// Between the response headers and the body.
    pub body_delay: Duration,
    /// The upstream's own clock, unix milliseconds, sent as `Date` (RFC 9110 §6.6.1);
    /// `None`: the test proxies' fixed clock [`NOW`], so both sides agree.
    pub clock: Option<Arc<std::sync::atomic::AtomicI64>>,
    /// An ORCA `endpoint-load-metrics` header sent with every answer.
    pub load_report: Option<&'static str>,
    /// Holds each request (clock probes aside), once recorded, until it takes a permit of
    /// this semaphore (then `delay` runs): a test that starts with none holds requests at
    /// the upstream for as long as it needs, and lets them go with `add_permits`, without
    /// racing a timer. `None`: no hold.
    pub hold: Option<Arc<tokio::sync::Semaphore>>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            status: StatusCode::OK,
            delay: Duration::ZERO,
            body_delay: Duration::ZERO,
            clock: None,
            load_report: None,
            hold: None,
        }
    }
}

/// A real HTTP/1.1 server on 127.0.0.1:0 that records every request it receives.
pub struct MockUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Recorded>>>,
    /// TCP connections accepted, and how many of them have closed.
    pub connections: Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
    task: tokio::task::JoinHandle<()>,
}

impl MockUpstream {
    pub async fn start() -> Self {
        Self::with(Behaviour::default()).await
    }

    pub async fn with(behaviour: Behaviour) -> Self {
        Self::listen(TcpListener::bind("127.0.0.1:0").await.unwrap(), behaviour)
    }

    /// An upstream on `addr` (one that stopped there before, say: the bind waits until the
    /// old listener's task has been aborted).
    pub async fn on(addr: SocketAddr) -> Self {
        loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => return Self::listen(listener, Behaviour::default()),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => panic!("bind {addr}: {e}"),
            }
        }
    }

    /// Serves on `listener`; dropping the upstream closes its connections too.
    fn listen(listener: TcpListener, behaviour: Behaviour) -> Self {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let connections = Arc::new((
            std::sync::atomic::AtomicUsize::new(0),
            std::sync::atomic::AtomicUsize::new(0),
        ));
        let counts = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            // The connections' tasks: aborted with this one.
            let mut served = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counts.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let closed = Arc::clone(&counts);
                while served.try_join_next().is_some() {}
                let record = Arc::clone(&record);
                let behaviour = behaviour.clone();
                served.spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let record = Arc::clone(&record);
                        let behaviour = behaviour.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|c| c.to_bytes())
                                .unwrap_or_default();
                            let probe = parts.method == Method::OPTIONS && parts.uri == "*";
                            record.lock().unwrap().push(Recorded {
                                method: parts.method,
                                version: parts.version,
                                uri: parts.uri,
                                headers: parts.headers,
                                body,
                            });
                            if let (Some(hold), false) = (&behaviour.hold, probe) {
                                hold.acquire().await.unwrap().forget();
                            }
                            tokio::time::sleep(behaviour.delay).await;
                            let mut r = Response::new(DelayedBody {
                                sleep: Box::pin(tokio::time::sleep(behaviour.body_delay)),
                                data: Some(Bytes::from_static(b"{\"ok\":true}")),
                            });
                            *r.status_mut() = behaviour.status;
                            r.headers_mut()
                                .insert("content-type", "application/json".parse().unwrap());
                            let ms = behaviour
                                .clock
                                .as_ref()
                                .map_or(NOW.0, |c| c.load(std::sync::atomic::Ordering::SeqCst));
                            let date = std::time::UNIX_EPOCH
                                + Duration::from_millis(u64::try_from(ms).unwrap());
                            r.headers_mut()
                                .insert("date", httpdate::fmt_http_date(date).parse().unwrap());
                            if let Some(report) = behaviour.load_report {
                                r.headers_mut().insert(
                                    "endpoint-load-metrics",
                                    http::HeaderValue::from_static(report),
                                );
                            }
                            Ok::<_, std::convert::Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                    closed.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        MockUpstream {
            addr,
            seen,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// TCP connections the upstream has accepted, and how many of them are still open.
    pub fn connections(&self) -> (usize, usize) {
        let accepted = self.connections.0.load(std::sync::atomic::Ordering::SeqCst);
        let closed = self.connections.1.load(std::sync::atomic::Ordering::SeqCst);
        (accepted, accepted - closed)
    }

    /// Requests forwarded to the upstream: everything it received but the proxy's own
    /// clock probes (`OPTIONS *`, see `clock.rs`).
    pub fn count(&self) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| !r.is_clock_probe())
            .count()
    }

    /// The last forwarded request (clock probes aside).
    pub fn last(&self) -> Recorded {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|r| !r.is_clock_probe())
            .cloned()
            .expect("the upstream saw no request")
    }
}

/// A body whose single chunk arrives after a delay (no Content-Length: sent chunked).
pub struct DelayedBody {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    data: Option<Bytes>,
}

impl http_body::Body for DelayedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::future::Future;
        if self.sleep.as_mut().poll(cx).is_pending() {
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(self.data.take().map(|d| Ok(hyper::body::Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A policy directory in a temporary folder.
pub struct PolicyDir {
    pub dir: tempfile::TempDir,
}

impl PolicyDir {
    pub fn new(streams: &str, areas: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("streams.toml"), streams).unwrap();
        if let Some(areas) = areas {
            std::fs::write(dir.path().join("areas.toml"), areas).unwrap();
        }
        PolicyDir { dir }
    }

    /// The seed's six streams, Berlin's resolution-4 cell at rank 5, default rank 50.
    pub fn seed() -> Self {
        Self::new(SEED_STREAMS, Some(BERLIN_AREA))
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

pub const SEED_STREAMS: &str = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
[streams."sensor.reading"]
supersession = "self-superseding"
[streams."tile.render"]
supersession = "self-superseding"
[streams."feature.boundary_edit"]
supersession = "never"
[streams."geofence.transition"]
supersession = "never"
[streams."dlq.replay"]
supersession = "never"
"#;

pub const BERLIN_AREA: &str = r#"
default_rank = 50
[[areas]]
name = "berlin"
rank = 5
cells = ["841f1d5ffffffff"]
"#;

pub const BERLIN: (f64, f64) = (52.52, 13.4049);
pub const MUNICH: (f64, f64) = (48.1372, 11.5756);

/// The repository's `policies/examples/cases` directory.
pub fn cases_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/examples/cases")
}

/// A recording upstream and a proxy with the seed policy in front of it (keep the policy
/// directory alive as long as the proxy).
pub async fn seeded() -> (MockUpstream, PolicyDir, Running) {
    seeded_with(Behaviour::default(), |_| {}).await
}

/// As [`seeded`], with the upstream answering as `behaviour` and the proxy's settings
/// tweaked.
pub async fn seeded_with(
    behaviour: Behaviour,
    tweak: impl FnOnce(&mut ServeArgs),
) -> (MockUpstream, PolicyDir, Running) {
    let upstream = MockUpstream::with(behaviour).await;
    let policy = PolicyDir::seed();
    let proxy = spawn_proxy_with(&upstream.url(), policy.path(), tweak).await;
    (upstream, policy, proxy)
}

/// A proxy in front of `upstream` with the policy in `policies`.
pub async fn spawn_proxy(upstream: &str, policies: &Path) -> Running {
    spawn_proxy_with(upstream, policies, |_| {}).await
}

pub async fn spawn_proxy_with(
    upstream: &str,
    policies: &Path,
    tweak: impl FnOnce(&mut ServeArgs),
) -> Running {
    let mut args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.to_owned()),
        policies: Some(policies.to_owned()),
        ..ServeArgs::default()
    };
    tweak(&mut args);
    let config = Config::from_args(args).expect("valid test config");
    shedgate::app::start(config, sources())
        .await
        .expect("proxy starts")
        .0
}

pub type TestClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response with its body read.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub async fn send(req: Request<Full<Bytes>>) -> Answer {
    let resp = client().request(req).await.expect("request completes");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// POSTs `body` with `X-Stream: stream` to the proxy.
pub async fn post(proxy: &Running, stream: &str, body: impl Into<Bytes>) -> Answer {
    let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .header("x-stream", stream)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap();
    send(req).await
}

/// An event body at `(lat, lon)`, `age_secs` old.
pub fn event(at: (f64, f64), age_secs: i64) -> String {
    let t = now_utc() - time::Duration::seconds(age_secs);
    let t = t
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    format!(
        r#"{{"device_id":"veh-1","lat":{},"lon":{},"occurred_at":"{t}"}}"#,
        at.0, at.1
    )
}

/// Pins pressure through the admin listener's `PUT /pressure`.
pub async fn pin(proxy: &Running, pressure: f64) {
    let req = Request::put(format!("http://{}/pressure", proxy.admin_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"pin\":{pressure}}}"))))
        .unwrap();
    let a = send(req).await;
    assert_eq!(a.status, StatusCode::OK, "pin failed: {:?}", a.body);
}

/// `GET` on the admin listener.
pub async fn admin_get(proxy: &Running, path: &str) -> Answer {
    let req = Request::get(format!("http://{}{path}", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(req).await
}

/// The Prometheus exposition text.
pub async fn scrape(proxy: &Running) -> String {
    let a = admin_get(proxy, "/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    String::from_utf8(a.body.to_vec()).unwrap()
}

/// `shedgate_proxy_errors_total{kind}` in a scrape.
pub fn proxy_errors(text: &str, kind: &str) -> f64 {
    metric(text, "shedgate_proxy_errors_total", &[("kind", kind)])
}

/// The value of the series `name{labels}` where every `k="v"` in `labels` matches; 0 if
/// absent.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An address nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// Reads one response head (up to the blank line) from a raw connection and returns it;
/// panics on EOF.
pub async fn read_head(tcp: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tcp.read(&mut byte).await.unwrap();
        assert!(n == 1, "EOF after {:?}", String::from_utf8_lossy(&buf));
        buf.push(byte[0]);
    }
    String::from_utf8(buf).unwrap()
}

pub use super::processes::*;

/// Runs `inside` in a network namespace of its own: the test (its exact `name`) runs itself
/// again under `unshare -n` with `SHEDGATE_IN_NETNS` set, and there `inside` runs. When
/// `probe` (a command run under `unshare -n`) fails, for want of root or iproute2, the test
/// says so on stderr and passes, unless `SHEDGATE_REQUIRE_NETNS` is set (`.ci/run` sets it).
pub fn in_own_network_namespace(name: &str, probe: &[&str], inside: impl FnOnce()) {
    use std::process::Command;
    if std::env::var_os("SHEDGATE_IN_NETNS").is_some() {
        return inside();
    }
    let usable = Command::new("unshare")
        .args(["-n", "--"])
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !usable {
        let why = format!(
            "`unshare -n` with `{}` is not usable here (needs root and iproute2)",
            probe[0]
        );
        assert!(
            std::env::var_os("SHEDGATE_REQUIRE_NETNS").is_none(),
            "{why}, and SHEDGATE_REQUIRE_NETNS is set"
        );
        eprintln!("SKIPPED {name}: {why}");
        return;
    }
    let out = Command::new("unshare")
        .args(["-n", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("SHEDGATE_IN_NETNS", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "in the namespace:\n{text}");
    assert!(text.contains("1 passed"), "the test did not run:\n{text}");
}

/// Runs a command to its end and asserts that it succeeded (`args[0]` is the program).
pub fn run_ok(args: &[&str]) {
    let s = std::process::Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap();
    assert!(s.success(), "{args:?}: {s}");
}

/// A proxy started with `args` whose clock reads `now` (unix milliseconds, an atomic the test
/// advances) plus `error_ms`.
pub async fn start_with_clock(
    args: ServeArgs,
    now: &Arc<std::sync::atomic::AtomicI64>,
    error_ms: i64,
) -> Running {
    let clock = Arc::clone(now);
    let sources = Sources::system()
        .with_clock(move || UnixMillis(clock.load(std::sync::atomic::Ordering::SeqCst) + error_ms));
    shedgate::app::start(Config::from_args(args).unwrap(), sources)
        .await
        .unwrap()
        .0
}
