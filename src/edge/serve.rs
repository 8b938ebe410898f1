//! Serving client connections: accept, the framing guard and the lifecycle on each
//! connection's bytes, hyper's HTTP/1.1 connection with its timeouts, `Connection: close`
//! where the connection must end after an answer, the lame duck, and a bounded drain at
//! shutdown (docs/responses.md "Connections"). A TLS connection whose ALPN chose `h2` is
//! served by hyper's HTTP/2 server instead ([`h2`]).

mod h1;
pub mod h2;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::pin::Pin;

use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::Service;

pub use super::client::{ClientInfo, LameDuck};
use super::descriptors::{Backoff, Descriptors, Listener};
use super::framing::{FramingGuard, Progress};
use super::keepalive::{Activity, PARK_AFTER};
use super::lifecycle::ClientIo;
use super::protocol::refuse_protocol;
use super::tls::{ClientStream, Tls};
use crate::BoxError;
use crate::metrics::{AlpnProtocol, CloseReason, ErrorKind, Metrics};
use h1::{Parked, start};

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
    /// Whether hyper records each request's header-name case (and writes answers' names in
    /// the upstream's case), for `--upstream-header-case preserve`.
    pub preserve_header_case: bool,
    /// The lame-duck flag shared with the rest of the process.
    pub lame_duck: LameDuck,
    /// Where closes are counted (`None`: not counted, the admin listener).
    pub metrics: Option<Arc<Metrics>>,
    /// Where heads hyper refused are written (`None`: no access log, or the admin listener).
    pub refusals: Option<super::refusal::Refusals>,
    /// The process's descriptors, shared by both listeners and the upstream pool.
    pub descriptors: Arc<Descriptors>,
    /// Which listener this is: the proxy listener keeps the descriptors' reserve free.
    pub listener: Listener,
    /// TLS on this listener (`--tls-cert`): each connection's handshake runs after accept and
    /// before hyper (`edge::tls`). `None`: plain HTTP.
    pub tls: Option<Arc<Tls>>,
}

/// Accepts connections until `shutdown`, then lets in-flight requests finish (idle
/// keep-alive connections close at once) for at most the drain timeout, and cuts the rest
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
        + Sync
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // hyper's one timer for the wait for a head is the idle timeout; the framing guard's
        // lifecycle cuts a started head at the header read timeout (`lifecycle`).
        .header_read_timeout(settings.idle_timeout)
        // A head over the limit is answered 431 by hyper itself.
        .max_header_size(settings.max_head)
        .preserve_header_case(settings.preserve_header_case)
        .keep_alive(true);
    let shared = Arc::new(Shared {
        stack,
        builder,
        idle_timeout: settings.idle_timeout,
        header_read_timeout: settings.header_read_timeout,
        lame_duck: settings.lame_duck.clone(),
        metrics: settings.metrics.clone(),
        refusals: settings.refusals.clone(),
        descriptors: Arc::clone(&settings.descriptors),
        tls: settings.tls.is_some(),
        http2: settings
            .tls
            .as_ref()
            .map(|tls| h2::builder(tls.http2(), settings.max_head)),
        draining: AtomicBool::new(false),
        drain: std::array::from_fn(|_| Notify::new()),
    });
    // Connections accepted, modulo 256: each waits for the drain on its own count's shard.
    let mut shard: u8 = 0;
    let mut connections = JoinSet::new();
    let descriptors = &settings.descriptors;
    // Set after a failed accept: the wait before the next one (`edge::descriptors`).
    let mut backoff: Option<Backoff> = None;
    loop {
        let accepted = tokio::select! {
            accepted = descriptors.accept(&listener, settings.listener, &mut backoff) => accepted,
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                log_panic(done);
                continue;
            }
            _ = shutdown.wait_for(|s| *s) => {
                shared.begin_drain();
                break;
            }
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: idle connections are closed, or
                // accepting pauses, instead of spinning.
                backoff = Some(descriptors.accept_failed(&e, settings.listener));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        shard = shard.wrapping_add(1);
        let activity = Arc::new(Activity::new());
        let client = descriptors.accepted(&activity);
        let max_line = settings.max_header_line;
        match &settings.tls {
            None => {
                let stream = ClientStream::Plain(stream);
                let served =
                    connection(stream, peer, Arc::clone(&shared), shard, max_line, activity);
                connections.spawn(client.serving(served));
            }
            // The handshake in the connection's own task, after accept and before hyper: a
            // slow one never holds the accept loop.
            Some(tls) => {
                let (tls, shared) = (Arc::clone(tls), Arc::clone(&shared));
                let place = tls.begin();
                connections.spawn(client.serving(async move {
                    // Boxed: the task keeps no room for the handshake's state once it
                    // is served (or parked).
                    let handshake = Box::pin(tls.handshake(
                        place,
                        stream,
                        peer,
                        activity.reuse.evicted(),
                        shared.drained(shard),
                    ));
                    let Some(stream) = handshake.await else {
                        return;
                    };
                    let protocol = match stream.get_ref().1.alpn_protocol() {
                        Some(b"h2") => AlpnProtocol::Http2,
                        _ => AlpnProtocol::Http1,
                    };
                    if let Some(m) = &shared.metrics {
                        m.tls.connection(protocol);
                    }
                    if protocol == AlpnProtocol::Http2 {
                        // Boxed, as the handshake: an HTTP/1 task keeps no room for it.
                        let served =
                            h2::connection(stream, peer, shared, shard, max_line, activity);
                        Box::pin(served).await;
                        return;
                    }
                    let stream = ClientStream::Tls(Box::new(stream));
                    connection(stream, peer, shared, shard, max_line, activity).await;
                }));
            }
        }
    }
    drop(listener);
    reap(&mut connections);
    tracing::info!(
        listener = settings.listener.as_str(),
        connections = connections.len(),
        "draining: idle connections close now, in-flight requests may finish"
    );
    let drain_timeout = settings.drain_timeout;
    let drained = tokio::time::timeout(drain_timeout, async {
        while let Some(done) = connections.join_next().await {
            log_panic(done);
        }
    })
    .await;
    if drained.is_err() {
        // Only connections still running: the idle ones closed at the start of the drain.
        reap(&mut connections);
        let cut = connections.len();
        if let Some(m) = &settings.metrics {
            for _ in 0..cut {
                m.connection_closed(CloseReason::DrainCut);
            }
        }
        tracing::warn!(
            listener = settings.listener.as_str(),
            ?drain_timeout,
            connections_cut = cut,
            "drain timeout elapsed: cutting the connections still open"
        );
    }
    connections.shutdown().await;
}

