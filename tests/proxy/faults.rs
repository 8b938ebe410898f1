//! Ack ⇒ delivered under faults: never-shed events with unique ids go through shedgate while
//! the upstream is killed and restarted, resets connections mid-response and closes idle
//! pooled connections, the policy is reloaded every 100 ms (every other file broken), and
//! shedgate itself is stopped (lame duck, drain) and restarted on the same port, as a rolling
//! restart does. Every event shedgate answered 2xx must have reached the upstream; whatever
//! did not reach it must have been answered non-2xx or with a connection error, so that the
//! sender knows to retry.
//!
//! With upstream churn, the good reloads also add an upstream the events go to and remove it
//! again, under load.
//!
//! One harness for two sizes: `tests/proxy` runs [`CI_REQUESTS`]; `cargo bench --bench
//! faults` includes this file and runs at least a million (docs/benchmark-history.md).

#![allow(dead_code, reason = "the bench uses the harness, not the test")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use shedgate::clock::Sources;
use shedgate::config::{Config, HumanDelay, ServeArgs};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Requests in the CI run.
pub(crate) const CI_REQUESTS: u64 = 20_000;

/// The never-shed stream every event is sent on.
const STREAM: &str = "geofence.transition";
const GOOD_POLICY: &str = "[streams.\"geofence.transition\"]\nsupersession = \"never\"\n\
                           [streams.\"vehicle.position\"]\nsupersession = \"self-superseding\"\n";
/// Every other reload: not TOML at all.
const BROKEN_POLICY: &str = "[streams.\"geofence.transition\"\nsupersession = ";

/// With upstream churn ([`run`]'s `churn`), every other good reload: [`GOOD_POLICY`] with
/// the events sent to an upstream named `second` at the same address (`url`), so the next
/// good reload removes it while requests to it are in flight.
fn second_upstream_policy(url: &str) -> String {
    format!(
        "{}[upstreams.second]\nurl = \"{url}\"\n",
        GOOD_POLICY.replacen(
            "supersession = \"never\"\n",
            "supersession = \"never\"\nupstream = \"second\"\n",
            1
        )
    )
}

/// What a run found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Requests sent.
    pub requests: u64,
    /// Answered 2xx, body read whole.
    pub acked: u64,
    /// Answered otherwise, or a connection error.
    pub not_acked: u64,
    /// Events the upstream received (each id once).
    pub delivered: u64,
    /// Acknowledged but never received: must be 0.
    pub acked_not_delivered: u64,
    /// Upstream kills (each followed by a restart).
    pub upstream_restarts: u64,
    /// Upstream responses cut by a reset after the first bytes.
    pub resets: u64,
    /// shedgate stops (SIGTERM's path: lame duck, drain) and restarts.
    pub proxy_restarts: u64,
    /// Policy reloads written, and how many of them were broken files.
    pub reloads: u64,
    /// Of [`Report::reloads`], broken files.
    pub broken_reloads: u64,
    /// Of [`Report::reloads`], ones that added or removed an upstream (upstream churn).
    pub upstream_changes: u64,
    /// In-flight requests at the last shedgate after the run: must be 0.
    pub inflight_after: u32,
    /// Panics on the harness's threads: must be 0.
    pub panics: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests in {:.1} s: {} acknowledged, {} not ({} delivered); acknowledged and \
             not delivered: {}. Faults: {} upstream kills, {} mid-response resets, {} shedgate \
             restarts, {} policy reloads ({} broken, {} adding or removing an upstream). In \
             flight after: {}; panics: {}",
            self.requests,
            self.elapsed.as_secs_f64(),
            self.acked,
            self.not_acked,
            self.delivered,
            self.acked_not_delivered,
            self.upstream_restarts,
            self.resets,
            self.proxy_restarts,
            self.reloads,
            self.broken_reloads,
            self.upstream_changes,
            self.inflight_after,
            self.panics
        )
    }
}

static PANICS: AtomicU64 = AtomicU64::new(0);

