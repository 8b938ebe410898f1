//! The proxy's own memory in closed loop: 2,000 slow senders of 512 KiB bodies against a
//! 16 MiB budget of buffered body bytes (`--max-buffered-bytes`). The release path runs as
//! its own process, so that its peak RSS (`VmHWM`) is its own: it must stay under the
//! budget plus a fixed overhead, far below the gigabyte the bodies add up to; sheddable
//! senders over the budget get 503 `memory`; and every `never` event, which streams through
//! unbuffered, is delivered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

const SENDERS: u64 = 2_000;
/// One in ten senders sends a `never` event.
const NEVER_EVERY: u64 = 10;
const BODY: usize = 512 * 1024;
const BUDGET: u64 = 16 * 1024 * 1024;
/// The process without any body: runtime, policy, metrics, 2,000 connections' buffers and
/// the allocator's slack (measured: 113 MiB peak in all with the 16 MiB budget; 1,007 MiB
/// without a budget).
const OVERHEAD: u64 = 128 * 1024 * 1024;

/// An upstream that reads each body whole, counts `never` events by id, and answers 200.
async fn counting_upstream() -> (std::net::SocketAddr, Arc<Vec<AtomicU64>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Vec<AtomicU64>> = Arc::new((0..SENDERS).map(|_| AtomicU64::new(0)).collect());
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let record = Arc::clone(&record);
                    async move {
                        let never = req
                            .headers()
                            .get("x-stream")
                            .is_some_and(|v| v == "geofence.transition");
                        let body = req.into_body().collect().await?.to_bytes();
                        if never && let Some(id) = id_of(&body) {
                            record[usize::try_from(id).unwrap()].fetch_add(1, Ordering::SeqCst);
                        }
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn id_of(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body.get(..32)?).ok()?;
    let rest = text.strip_prefix("{\"id\":")?;
    rest[..rest.find(',')?].parse().ok()
}

/// One slow sender: the head, then the body in eight pieces 20 ms apart, then the answer's
/// status (0: no answer). A 503 must say `X-Shed-Reason: memory` and carry `Retry-After`.
async fn slow_send(proxy: std::net::SocketAddr, id: u64) -> u16 {
    let never = id.is_multiple_of(NEVER_EVERY);
    let stream = if never {
        "geofence.transition"
    } else {
        "vehicle.position"
    };
    let head =
        format!("{{\"id\":{id},\"lat\":52.52,\"lon\":13.40,\"device_id\":\"veh-{id}\",\"pad\":\"");
    let mut body = head.into_bytes();
    body.resize(BODY - 2, b'x');
    body.extend_from_slice(b"\"}");
    let Ok(mut tcp) = TcpStream::connect(proxy).await else {
        return 0;
    };
    let request = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: {stream}\r\nContent-Type: \
         application/json\r\nContent-Length: {BODY}\r\nConnection: close\r\n\r\n"
    );
    if tcp.write_all(request.as_bytes()).await.is_err() {
        return 0;
    }
    for piece in body.chunks(BODY / 8) {
        // An early answer (503) may close the read side: keep the status anyway.
        if tcp.write_all(piece).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), tcp.read_to_end(&mut answer)).await;
    let status = std::str::from_utf8(answer.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if status == 503 {
        let text = String::from_utf8_lossy(&answer);
        assert!(text.contains("x-shed-reason: memory"), "{text}");
        assert!(text.contains("retry-after: "), "{text}");
    }
    status
}

fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_senders_cannot_hold_more_than_the_buffer_budget() {
    let (upstream, delivered) = counting_upstream().await;
    let policy = PolicyDir::seed();
    let free_port = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (proxy_addr, admin_addr) = (free_port(), free_port());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .args(["serve", "--listen", &proxy_addr.to_string()])
        .args(["--admin-listen", &admin_addr.to_string()])
        .args(["--upstream", &format!("http://{upstream}")])
        .arg("--policies")
        .arg(policy.path())
        .args(["--max-buffered-bytes", &BUDGET.to_string()])
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until it accepts.
    let mut up = false;
    for _ in 0..500 {
        if TcpStream::connect(proxy_addr).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(up, "the proxy did not start");
    // Pressure pinned at 0: this test is about the buffer budget alone. (2,000 slow senders
    // are 2,000 requests in flight for seconds, which the controller would rightly read as a
    // queue and shed on pressure too.)
    // Both listeners are bound before either serves.
    let req = Request::put(format!("http://{admin_addr}/pressure"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"pin\": 0.0}")))
        .unwrap();
    let pinned = send(req).await;
    assert!(pinned.status.is_success(), "{pinned:?}");

    let mut senders = tokio::task::JoinSet::new();
    for id in 0..SENDERS {
        senders.spawn(async move { (id, slow_send(proxy_addr, id).await) });
    }
    let (mut forwarded, mut memory_shed, mut other) = (0u64, 0u64, Vec::new());
    let mut never_answered = Vec::new();
    while let Some(done) = senders.join_next().await {
        let (id, status) = done.unwrap();
        if id.is_multiple_of(NEVER_EVERY) {
            never_answered.push((id, status));
            continue;
        }
        match status {
            200 => forwarded += 1,
            503 => memory_shed += 1,
            s => other.push(s),
        }
    }
    let peak = peak_rss(child.id());
    child.kill().unwrap();
    let _ = child.wait();
    eprintln!(
        "{SENDERS} senders of {BODY} B, budget {BUDGET} B: {forwarded} sheddable forwarded, \
         {memory_shed} shed (memory), peak RSS {} MiB",
        peak / (1024 * 1024)
    );
    assert!(other.is_empty(), "unexpected answers: {other:?}");
    assert!(memory_shed > 0, "the budget never ran out");
    assert!(forwarded > 0, "nothing was admitted");
    for (id, status) in never_answered {
        assert_eq!(status, 200, "never event {id}");
        assert_eq!(
            delivered[usize::try_from(id).unwrap()].load(Ordering::SeqCst),
            1
        );
    }
    assert!(
        peak < BUDGET + OVERHEAD,
        "peak RSS {peak} B over the budget {BUDGET} B + {OVERHEAD} B"
    );
}

/// The per-upstream budget's world: `--max-buffered-bytes` of [`SMALL`] split between
/// `default` (`sensor.reading`) and `slow` (`vehicle.position`, an upstream that takes
/// [`SLOW`] to answer, so the bodies bound for it stay held), both of capacity 100
/// (`--max-inflight`): shares of half each. `/mixed` names its stream in the body and no
/// upstream. Pressure is pinned at 0 on both: only memory sheds here.
struct TwoShares {
    default: MockUpstream,
    slow: MockUpstream,
    _policy: PolicyDir,
    proxy: shedgate::app::Running,
}

const SMALL: u64 = 40_000;
const PIECE: usize = 4_000;
const SLOW: Duration = Duration::from_secs(20);

async fn two_shares() -> TwoShares {
    let default = MockUpstream::start().await;
    let slow = MockUpstream::with(Behaviour {
        delay: SLOW,
        ..Behaviour::default()
    })
    .await;
    let streams = format!(
        "{}\n[upstreams.slow]\nurl = \"{}\"\n\n[[routes]]\nprefix = \"/mixed\"\nstream_field = \"/kind\"\n",
        SEED_STREAMS.replace(
            "[streams.\"vehicle.position\"]\n",
            "[streams.\"vehicle.position\"]\nupstream = \"slow\"\n",
        ),
        slow.url()
    );
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy_with(&default.url(), policy.path(), |a| {
        a.max_buffered_bytes = Some(SMALL);
        a.max_body = Some(SMALL);
        a.max_inflight = Some(100);
    })
    .await;
    for upstream in ["default", "slow"] {
        let req = Request::put(format!(
            "http://{}/pressure?upstream={upstream}",
            proxy.admin_addr
        ))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"pin\": 0.0}")))
        .unwrap();
        assert!(send(req).await.status.is_success());
    }
    TwoShares {
        default,
        slow,
        _policy: policy,
        proxy,
    }
}

