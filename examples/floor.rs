//! The floor: a bare forwarder built from the same libraries as shedgate (tokio's
//! multi-thread runtime, hyper's HTTP/1 server, jemalloc) and shedgate's own upstream
//! connection pool (`shedgate::upstream::pool`, on hyper's `client::conn`), with none of
//! shedgate's other work: no admission decision, no framing guard, no timeouts, no metrics,
//! and no header hygiene (it forwards every header as it came, hop-by-hop ones included,
//! which RFC 9110 section 7.6.1 forbids a proxy: it is a measuring tool, not a proxy to run).
//! What it costs per request is what this design on these libraries costs before any of
//! shedgate's work (README "Benchmarks", "The floor").
//!
//! It takes shedgate's `serve` arguments so that `scripts/instructions.sh --bin` can count
//! it: `--listen ADDR`, `--upstream http://HOST:PORT`, and `--admin-listen ADDR`, where every
//! request is answered `204` (the script pins shedgate's pressure there); the others are
//! ignored. With `--collect` (or `FLOOR_COLLECT=1` in the environment) the request body is
//! read whole before it is forwarded (what shedgate does on the sheddable path), else it is
//! streamed (the `never` path); `scripts/instructions.sh` sets it to match the path it counts.
//! With `FLOOR_RUNTIME=current` it runs on tokio's current-thread runtime instead.
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
                    tokio::spawn(serve(stream, |_| async { Ok(status(204)) }));
                }
            });
        }
        let listener = TcpListener::bind(listen).await?;
        let pool = Arc::new(Pool::new(
            &host,
            port,
            Duration::from_secs(5),
            shedgate::upstream::HeaderCase::Lower,
        ));
        loop {
            let (stream, _) = listener.accept().await?;
            let pool = Arc::clone(&pool);
            tokio::spawn(serve(stream, move |req| {
                forward(req, Arc::clone(&pool), collect)
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
        .serve_connection(TokioIo::new(stream), hyper::service::service_fn(f))
        .await;
}

async fn forward(
    req: Request<Incoming>,
    pool: Arc<Pool>,
    collect: bool,
) -> Result<Response<Answer>, Infallible> {
    let (parts, body) = req.into_parts();
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
