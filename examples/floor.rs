//! The floor: a bare forwarder built from the same libraries as shedgate (tokio's
//! multi-thread runtime, hyper's HTTP/1 server, jemalloc) and shedgate's own upstream
//! connection pool (`shedgate::upstream::pool`, on hyper's `client::conn`), with none of
//! shedgate's other work: no admission decision, no framing guard, no timeouts but hyper's
//! wait for a head, no metrics, and no header hygiene (it forwards every header as it came,
//! hop-by-hop ones included, which RFC 9110 section 7.6.1 forbids a proxy: it is a measuring
//! tool, not a proxy to run).
//!
//! It sets the two hyper settings shedgate sets by default and nothing else, so that it is
//! like for like: header names keep their case on both legs (hyper's `preserve_header_case`
//! on the server, and on the upstream pool with title case for names without a recorded
//! case, as `--upstream-header-case preserve` does, `upstream::HeaderCase::Preserve`), and
//! hyper's header read timeout on its timer, at shedgate's default `--idle-timeout` (75 s:
//! `edge::serve` gives hyper that one timer for the wait for a head). With both, the floor
//! went from 30,030 to 39,608 instructions per request reading the body whole and from
//! 28,962 to 38,701 streaming it: the header case +8,445 and +8,432 alone (hyper records
//! every name's case in a second header map on both legs, and looks each name up in it
//! again to write it), the timeout +1,215 and +1,403 alone (`scripts/instructions.sh`,
//! 2026-12-07).
//! What it costs per request is what this design on these libraries costs before any of
//! shedgate's work (docs/benchmark-history.md, "The floor").
//!
//! It takes shedgate's `serve` arguments so that `scripts/instructions.sh --bin` can count
//! it: `--listen ADDR`, `--upstream http://HOST:PORT`, and `--admin-listen ADDR`, where every
//! request is answered `204` (the script pins shedgate's pressure there); the others are
//! ignored. With `--collect` (or `FLOOR_COLLECT=1` in the environment) the request body is
//! read whole before it is forwarded (what shedgate does on the sheddable path), else it is
//! streamed (the `never` path); `scripts/instructions.sh` sets it to match the path it counts.
//! With `FLOOR_RUNTIME=current` it runs on tokio's current-thread runtime instead.
//!
//! With `FLOOR_MIMIC=1` it takes each of shedgate's three paths as `../shared/bench/costofno.py`
//! drives them, so that one run of that script measures the floor of every row beside nginx:
//! a request whose `X-Stream` is `geofence.transition` streams through (the `never` yes);
//! any other has its body read whole, then is forwarded (the sheddable yes), or, while a
//! pressure pin is set (`PUT /pressure` with a body on the admin listener; `DELETE` clears
//! it), answered a canned 503 with `Retry-After` and the problem document nginx's `return 503`
//! sends in that script (the no: the body read, nothing decided, counted or formatted).
//!
//! Run: `cargo build --release --example floor`, then
//! `scripts/instructions.sh --no-nginx --bin target/release/examples/floor`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use shedgate::BoxError;
use shedgate::upstream::ForwardBody;
use shedgate::upstream::pool::Pool;
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Answer = UnsyncBoxBody<Bytes, hyper::Error>;

fn arg(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let listen = arg(&args, "--listen").unwrap_or_else(|| "127.0.0.1:18083".into());
    let upstream: http::Uri = arg(&args, "--upstream")
        .unwrap_or_else(|| "http://127.0.0.1:18080".into())
        .parse()?;
    let host = upstream.host().unwrap_or("127.0.0.1").to_owned();
    let port = upstream.port_u16().unwrap_or(80);
    let admin = arg(&args, "--admin-listen");
    let collect = args.iter().any(|a| a == "--collect")
        || std::env::var_os("FLOOR_COLLECT").is_some_and(|v| v == "1");
    let mimic = std::env::var_os("FLOOR_MIMIC").is_some_and(|v| v == "1");
    // `FLOOR_RUNTIME=current`: tokio's current-thread runtime (one thread, no work
    // stealing), the design of one runtime per core.
    let mut runtime = match std::env::var("FLOOR_RUNTIME").as_deref() {
        Ok("current") => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    runtime.enable_all().build()?.block_on(async move {
        if let Some(admin) = admin {
            let admin = TcpListener::bind(admin).await?;
            tokio::spawn(async move {
                while let Ok((stream, _)) = admin.accept().await {
                    tokio::spawn(serve(stream, |req: Request<Incoming>| async move {
                        if req.uri().path() == "/pressure" {
                            let pinned = req.method() == http::Method::PUT;
                            PINNED.store(pinned, std::sync::atomic::Ordering::Relaxed);
                        }
                        Ok(status(204))
                    }));
                }
            });
        }
        let listener = TcpListener::bind(listen).await?;
        let pool = Arc::new(Pool::new(
            &host,
            port,
            Duration::from_secs(5),
            shedgate::upstream::HeaderCase::Preserve,
        ));
        loop {
            let (stream, _) = listener.accept().await?;
            let pool = Arc::clone(&pool);
            tokio::spawn(serve(stream, move |req| {
                forward(req, Arc::clone(&pool), collect, mimic)
            }));
        }
    })
}

async fn serve<F, Fut>(stream: TcpStream, f: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<Answer>, Infallible>> + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(IDLE_TIMEOUT)
        .preserve_header_case(true)
        .serve_connection(TokioIo::new(stream), hyper::service::service_fn(f))
        .await;
}

/// hyper's header read timeout: shedgate's default `--idle-timeout`, which `edge::serve`
/// gives hyper as its one timer for the wait for a head.
const IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// `FLOOR_MIMIC`: whether the admin listener has a pressure pin set.
static PINNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The canned no: nginx's `return 503` body in `costofno.py`.
const PROBLEM: &[u8] = br#"{"type":"about:blank","status":503}"#;

async fn forward(
    req: Request<Incoming>,
    pool: Arc<Pool>,
    collect: bool,
    mimic: bool,
) -> Result<Response<Answer>, Infallible> {
    let collect = if mimic {
        req.headers()
            .get("x-stream")
            .is_none_or(|s| s.as_bytes() != b"geofence.transition")
    } else {
        collect
    };
    let (parts, body) = req.into_parts();
    if mimic && collect && PINNED.load(std::sync::atomic::Ordering::Relaxed) {
        if body.collect().await.is_err() {
            return Ok(status(400));
        }
        let mut r = Response::new(
            http_body_util::Full::new(Bytes::from_static(PROBLEM))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        let h = r.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/problem+json"),
        );
        h.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("5"),
        );
        return Ok(r);
    }
    let body: ForwardBody = if collect {
        match body.collect().await {
            Ok(whole) => http_body_util::Full::new(whole.to_bytes())
                .map_err(|never| match never {})
                .boxed_unsync(),
            Err(_) => return Ok(status(400)),
        }
    } else {
        body.map_err(BoxError::from).boxed_unsync()
    };
    match pool.send(Request::from_parts(parts, body)).await {
        Ok(response) => Ok(response.map(BodyExt::boxed_unsync)),
        Err(_) => Ok(status(502)),
    }
}

fn status(code: u16) -> Response<Answer> {
    let mut r = Response::new(Answer::default());
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or_default();
    r
}
