//! Serving client connections: accept, the framing guard on each connection's bytes, hyper's
//! HTTP/1.1 connection with its timeouts, and the drain at shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::Service;

use super::framing::{AmbiguousFraming, FramingGuard, HeadVerdict, HeaderLineTooLong};
use super::rejection::Body;

/// The client's address, inserted into request extensions by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientInfo {
    /// The TCP peer.
    pub peer: SocketAddr,
}

/// Client connection settings of the proxy listener.
#[derive(Debug, Clone, Copy)]
pub struct Connections {
    /// How long a request head may take, from accept or the previous response.
    pub header_read_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    pub drain_timeout: Duration,
    /// Longest header line, bytes (the framing guard's 431).
    pub max_header_line: usize,
    /// Largest request head, bytes (hyper's 431).
    pub max_head: usize,
}

/// Accepts connections until shutdown, then drains.
pub async fn serve<S>(
    listener: TcpListener,
    stack: S,
    settings: Connections,
    mut shutdown: watch::Receiver<bool>,
) where
    S: Service<Request<Incoming>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        // A head over the limit is answered 431 by hyper itself.
        .max_header_size(settings.max_head)
        .keep_alive(true);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
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
        let svc = tower::util::MapRequest::new(stack.clone(), move |mut req: Request<Incoming>| {
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
        });
        let conn = builder.serve_connection(io, TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("draining in-flight requests");
    let drain_timeout = settings.drain_timeout;
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain_timeout,
            "drain timeout elapsed with requests still in flight"
        );
    }
}