/// An event of exactly [`PIECE`] bytes, of `kind` when given (for `/mixed`).
fn piece(kind: Option<&str>) -> Bytes {
    let head = match kind {
        Some(kind) => {
            format!(r#"{{"kind":"{kind}","device_id":"veh-1","lat":48.1,"lon":11.5,"pad":""#)
        }
        None => r#"{"device_id":"veh-1","lat":48.1,"lon":11.5,"pad":""#.to_owned(),
    };
    let mut body = head.into_bytes();
    body.resize(PIECE - 2, b'x');
    body.extend_from_slice(b"\"}");
    Bytes::from(body)
}

impl TwoShares {
    fn request(&self, path: &str, stream: Option<&str>, body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::post(format!("http://{}{path}", self.proxy.proxy_addr))
            .header("content-type", "application/json");
        if let Some(stream) = stream {
            req = req.header("x-stream", stream);
        }
        req.body(Full::new(body)).unwrap()
    }

    /// Sends `n` requests of `stream` to `slow` at once; returns their tasks once every one
    /// is either held by `slow` or answered (the answered ones' statuses and shed reasons).
    async fn hold_at_slow(
        &self,
        n: usize,
    ) -> (
        tokio::task::JoinSet<Answer>,
        Vec<(StatusCode, Option<String>)>,
    ) {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let req = self.request("/ingest", Some("vehicle.position"), piece(None));
            tasks.spawn(send(req));
        }
        let mut answered = Vec::new();
        while self.slow.count() + answered.len() < n {
            tokio::select! {
                Some(done) = tasks.join_next() => {
                    let a = done.unwrap();
                    answered.push((a.status, a.header("x-shed-reason").map(str::to_owned)));
                }
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        (tasks, answered)
    }

    fn slow_id(&self) -> shedgate::proxy::Charge {
        let table = self.proxy.parts.upstreams.table();
        shedgate::proxy::Charge::Upstream(table.named("slow").unwrap().account.index())
    }
}

/// Bodies held for a slow upstream take its share, and borrow only what no busy upstream's
/// share claims: the busy upstream's requests within its share are never shed for memory,
/// and the process total is never exceeded. (Three shares of a third: `default`, `slow`,
/// and the bodies of `/mixed`, whose upstream is known only once read; that one is idle, so
/// lent.)
#[tokio::test]
async fn a_slow_upstreams_bodies_cannot_take_a_busy_upstreams_share() {
    let t = two_shares().await;
    let buffers = &t.proxy.parts.buffers;
    let share = SMALL / 3;
    assert_eq!(buffers.share_of(t.slow_id()), share);
    // `default` is busy: its share is claimed.
    let first = send(t.request("/ingest", Some("sensor.reading"), piece(None))).await;
    assert_eq!(first.status, StatusCode::OK);
    // Ten bodies for `slow`: it holds its share and the idle third, the rest are shed.
    let held = usize::try_from((SMALL - share) / PIECE as u64).unwrap();
    let (_held, answered) = t.hold_at_slow(10).await;
    assert_eq!(t.slow.count(), held, "{answered:?}");
    assert_eq!(answered.len(), 10 - held);
    for (status, reason) in &answered {
        assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reason.as_deref(), Some("memory"));
    }
    assert_eq!(buffers.used_by(t.slow_id()), (held * PIECE) as u64);
    // `default` reads up to its share all the while: as many at once as fit, none shed.
    let within = usize::try_from(share / PIECE as u64).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..within {
        tasks.spawn(send(t.request(
            "/ingest",
            Some("sensor.reading"),
            piece(None),
        )));
    }
    while let Some(done) = tasks.join_next().await {
        let a = done.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.header("x-shed-reason"));
        assert!(buffers.used() <= SMALL);
    }
    assert_eq!(t.default.count(), 1 + within);
    assert!(buffers.used() <= SMALL);
}

/// An upstream alone borrows the whole budget; a body whose stream is in the body, on a
/// route that names no upstream, is shed for memory when nothing is left, counted with
/// `upstream="none"` and offered to no upstream's controller.
#[tokio::test]
async fn one_upstream_alone_uses_the_whole_budget_and_an_unrouted_shed_counts_at_none() {
    let t = two_shares().await;
    let buffers = &t.proxy.parts.buffers;
    let (_held, answered) = t.hold_at_slow(10).await;
    assert!(answered.is_empty(), "{answered:?}");
    assert_eq!(t.slow.count(), 10);
    assert_eq!(buffers.used_by(t.slow_id()), SMALL);
    assert_eq!(buffers.used(), SMALL);
    let upstreams = t.proxy.parts.upstreams.table();
    let arrivals = |name: &str| upstreams.named(name).unwrap().pressure.arrivals();
    let (default_before, slow_before) = (arrivals("default"), arrivals("slow"));
    // Its stream would send it to `slow`, but that is known only once it is read.
    let shed = send(t.request("/mixed", None, piece(Some("vehicle.position")))).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.header("x-shed-reason"), Some("memory"));
    assert_eq!(shed.json()["upstream"], "none", "{:?}", shed.json());
    assert_eq!(arrivals("default"), default_before, "no arrival on default");
    assert_eq!(arrivals("slow"), slow_before);
    let text = scrape(&t.proxy).await;
    let requests = |upstream| {
        metric(
            &text,
            "shedgate_requests_total",
            &[("outcome", "shed"), ("upstream", upstream)],
        )
    };
    assert_eq!(requests("none"), 1.0, "{text}");
    assert_eq!(requests("default"), 0.0);
    assert_eq!(t.default.count(), 0);
    assert!(buffers.used() <= SMALL);
}
