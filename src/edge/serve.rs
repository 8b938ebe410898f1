//! Serving client connections: accept, the framing guard and the lifecycle on each
//! connection's bytes, hyper's HTTP/1.1 connection with its timeouts, `Connection: close`
//! where the connection must end after an answer, the lame duck, and a bounded drain at
//! shutdown (docs/responses.md "Connections").

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderValue, Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::Service;

use super::framing::{AmbiguousFraming, FramingGuard, HeadVerdict, HeaderLineTooLong};
use super::lifecycle::ClientIo;
use crate::BoxError;
use crate::metrics::{CloseReason, Metrics};

/// The client's address, inserted into request extensions by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientInfo {
    /// The TCP peer.
    pub peer: SocketAddr,
}

/// Set once shutdown has begun: `/healthz` answers 503 (readiness fails) and every answer
/// carries `Connection: close`, while new connections are still served for the shutdown
/// delay. Cheap to clone; shared by both listeners and the admin handlers.
#[derive(Debug, Clone, Default)]
pub struct LameDuck(Arc<AtomicBool>);

impl LameDuck {
    /// Enters the lame-duck phase; there is no way back.
    pub fn begin(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the lame-duck phase has begun.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Client connection settings of a listener.
#[derive(Debug, Clone)]
pub struct Connections {
    /// How long a started request head may take to finish (`--header-read-timeout`).
    pub header_read_timeout: Duration,
    /// How long a connection may wait for a request: from accept, or from the end of the
    /// previous response (`--idle-timeout`).
    pub idle_timeout: Duration,
    /// How long shutdown waits for in-flight requests before cutting connections.
    pub drain_timeout: Duration,
    /// Longest header line, bytes (the framing guard's 431).
    pub max_header_line: usize,
    /// Largest request head, bytes (hyper's 431).
    pub max_head: usize,
    /// The lame-duck flag shared with the rest of the process.
    pub lame_duck: LameDuck,
    /// Where closes are counted (`None`: not counted, the admin listener).
    pub metrics: Option<Arc<Metrics>>,
}

/// Accepts connections until `shutdown`, then lets in-flight requests finish (hyper closes
/// idle keep-alive connections at once) for at most the drain timeout, and cuts the rest
/// with a log line that says how many.
pub async fn serve<S, B>(
    listener: TcpListener,
    stack: S,
    settings: Connections,
    mut shutdown: watch::Receiver<bool>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // hyper's one timer for the wait for a head is the idle timeout; the framing guard's
        // lifecycle cuts a started head at the header read timeout (`lifecycle`).
        .header_read_timeout(settings.idle_timeout)
        // A head over the limit is answered 431 by hyper itself.
        .max_header_size(settings.max_head)
        .keep_alive(true);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                log_panic(done);
                continue;
            }
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let info = ClientInfo { peer };
        // The framing guard reads each request head on the raw bytes, before hyper
        // normalises what a smuggling attempt would show (see `framing`).
        let (io, verdicts) = FramingGuard::new(TokioIo::new(stream), settings.max_header_line);
        let io = ClientIo::new(io, settings.header_read_timeout, settings.metrics.clone());
        let svc = tower::util::MapRequest::new(stack.clone(), {
            let verdicts = verdicts.clone();
            move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(info);
                match verdicts.next() {
                    Some(HeadVerdict::Framing(why)) => {
                        req.extensions_mut().insert(AmbiguousFraming(why));
                    }
                    Some(HeadVerdict::LineTooLong(limit)) => {
                        req.extensions_mut().insert(HeaderLineTooLong(limit));
                    }
                    None => {}
                }
                req
            }
        });
        let svc = tower::util::MapResponse::new(
            svc,
            close_when(
                verdicts,
                settings.lame_duck.clone(),
                settings.metrics.clone(),
            ),
        );
        let conn = builder.serve_connection(io, TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        let metrics = settings.metrics.clone();
        connections.spawn(async move {
            if let Err(e) = conn.await {
                if e.is_timeout() {
                    // hyper's head timer, which is the idle timeout here.
                    if let Some(m) = &metrics {
                        m.connection_closed(CloseReason::IdleTimeout);
                    }
                } else {
                    tracing::debug!(error = %e, %peer, "client connection ended with an error");
                }
            }
        });
    }
    drop(listener);
    reap(&mut connections);
    tracing::info!(
        connections = connections.len(),
        "draining: idle connections close now, in-flight requests may finish"
    );
    let drain_timeout = settings.drain_timeout;
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        // Only connections still running: the idle ones closed at the start of the drain.
        reap(&mut connections);
        let cut = connections.len();
        if let Some(m) = &settings.metrics {
            for _ in 0..cut {
                m.connection_closed(CloseReason::DrainCut);
            }
        }
        tracing::warn!(
            ?drain_timeout,
            connections_cut = cut,
            "drain timeout elapsed: cutting the connections still open"
        );
    }
    connections.shutdown().await;
}

/// Joins the connection tasks that have ended, so that `len` counts the running ones.
fn reap(connections: &mut JoinSet<()>) {
    while let Some(done) = connections.try_join_next() {
        log_panic(done);
    }
}

/// A connection task that panicked is a bug: say so instead of dropping it silently.
fn log_panic(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        tracing::error!(error = %e, "a client connection task panicked");
    }
}

/// The answer hook of one connection: adds `Connection: close` to an answer given before its
/// request was received whole (an early answer; the lifecycle then lingers) or during the
/// lame duck. hyper answers a connection's requests one at a time and in order, so the n-th
/// answer is the n-th request's.
fn close_when<B>(
    verdicts: super::framing::Verdicts,
    lame_duck: LameDuck,
    metrics: Option<Arc<Metrics>>,
) -> impl FnOnce(Response<B>) -> Response<B> + Clone {
    let answered = Arc::new(AtomicU64::new(0));
    move |mut resp: Response<B>| {
        let index = answered.fetch_add(1, Ordering::Relaxed);
        let close = if lame_duck.is_set() {
            Some(CloseReason::LameDuck)
        } else if verdicts.progress().received(index) == Some(false) {
            Some(CloseReason::EarlyAnswer)
        } else {
            None
        };
        if let Some(reason) = close {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            if let Some(m) = &metrics {
                m.connection_closed(reason);
            }
        }
        resp
    }
}