/// Counts panics on threads named `faults-*` (the runtime [`runtime`] builds), then calls the
/// previous hook.
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("faults-"))
            {
                PANICS.fetch_add(1, Ordering::Relaxed);
            }
            previous(info);
        }));
    });
}

/// The runtime a run uses: multi-threaded, threads named `faults-worker`.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    count_panics();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("faults-worker")
        .enable_all()
        .build()
        .unwrap()
}

/// The upstream: records each event id it has read whole, then answers 200 — except that
/// every `reset_every`-th answer is cut by a TCP reset after its first bytes. It closes
/// pooled connections idle for 300 ms (below shedgate's 4 s pool timeout, so the two race),
/// and can be killed and restarted on the same address.
struct Upstream {
    addr: SocketAddr,
    received: Arc<Vec<AtomicBool>>,
    resets: Arc<AtomicU64>,
    answers: Arc<AtomicU64>,
    reset_every: u64,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Upstream {
    async fn start(events: u64, reset_every: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut up = Upstream {
            addr: listener.local_addr().unwrap(),
            received: Arc::new((0..events).map(|_| AtomicBool::new(false)).collect()),
            resets: Arc::new(AtomicU64::new(0)),
            answers: Arc::new(AtomicU64::new(0)),
            reset_every,
            task: None,
        };
        up.serve(listener);
        up
    }

    fn serve(&mut self, listener: TcpListener) {
        let received = Arc::clone(&self.received);
        let resets = Arc::clone(&self.resets);
        let answers = Arc::clone(&self.answers);
        let reset_every = self.reset_every;
        self.task = Some(tokio::spawn(async move {
            // Dropping this task drops the set, which aborts every connection: a kill.
            let mut conns = JoinSet::new();
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    Some(_) = conns.join_next(), if !conns.is_empty() => continue,
                };
                let Ok((stream, _)) = accepted else { continue };
                let reset = Arc::new(AtomicBool::new(false));
                let io = ResetIo {
                    io: TokioIo::new(stream),
                    reset: Arc::clone(&reset),
                };
                let (received, resets, answers) = (
                    Arc::clone(&received),
                    Arc::clone(&resets),
                    Arc::clone(&answers),
                );
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (received, resets, answers, reset) = (
                        Arc::clone(&received),
                        Arc::clone(&resets),
                        Arc::clone(&answers),
                        Arc::clone(&reset),
                    );
                    async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        if let Some(id) = event_id(&body) {
                            if let Some(seen) = received.get(usize::try_from(id).unwrap()) {
                                seen.store(true, Ordering::SeqCst);
                            }
                            let n = answers.fetch_add(1, Ordering::Relaxed) + 1;
                            if n.is_multiple_of(reset_every) {
                                resets.fetch_add(1, Ordering::Relaxed);
                                reset.store(true, Ordering::SeqCst);
                            }
                        }
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                    }
                });
                conns.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_millis(300))
                        .serve_connection(io, svc)
                        .await;
                });
            }
        }));
    }

    /// Kills the upstream (listener and every connection), waits `down`, and restarts it on
    /// the same address.
    async fn restart(&mut self, down: Duration) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        tokio::time::sleep(down).await;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        self.serve(listener);
    }
}

/// `{"id":N,...}` → N.
fn event_id(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?;
    let rest = text.strip_prefix("{\"id\":")?;
    rest[..rest.find(',')?].parse().ok()
}

/// An upstream connection's IO that, once its flag is set, writes the first 12 bytes of the
/// next write and then resets the connection (`SO_LINGER` 0 and an error, so hyper drops it).
struct ResetIo {
    io: TokioIo<TcpStream>,
    reset: Arc<AtomicBool>,
}

