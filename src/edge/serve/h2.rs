//! HTTP/2 on the TLS listener, for connections whose ALPN chose `h2` (RFC 9113 section 3.2):
//! hyper's HTTP/2 server, each stream one request handed to the same service stack as an
//! HTTP/1.1 request (decided alone: streams of one connection share nothing in the decision),
//! with the connection's limits, its idle timeout, its place among the reusable connections
//! (`edge::descriptors`), and a graceful close for the lame duck, the drain, the idle timeout
//! and eviction (docs/operations.md "HTTP/2").
//!
//! The graceful close is hyper's `graceful_shutdown`, which is the h2 crate's
//! (`Connection::go_away_gracefully`): a `GOAWAY` with the largest stream id and `NO_ERROR`,
//! then a `PING`; once the client acknowledges it (a round trip, so every stream the client
//! sent before it saw the first `GOAWAY` has arrived), a second `GOAWAY` with the last stream
//! id processed. Streams up to that id finish; later ones are ignored (RFC 9113 section 6.8),
//! and the connection closes when its last stream ends. A client that never acknowledges the
//! `PING` is closed once it has no stream open, [`GOAWAY_GRACE`] after the first `GOAWAY` and
//! after its last answer ended at the lame duck and the drain, [`PAUSE`] after them at the
//! idle timeout and when told to close to free a descriptor (an answer ends when its last
//! frame enters h2's queue: the wait after it lets a slow reader read it).
//!
//! What the framing guard does for HTTP/1 has no object here: HTTP/2 frames carry their
//! length, and the h2 crate refuses a `content-length` that disagrees with the `DATA` frames,
//! connection-specific fields (`connection`, `transfer-encoding`, `upgrade`, `keep-alive`,
//! `te` other than `trailers`) and repeated or misplaced pseudo-headers (a stream reset with
//! `PROTOCOL_ERROR`), a header name with an upper-case letter (the connection closed with
//! `PROTOCOL_ERROR`), and answers a header list over `SETTINGS_MAX_HEADER_LIST_SIZE` with 431
//! itself. An answer given before the request body has arrived ends its stream with
//! `RST_STREAM` `NO_ERROR` after the answer (the h2 crate, RFC 9113 section 8.1), and the
//! connection stays open.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::Shared;
use crate::BoxError;
use crate::edge::client::ClientInfo;
use crate::edge::descriptors::PAUSE;
use crate::edge::framing::HeaderLineTooLong;
use crate::edge::keepalive::{Activity, Answer, PARK_AFTER, Pending};
use crate::edge::tls::Http2Limits;
use crate::metrics::{CloseReason, Metrics};

/// How long a connection sent a graceful `GOAWAY` at the lame duck or the drain may take to
/// acknowledge its `PING`, with no stream open, before it is closed: nginx's
/// `lingering_timeout` (5 s), the wait for a quiet client elsewhere in the edge
/// (`edge::lifecycle::LINGER_IDLE`). One closed at the idle timeout or to free a descriptor
/// gets [`PAUSE`] instead: an idle HTTP/1 connection is closed at once then, and the accepts
/// waiting for a descriptor wait for this one (`edge::descriptors`).
pub const GOAWAY_GRACE: Duration = Duration::from_secs(5);

/// The flow-control window of each stream the client opens, bytes: request body the client
/// may send before the proxy reads it, nginx's `http2_body_preread_size` (64 KiB). hyper's
/// default is 1 MiB.
pub const STREAM_WINDOW: u32 = 64 * 1024;
/// The flow-control window of a whole connection, bytes: request body of all its streams the
/// client may send before the proxy reads it, so the most a connection makes the proxy hold
/// unread, outside `--max-buffered-bytes` (docs/operations.md "HTTP/2"). Four streams' worth;
/// hyper's default is 1 MiB.
pub const CONNECTION_WINDOW: u32 = 256 * 1024;