/// What every connection of one listener shares, held by each connection's task behind one
/// `Arc`: a parked connection's task holds a pointer to it, not its own copies.
struct Shared<S> {
    /// The proxy's service stack; each hyper connection serves a clone.
    stack: S,
    /// hyper's HTTP/1.1 settings (timer, head limit, keep-alive), set once in [`serve`].
    builder: hyper::server::conn::http1::Builder,
    /// `--idle-timeout`: how long a parked connection may wait for its next request.
    idle_timeout: Duration,
    /// `--header-read-timeout`, for each resume's lifecycle ([`ClientIo::new`]).
    header_read_timeout: Duration,
    /// The process's lame-duck flag (answers carry `Connection: close` once set).
    lame_duck: LameDuck,
    /// Where closes and parked connections are counted (`None`: the admin listener).
    metrics: Option<Arc<Metrics>>,
    /// Where heads hyper refused are written (`None`: no access log, or the admin listener).
    refusals: Option<super::refusal::Refusals>,
    /// The process's descriptors: idle connections are queued there as reusable.
    descriptors: Arc<Descriptors>,
    /// Whether connections are TLS (`X-Forwarded-Proto: https`).
    tls: bool,
    /// hyper's HTTP/2 settings, for TLS connections whose ALPN chose `h2` (`None`: plain
    /// HTTP, where HTTP/2 is refused).
    http2: Option<hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>>,
    /// Set when the drain begins, with every `drain` shard notified. A waiting
    /// [`Notified`](tokio::sync::futures::Notified) future is 64 bytes of every connection's
    /// task where a `watch` receiver's `changed()` is 120 and its `wait_for` 160.
    draining: AtomicBool,
    /// One `Notify` per shard, each connection waiting on one (round-robin at accept): a
    /// waiting `Notified` takes its `Notify`'s lock on every poll, and every wake of an
    /// active connection polls it, so one lock for the whole listener would be shared by
    /// every connection's task. tokio's `watch` shards its own the same way
    /// (`sync/watch.rs`, `BigNotify`, 8 ways).
    drain: [Notify; DRAIN_SHARDS],
}