impl hyper::rt::Read for ResetIo {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for ResetIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.reset.load(Ordering::SeqCst) {
            let head = &buf[..buf.len().min(12)];
            let _ = std::pin::Pin::new(&mut this.io).poll_write(cx, head);
            let _ = this.io.inner().set_zero_linger();
            return std::task::Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        std::pin::Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Starts shedgate on `listen` (port 0 the first time) in front of `upstream`.
async fn start_proxy(
    listen: SocketAddr,
    upstream: SocketAddr,
    policies: &std::path::Path,
) -> shedgate::app::Running {
    let config = Config::from_args(ServeArgs {
        listen: Some(listen),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(format!("http://{upstream}")),
        policies: Some(policies.to_owned()),
        shutdown_delay: Some(HumanDelay(Duration::from_millis(100))),
        drain_timeout: Some(Duration::from_secs(1).into()),
        upstream_timeout: Some(Duration::from_secs(2).into()),
        policy_recheck: Some(Duration::from_millis(100).into()),
        ..ServeArgs::default()
    })
    .unwrap();
    loop {
        match shedgate::app::start(config.clone(), Sources::default()).await {
            Ok((running, _)) => return running,
            // The previous instance's port is not free yet.
            Err(shedgate::app::StartError::Bind { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Sends `requests` events with `workers` concurrent senders while the faults run; returns
/// what it found. With `churn`, every other good reload adds an upstream the events go to
/// (at the same address) and the next removes it, under load.
pub(crate) async fn run(requests: u64, workers: usize, churn: bool) -> Report {
    let started = tokio::time::Instant::now();
    let policies = tempfile::tempdir().unwrap();
    let streams = policies.path().join("streams.toml");
    std::fs::write(&streams, GOOD_POLICY).unwrap();
    let mut upstream = Upstream::start(requests, 97).await;
    let first = start_proxy(
        "127.0.0.1:0".parse().unwrap(),
        upstream.addr,
        policies.path(),
    )
    .await;
    let proxy_addr = first.proxy_addr;
    let proxy = Arc::new(tokio::sync::Mutex::new(Some(first)));
    let acked: Arc<Vec<AtomicBool>> =
        Arc::new((0..requests).map(|_| AtomicBool::new(false)).collect());
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Whether shedgate and the upstream have each been restarted once. From half-way the
    // senders wait for both: the faults are timed (every 2 s and every second), and a fast
    // machine or a release build sent the CI size's 20,000 requests in 1.4 s, before either,
    // so the run checked nothing of them.
    let restarted: Arc<[AtomicBool; 2]> =
        Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);

    let mut senders = JoinSet::new();
    for _ in 0..workers {
        let (acked, next) = (Arc::clone(&acked), Arc::clone(&next));
        let restarted = Arc::clone(&restarted);
        senders.spawn(async move {
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build_http();
            let url = format!("http://{proxy_addr}/ingest");
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id >= requests {
                    return;
                }
                while id >= requests / 2 && !restarted.iter().all(|r| r.load(Ordering::SeqCst)) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let body = format!(
                    "{{\"id\":{id},\"lat\":52.52,\"lon\":13.40,\"fence\":\"f-{}\"}}",
                    id % 100
                );
                let req = Request::post(&url)
                    .header("x-stream", STREAM)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let answered = tokio::time::timeout(Duration::from_secs(10), async {
                    let resp = client.request(req).await.ok()?;
                    let ok = resp.status().is_success();
                    // A 2xx counts only with its body read whole.
                    resp.into_body().collect().await.ok()?;
                    Some(ok)
                })
                .await;
                if matches!(answered, Ok(Some(true))) {
                    acked[usize::try_from(id).unwrap()].store(true, Ordering::SeqCst);
                }
            }
        });
    }

    // The faults: a policy reload every 100 ms (every other one broken), and shedgate stopped
    // and restarted every 2 s; the upstream is killed for 200 ms every second below.
    let faults = {
        let (proxy, done) = (Arc::clone(&proxy), Arc::clone(&done));
        let restarted = Arc::clone(&restarted);
        let upstream_addr = upstream.addr;
        let dir = policies.path().to_owned();
        tokio::spawn(async move {
            let mut report = Report::default();
            let mut tick = 0u64;
            while !done.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tick += 1;
                let broken = tick.is_multiple_of(2);
                // With churn, the good reloads take turns: `second` added, then removed.
                let second = churn && tick % 4 == 1;
                let text = if broken {
                    BROKEN_POLICY.to_owned()
                } else if second {
                    second_upstream_policy(&format!("http://{upstream_addr}"))
                } else {
                    format!("{GOOD_POLICY}# reload {tick}\n")
                };
                std::fs::write(dir.join("streams.toml"), text).unwrap();
                report.reloads += 1;
                report.broken_reloads += u64::from(broken);
                // With churn, each good reload adds `second` or removes it.
                report.upstream_changes += u64::from(churn && !broken);
                if tick.is_multiple_of(20) {
                    // A rolling restart of shedgate: SIGTERM's path, then a new process on
                    // the same port. A good policy file first, so that it can start.
                    std::fs::write(dir.join("streams.toml"), GOOD_POLICY).unwrap();
                    if let Some(running) = proxy.lock().await.take() {
                        running.stop().await;
                    }
                    let next = start_proxy(proxy_addr, upstream_addr, &dir).await;
                    *proxy.lock().await = Some(next);
                    report.proxy_restarts += 1;
                    restarted[0].store(true, Ordering::SeqCst);
                }
            }
            report
        })
    };

    // The upstream restarts, driven here because this task owns the upstream.
    let mut restarts = 0u64;
    let mut last_restart = tokio::time::Instant::now();
    while !senders.is_empty() {
        tokio::select! {
            _ = senders.join_next() => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                if last_restart.elapsed() >= Duration::from_secs(1) {
                    upstream.restart(Duration::from_millis(200)).await;
                    restarts += 1;
                    restarted[1].store(true, Ordering::SeqCst);
                    last_restart = tokio::time::Instant::now();
                }
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    let mut report = faults.await.unwrap();
    report.upstream_restarts = restarts;

    let running = proxy.lock().await.take().unwrap();
    // In-flight accounting settles once the last response bodies have ended.
    for _ in 0..100 {
        if running.parts.pressure.inflight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.inflight_after = running.parts.pressure.inflight();
    running.shutdown().await;

    report.requests = requests;
    report.resets = upstream.resets.load(Ordering::Relaxed);
    for (a, r) in acked.iter().zip(upstream.received.iter()) {
        let (a, r) = (a.load(Ordering::SeqCst), r.load(Ordering::SeqCst));
        report.acked += u64::from(a);
        report.delivered += u64::from(r);
        report.acked_not_delivered += u64::from(a && !r);
    }
    report.not_acked = requests - report.acked;
    report.panics = PANICS.load(Ordering::Relaxed);
    report.elapsed = started.elapsed();
    report
}

/// The CI size: every acknowledged event delivered, every fault injected at least once, no
/// panic, nothing left in flight.
#[test]
fn acknowledged_means_delivered_under_faults() {
    let report = runtime().block_on(run(CI_REQUESTS, 16, false));
    eprintln!("{report}");
    assert_eq!(report.acked_not_delivered, 0, "{report}");
    assert_eq!(report.panics, 0, "{report}");
    assert_eq!(report.inflight_after, 0, "{report}");
    assert!(report.upstream_restarts >= 1, "{report}");
    assert!(report.proxy_restarts >= 1, "{report}");
    assert!(report.resets >= 1, "{report}");
    assert!(report.broken_reloads >= 1, "{report}");
    // Faults cost acknowledgements (a dead upstream fails requests fast), not nearly all.
    assert!(report.acked > report.requests / 4, "{report}");
}

/// The CI size with upstream churn: every other good reload adds an upstream the events go
/// to, the next removes it while requests to it are in flight; still every acknowledged
/// event delivered.
#[test]
fn acknowledged_means_delivered_while_reloads_add_and_remove_an_upstream() {
    let report = runtime().block_on(run(CI_REQUESTS, 16, true));
    eprintln!("{report}");
    assert_eq!(report.acked_not_delivered, 0, "{report}");
    assert_eq!(report.panics, 0, "{report}");
    assert_eq!(report.inflight_after, 0, "{report}");
    assert!(report.upstream_changes >= 2, "{report}");
    assert!(report.acked > report.requests / 4, "{report}");
}