/// hyper's HTTP/2 server settings for the listener: `limits`, `max_head` (`--max-head`,
/// bytes) as `SETTINGS_MAX_HEADER_LIST_SIZE` (RFC 9113 section 6.5.2: each field's name and
/// value plus 32 bytes), the bound HTTP/1 puts on a request head, and the receive windows
/// [`STREAM_WINDOW`] and [`CONNECTION_WINDOW`]. No keep-alive `PING`s: an idle connection is
/// closed at the idle timeout, as an HTTP/1 one is.
pub(super) fn builder(limits: &Http2Limits, max_head: usize) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(u32::try_from(max_head).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(limits.max_pending_resets)
        .max_local_error_reset_streams(limits.max_error_resets);
    builder
}

/// One HTTP/2 client connection (`stream`: the TLS stream, or a pipe in tests), from the end
/// of its TLS handshake to close: served until the client closes it, or closed gracefully
/// (see the module) at the idle timeout with no stream open, when told to close to free a
/// descriptor with no stream open, at the lame duck and at the drain. While no stream is open it is queued as reusable
/// ([`PARK_AFTER`] after its last stream ended, as a parked HTTP/1 connection is).
pub(super) async fn connection<S, B, I>(
    stream: I,
    peer: SocketAddr,
    shared: Arc<Shared<S>>,
    shard: u8,
    max_header_line: usize,
    activity: Arc<Activity>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Some(builder) = &shared.http2 else {
        return;
    };
    let service = streams(&shared, peer, max_header_line, &activity);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let metrics = shared.metrics.as_deref();
    let count = |reason| {
        if let Some(m) = metrics {
            m.connection_closed(reason);
        }
    };
    // Set once the first GOAWAY is sent, to when and the grace for its PING: the timer then
    // cuts a client that has not acknowledged it, once no stream is open.
    let mut going_away: Option<(Instant, Duration)> = None;
    // How often a connection with a stream open looks again: never past the idle timeout
    // after its last stream ends, even an idle timeout below the park's second.
    let step = PARK_AFTER.min(shared.idle_timeout);
    let mut timer = std::pin::pin!(tokio::time::sleep(step));
    loop {
        let goaway = tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    closed_with_error(&e, peer, metrics);
                }
                return;
            }
            () = timer.as_mut() => {
                let now = Instant::now();
                if let Some((sent, grace)) = going_away {
                    // The GOAWAY's PING unanswered: cut once no stream is open and the grace
                    // has passed since both the GOAWAY and the last answer's end. An answer
                    // ends when its last frame enters h2's queue, not the socket: a slow
                    // reader has the grace to read it.
                    let cut_at = sent.max(activity.idle_since()) + grace;
                    if activity.in_flight() > 0 {
                        timer.as_mut().reset(now + grace);
                        continue;
                    }
                    if now >= cut_at {
                        return;
                    }
                    timer.as_mut().reset(cut_at);
                    continue;
                }
                if activity.in_flight() > 0 {
                    timer.as_mut().reset(now + step);
                    continue;
                }
                let idle_since = activity.idle_since();
                let (idle_end, reusable_at) =
                    (idle_since + shared.idle_timeout, idle_since + PARK_AFTER);
                if now >= idle_end {
                    count(CloseReason::IdleTimeout);
                    Some(PAUSE)
                } else if now >= reusable_at {
                    if !activity.reuse.queued() {
                        shared.descriptors.reusable(&activity);
                    }
                    timer.as_mut().reset(idle_end);
                    None
                } else {
                    timer.as_mut().reset(reusable_at.min(idle_end));
                    None
                }
            }
            () = shared.drained(shard), if going_away.is_none() => Some(GOAWAY_GRACE),
            () = shared.lame_duck.begun(), if going_away.is_none() => {
                count(CloseReason::LameDuck);
                Some(GOAWAY_GRACE)
            }
            // Told to close to free a descriptor: closed if no stream is open, kept if one is.
            () = activity.reuse.evicted(), if going_away.is_none() => {
                if activity.in_flight() == 0 {
                    count(CloseReason::Descriptors);
                    Some(PAUSE)
                } else {
                    shared.descriptors.declined(&activity);
                    None
                }
            }
        };
        if let Some(grace) = goaway {
            let now = Instant::now();
            going_away = Some((now, grace));
            conn.as_mut().graceful_shutdown();
            timer.as_mut().reset(now + grace);
        }
    }
}