/// How many ways the drain's `Notify` is sharded (tokio's `BigNotify` uses 8).
const DRAIN_SHARDS: usize = 8;

impl<S> Shared<S> {
    /// The drain begins: every connection's [`Shared::drained`] resolves.
    fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        for shard in &self.drain {
            shard.notify_waiters();
        }
    }

    /// Resolves once the drain has begun; `shard` is the connection's (any `u8`, taken
    /// modulo `DRAIN_SHARDS`). The `Notified` future is made before the flag is read: it
    /// receives `notify_waiters` from then on, polled or not (tokio's
    /// `Notify::notify_waiters`), so a drain that begins between the two is not missed.
    async fn drained(&self, shard: u8) {
        let notified = self.drain[usize::from(shard) % DRAIN_SHARDS].notified();
        if self.draining.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

/// One client connection, from accept to close: hyper's HTTP/1.1 connection over the framing
/// guard and the lifecycle, parked after [`PARK_AFTER`] between requests (its buffers freed,
/// see `edge::keepalive`) and resumed when the client sends again, closed at the idle
/// timeout, and closed gracefully when the listener's drain begins (idle: at once; in
/// flight: after the answer). While it waits for a request (accepted, or parked) it is
/// queued as reusable and closed if told to, when descriptors run low (`edge::descriptors`).
///
/// The returned future is the connection's task for as long as it lives, parked or not, so
/// its size is memory per idle connection. Parked, it holds the framing guard (the socket and
/// the guard's counts), the client's address, pointers to the connection's counts
/// ([`Activity`]) and verdicts and to the listener's [`Shared`], its timer (a tokio `Sleep`,
/// 112 bytes) and the parked wait: 376 bytes, a 512-byte task. The lifecycle ([`ClientIo`]), the service (with
/// the client's [`ClientInfo`]) and hyper's connection are built, boxed, on each resume, and
/// the lifecycle is never a local across an await (the task would keep room for it).
/// Before: 1,104 bytes, a 1,280-byte task, in the allocator's size class of hyper's boxed
/// connection (1,088 bytes), whose pages parking left part used. 10,000 idle connections,
/// settled (`scripts/idle-rss.py --hold 15`): 41.3–42.6 MiB before, 25.1–26.3 MiB after
/// (docs/benchmark-history.md).
fn connection<S, B>(
    stream: ClientStream,
    peer: SocketAddr,
    shared: Arc<Shared<S>>,
    shard: u8,
    max_header_line: usize,
    activity: Arc<Activity>,
) -> impl Future<Output = ()> + Send + 'static
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // The framing guard reads each request head on the raw bytes, before hyper
    // normalises what a smuggling attempt would show (see `framing`).
    let (mut guard, verdicts) = FramingGuard::new(TokioIo::new(stream), max_header_line);
    async move {
        let mut draining = false;
        let mut never_park = false;
        let mut timer = std::pin::pin!(tokio::time::sleep(PARK_AFTER));
        loop {
            // Serving: hyper connections over one lifecycle until the connection is parked
            // (its guard comes back) or ends. The lifecycle is never a local across an await:
            // the task would keep room for it while parked.
            let io = ClientIo::new(
                guard,
                shared.header_read_timeout,
                shared.metrics.clone(),
                Arc::clone(&activity),
            );
            let mut conn = start(&shared, io, peer, &verdicts, &activity);
            guard = loop {
                // From now, not from the last answer: a connection resumed from the park has
                // bytes to read that hyper has not read yet.
                timer.as_mut().reset(Instant::now() + PARK_AFTER);
                let mut parking = false;
                let ended = loop {
                    tokio::select! {
                        ended = conn.as_mut() => break ended,
                        () = timer.as_mut(), if !parking && !draining && !never_park => {
                            let now = Instant::now();
                            let idle_since = activity.idle_since();
                            let progress = verdicts.progress();
                            // A connection the framing guard cannot follow is never parked.
                            never_park |= progress == Progress::Unknown;
                            let between = activity.between_requests(progress);
                            if between && now >= idle_since + PARK_AFTER {
                                parking = true;
                                activity.set_parking(true);
                                conn.as_mut().graceful_shutdown();
                            } else if between {
                                timer.as_mut().reset(idle_since + PARK_AFTER);
                            } else {
                                timer.as_mut().reset(now + PARK_AFTER);
                            }
                        }
                        () = shared.drained(shard), if !draining => {
                            draining = true;
                            parking = false;
                            activity.set_parking(false);
                            conn.as_mut().graceful_shutdown();
                        }
                        // Told to close to free a descriptor: closed if still between
                        // requests (a fresh connection), kept if a request has begun.
                        () = activity.reuse.evicted(), if !draining => {
                            if activity.between_requests(verdicts.progress()) {
                                draining = true;
                                parking = false;
                                activity.set_parking(false);
                                conn.as_mut().graceful_shutdown();
                                if let Some(m) = &shared.metrics {
                                    m.connection_closed(CloseReason::Descriptors);
                                }
                            } else {
                                shared.descriptors.declined(&activity);
                            }
                        }
                    }
                };
                match ended {
                    Err(e) if e.is_timeout() => {
                        // hyper's head timer, which is the idle timeout here.
                        if let Some(m) = &shared.metrics {
                            m.connection_closed(CloseReason::IdleTimeout);
                        }
                        return;
                    }
                    Err(e) => {
                        match verdicts.wrong_protocol() {
                            Some(wrong) => {
                                let io = Pin::into_inner(conn).into_parts().io;
                                refuse_protocol(io, wrong, peer).await;
                            }
                            None => {
                                // A head hyper refused (obs-fold, a space before the colon, a
                                // bare CR, a head over the limit) was answered 400 or 431 by
                                // hyper itself; count it as the proxy's own 400s are, and
                                // write its line with what its bytes still tell.
                                if e.is_parse()
                                    && let Some(m) = &shared.metrics
                                {
                                    m.proxy_error(ErrorKind::BadRequest);
                                }
                                tracing::debug!(error = %e, %peer, "client connection ended with an error");
                                if let (Some(refusals), Some(answer)) =
                                    (&shared.refusals, super::refusal::answered(&e))
                                {
                                    let head = Pin::into_inner(conn).into_parts().read_buf;
                                    refusals.record(peer.ip(), &head, answer);
                                }
                            }
                        }
                        return;
                    }
                    Ok(()) if !parking => {
                        // hyper answered a TLS hello's first byte 400 and closed cleanly.
                        if let Some(wrong) = verdicts.wrong_protocol() {
                            let io = Pin::into_inner(conn).into_parts().io;
                            refuse_protocol(io, wrong, peer).await;
                        }
                        return;
                    }
                    Ok(()) => {}
                }
                let hyper::server::conn::http1::Parts {
                    io: mut back,
                    read_buf,
                    ..
                } = Pin::into_inner(conn).into_parts();
                activity.set_parking(false);
                if !read_buf.is_empty() {
                    back.unread(read_buf);
                    conn = start(&shared, back, peer, &verdicts, &activity);
                    continue;
                }
                // Even empty, it holds hyper's whole read buffer.
                drop(read_buf);
                match back.into_guard() {
                    Ok(guard) => break guard,
                    // Not between requests after all (not seen to happen): served on, and
                    // never parked again, so that hyper's idle timer is not restarted.
                    Err(back) => {
                        never_park = true;
                        conn = start(&shared, back, peer, &verdicts, &activity);
                    }
                }
            };
            // A TLS session holding the next request already (pipelined in the same records
            // as the last one) would wait for a socket that has nothing more to tell: served
            // on instead.
            if guard.get_mut().inner_mut().holds_plaintext() {
                continue;
            }
            // Parked: only the socket and the guard's state are held.
            verdicts.release();
            timer
                .as_mut()
                .reset(activity.idle_since() + shared.idle_timeout);
            let _parked = shared.metrics.as_deref().map(Parked::new);
            shared.descriptors.reusable(&activity);
            let socket = guard.get_ref().inner().tcp();
            // `poll_read_ready` rather than `readable()`, whose future is 152 bytes more of
            // every parked task (nothing else reads the socket while it is parked).
            tokio::select! {
                ready = std::future::poll_fn(move |cx| socket.poll_read_ready(cx)) => {
                    if ready.is_err() {
                        return;
                    }
                    shared.descriptors.in_use(&activity);
                }
                () = timer.as_mut() => {
                    if let Some(m) = &shared.metrics {
                        m.connection_closed(CloseReason::IdleTimeout);
                    }
                    return;
                }
                () = shared.drained(shard) => return,
                () = activity.reuse.evicted() => {
                    if let Some(m) = &shared.metrics {
                        m.connection_closed(CloseReason::Descriptors);
                    }
                    return;
                }
            }
        }
    }
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
