//! The floor: a bare forwarder built from the same libraries as shedgate (tokio's
//! multi-thread runtime, hyper's HTTP/1 server and `client::conn`, jemalloc), with none of
//! shedgate's work: no admission decision, no framing guard, no timeouts, no metrics, and no
//! header hygiene (it forwards every header as it came, hop-by-hop ones included, which RFC
//! 9110 section 7.6.1 forbids a proxy: it is a measuring tool, not a proxy to run). Its
//! connection pool is shedgate's (`upstream::pool`) without the retry and the reaper. What it
//! costs per request is what this design on these libraries costs before any of shedgate's
//! work (README "Benchmarks", "The floor").
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
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Forwarded = UnsyncBoxBody<Bytes, hyper::Error>;
type Idle = Arc<Mutex<Vec<SendRequest<Forwarded>>>>;

fn arg(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let listen = arg(&args, "--listen").unwrap_or_else(|| "127.0.0.1:18083".into());
    let upstream = arg(&args, "--upstream").unwrap_or_else(|| "http://127.0.0.1:18080".into());
    let upstream = upstream.trim_start_matches("http://").trim_end_matches('/');
    let upstream: Arc<str> = upstream.into();
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
                    tokio::spawn(serve(stream, |_| async {
                        let mut r = Response::new(Forwarded::default());
                        *r.status_mut() = hyper::StatusCode::NO_CONTENT;
                        Ok::<_, Infallible>(r)
                    }));
                }
            });
        }
        let listener = TcpListener::bind(listen).await?;
        let idle: Idle = Arc::default();
        loop {
            let (stream, _) = listener.accept().await?;
            let (idle, upstream) = (idle.clone(), upstream.clone());
            tokio::spawn(serve(stream, move |req| {
                forward(req, idle.clone(), upstream.clone(), collect)
            }));
        }
    })
}

async fn serve<F, Fut>(stream: TcpStream, f: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<Forwarded>, Infallible>> + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), hyper::service::service_fn(f))
        .await;
}

async fn forward(
    req: Request<Incoming>,
    idle: Idle,
    upstream: Arc<str>,
    collect: bool,
) -> Result<Response<Forwarded>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = if collect {
        match body.collect().await {
            Ok(whole) => http_body_util::Full::new(whole.to_bytes())
                .map_err(|never| match never {})
                .boxed_unsync(),
            Err(_) => return Ok(status(400)),
        }
    } else {
        body.boxed_unsync()
    };
    let req = Request::from_parts(parts, body);
    let mut sender = match checkout(&idle).await {
        Some(s) => s,
        None => match connect(&upstream).await {
            Ok(s) => s,
            Err(_) => return Ok(status(502)),
        },
    };
    match sender.send_request(req).await {
        Ok(response) => Ok(response.map(|body| {
            GiveBack {
                body,
                sender: Some(sender),
                idle,
            }
            .boxed_unsync()
        })),
        Err(_) => Ok(status(502)),
    }
}

/// The most recently used idle connection that is still ready, as shedgate's pool checks.
async fn checkout(idle: &Idle) -> Option<SendRequest<Forwarded>> {
    loop {
        let mut sender = idle.lock().ok()?.pop()?;
        if !sender.is_closed() && sender.ready().await.is_ok() {
            return Some(sender);
        }
    }
}

async fn connect(upstream: &str) -> Result<SendRequest<Forwarded>, Box<dyn std::error::Error>> {
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

fn status(code: u16) -> Response<Forwarded> {
    let mut r = Response::new(Forwarded::default());
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or_default();
    r
}

/// An answer's body that puts its connection back on the idle stack when it ends.
struct GiveBack {
    body: Incoming,
    sender: Option<SendRequest<Forwarded>>,
    idle: Idle,
}

impl GiveBack {
    /// Back on the stack now if ready, else once it is, as shedgate's pool does.
    fn give_back(&mut self) {
        let Some(mut sender) = self.sender.take() else {
            return;
        };
        let idle = self.idle.clone();
        if sender.is_ready() {
            push(&idle, sender);
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if sender.ready().await.is_ok() {
                    push(&idle, sender);
                }
            });
        }
    }
}

fn push(idle: &Idle, sender: SendRequest<Forwarded>) {
    if let Ok(mut idle) = idle.lock() {
        idle.push(sender);
    }
}

impl Body for GiveBack {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            self.give_back();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.give_back();
        }
    }
}