/// The service of one HTTP/2 connection: each stream's request carries the client's
/// [`ClientInfo`] (`https`), and a [`HeaderLineTooLong`] when a field is longer than
/// `--max-header-line` would allow as an HTTP/1 line (answered 431, as over HTTP/1), and is
/// counted among the connection's streams in flight until its answer's body ends.
fn streams<S, B>(
    shared: &Shared<S>,
    peer: SocketAddr,
    max_header_line: usize,
    activity: &Arc<Activity>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Answer<B>>,
    Error = Infallible,
    Future: Send + 'static,
> + Send
+ 'static
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
{
    let stack = shared.stack.clone();
    let info = ClientInfo::new(peer).over_tls(true);
    let activity = Arc::clone(activity);
    let descriptors = Arc::clone(&shared.descriptors);
    let metrics = shared.metrics.clone();
    hyper::service::service_fn(move |mut req: Request<Incoming>| {
        activity.request(req.version());
        descriptors.in_use(&activity);
        if let Some(m) = &metrics {
            m.tls.http2_streams.increment(1);
        }
        req.extensions_mut().insert(info.clone());
        if let Some(limit) = line_too_long(req.headers(), max_header_line) {
            req.extensions_mut().insert(HeaderLineTooLong(limit));
        }
        let pending = Pending::new(Arc::clone(&activity));
        let answered = stack.clone().oneshot(req);
        async move {
            let resp = match answered.await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(resp.map(|body| pending.answer(body)))
        }
    })
}

/// `Some(limit)` when a field, written as an HTTP/1 header line (name, `: `, value, CRLF),
/// would be longer than `limit` bytes.
fn line_too_long(headers: &HeaderMap, limit: usize) -> Option<usize> {
    headers
        .iter()
        .any(|(name, value)| name.as_str().len() + value.len() + 4 > limit)
        .then_some(limit)
}

/// Counts and logs a connection hyper ended with an error: a `GOAWAY` the proxy sent for the
/// client's conduct ([`CloseReason::Http2EnhanceYourCalm`], [`CloseReason::Http2ProtocolError`]);
/// the client's own `GOAWAY` or a broken socket is only logged.
fn closed_with_error(e: &hyper::Error, peer: SocketAddr, metrics: Option<&Metrics>) {
    let h2 = std::error::Error::source(e).and_then(|s| s.downcast_ref::<h2::Error>());
    let reason = match h2 {
        Some(h2) if h2.is_go_away() && h2.is_library() => match h2.reason() {
            Some(h2::Reason::NO_ERROR) | None => None,
            Some(h2::Reason::ENHANCE_YOUR_CALM) => Some(CloseReason::Http2EnhanceYourCalm),
            Some(_) => Some(CloseReason::Http2ProtocolError),
        },
        _ => None,
    };
    if let (Some(reason), Some(m)) = (reason, metrics) {
        m.connection_closed(reason);
    }
    tracing::debug!(error = %e, %peer, "HTTP/2 client connection ended with an error");
}

#[cfg(test)]
mod closes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_measured_as_its_http1_line() {
        let mut h = HeaderMap::new();
        h.insert("x-stream", "a".repeat(10).parse().unwrap());
        // "x-stream: aaaaaaaaaa\r\n" is 22 bytes.
        assert_eq!(line_too_long(&h, 22), None);
        assert_eq!(line_too_long(&h, 21), Some(21));
    }
}
