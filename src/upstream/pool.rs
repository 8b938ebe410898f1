//! The upstream connection pool: HTTP/1.1 connections from hyper's `client::conn::http1`, one
//! spawned task each, kept idle in a last-in-first-out stack for the pool's idle timeout
//! ([`POOL_IDLE_TIMEOUT`] by default), at most its cap of them ([`POOL_MAX_IDLE`] by default;
//! past it the least recently used idle connection is closed, as nginx's `keepalive N` does).
//!
//! shedgate talks to one upstream, so the pool is one stack behind one lock: no pool key and
//! no hash of scheme and authority per request. A connection goes back on the stack when its
//! answer's body has ended ([`PooledBody`]), at once when hyper is ready for the next request
//! on it (the common case: the request was written whole before the answer came), else from a
//! task that waits until it is (an upstream that answered before reading the whole request),
//! as hyper-util's legacy client does; an answer dropped before its end takes its connection
//! with it (the rest of its body is not drained).
//!
//! Retries follow hyper-util's legacy client (`retry_canceled_requests`): a request that
//! hyper hands back unsent because the pooled connection it was given turned out closed is
//! sent again on another connection; nothing that may have reached the upstream is resent.
//!
//! The legacy client's dispatch was the largest shedgate-side symbol in the throughput
//! profile (docs/benchmark-history.md, "Per request", has the before and after).

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::ForwardBody;
use crate::edge::descriptors::Descriptors;

/// Idle pooled connections are not used after this, below common upstream keep-alive timeouts
/// (nginx 75 s, Node.js 5 s is the outlier), so the pool rarely races an upstream closing an
/// idle connection (hyper issue 2136); a reaper closes them within twice this. The default of
/// `--pool-idle-timeout` (and `pool_idle_timeout` in `[upstreams.NAME]`); Envoy's default
/// idle timeout is an hour and hyper-util's legacy client's 90 s, both above Node.js's 5 s
/// keep-alive, which is why this one is lower.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Idle connections kept per upstream by default (`--pool-max-idle`, `pool_max_idle` in
/// `[upstreams.NAME]`): generous, so that it shapes nothing short of a burst past a thousand
/// concurrent requests, as no cap did before it. nginx's `keepalive N` has no default (its
/// docs' examples keep 16 to 32), HAProxy's `pool-max-conn` defaults to unlimited, and Envoy
/// caps a cluster's connections, busy and idle, at 1024 by default (its circuit breakers'
/// `max_connections`): idle past that is idle no peer keeps.
pub const POOL_MAX_IDLE: usize = 1024;

/// Why a request could not be sent, or its answer not received.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No TCP connection to the upstream could be made: the last address's error, or the
    /// name resolution's.
    #[error("connect failed")]
    Connect(#[source] std::io::Error),
    /// Resolving the name and connecting took longer than `--connect-timeout` (seconds).
    #[error("connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// The HTTP exchange failed: the upstream closed or reset the connection, sent something
    /// that is not HTTP/1.1, or the request body failed (its error is in the source chain).
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The upstream answered `101 Switching Protocols` though the proxy never asks it to
    /// switch (`Upgrade` is hop-by-hop and never forwarded): the connection speaks something
    /// else now, so it is closed and never pooled, and the client gets 502 (mitmproxy#2229).
    #[error("the upstream switched protocols (101) unasked")]
    UnsolicitedUpgrade,
}

/// How many idle connections a pool keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// An idle connection is not reused after this ([`POOL_IDLE_TIMEOUT`] by default).
    pub idle_timeout: Duration,
    /// Most idle connections kept ([`POOL_MAX_IDLE`] by default); 0 keeps none, so each
    /// connection closes after its answer.
    pub max_idle: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle_timeout: POOL_IDLE_TIMEOUT,
            max_idle: POOL_MAX_IDLE,
        }
    }
}

struct Idle {
    sender: SendRequest<ForwardBody>,
    since: Instant,
}

struct Stack {
    idle: Mutex<Vec<Idle>>,
    /// Whether the task that closes expired idle connections runs.
    reaper: std::sync::atomic::AtomicBool,
    /// How long an idle connection may be reused.
    idle_timeout: Duration,
    /// Most idle connections kept; past it the least recently used one is closed.
    max_idle: usize,
}

/// Connections to one upstream. Cheap to clone (one reference count); clones share the idle
/// connections.
#[derive(Clone)]
pub struct Pool(Arc<Shared>);

/// What the clones of a [`Pool`] share.
pub struct Shared {
    stack: Arc<Stack>,
    host: String,
    port: u16,
    connect_timeout: Duration,
    builder: Builder,
    /// Where the pool's sockets are counted, when set ([`Pool::count_descriptors`]).
    descriptors: std::sync::OnceLock<Arc<Descriptors>>,
}

impl std::ops::Deref for Pool {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of connections to `host:port` (a name is resolved for every new connection),
    /// each made within `connect_timeout`, with `TCP_NODELAY`, writing header names as
    /// `case` says; idle connections kept as [`Limits::default`] says.
    pub fn new(host: &str, port: u16, connect_timeout: Duration, case: super::HeaderCase) -> Self {
        let limits = Limits::default();
        let mut builder = Builder::new();
        match case {
            // A request's own names come from the case map hyper's server recorded; names
            // without one (the proxy's own) fall back to title case.
            super::HeaderCase::Preserve => {
                builder.preserve_header_case(true).title_case_headers(true);
            }
            super::HeaderCase::Title => {
                builder.title_case_headers(true);
            }
            super::HeaderCase::Lower => {}
        }
        Pool(Arc::new(Shared {
            stack: Arc::new(Stack {
                idle: Mutex::default(),
                reaper: std::sync::atomic::AtomicBool::new(false),
                idle_timeout: limits.idle_timeout,
                max_idle: limits.max_idle,
            }),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            connect_timeout,
            builder,
            descriptors: std::sync::OnceLock::new(),
        }))
    }

    /// A pool as this one, keeping idle connections as `limits` says: its own connections
    /// (none of this one's), the same address, connect timeout, header case and descriptors.
    #[must_use]
    pub fn with_limits(&self, limits: Limits) -> Self {
        Pool(Arc::new(Shared {
            stack: Arc::new(Stack {
                idle: Mutex::default(),
                reaper: std::sync::atomic::AtomicBool::new(false),
                idle_timeout: limits.idle_timeout,
                max_idle: limits.max_idle,
            }),
            host: self.host.clone(),
            port: self.port,
            connect_timeout: self.connect_timeout,
            builder: self.builder.clone(),
            descriptors: self.descriptors.clone(),
        }))
    }

    /// Counts the pool's sockets against the process's `descriptors` from now on, and, when
    /// a connect finds them exhausted (`EMFILE`, `ENFILE`), has idle client connections
    /// closed and tries that address once more (`edge::descriptors`). Set once; later calls
    /// do nothing.
    pub fn count_descriptors(&self, descriptors: Arc<Descriptors>) {
        let _ = self.descriptors.set(descriptors);
    }

    /// Sends `req` (origin-form target, `Host` set) on an idle connection, or a new one, and
    /// returns the answer; its body gives the connection back when it ends.
    ///
    /// # Errors
    /// [`SendError`]: no connection, or the exchange failed.
    pub async fn send(
        &self,
        mut req: Request<ForwardBody>,
    ) -> Result<Response<PooledBody>, SendError> {
        loop {
            let (mut sender, reused) = match self.checkout().await {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(req).await {
                // The sender is dropped with the answer: that connection is never reused.
                Ok(response) if response.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                    return Err(SendError::UnsolicitedUpgrade);
                }
                Ok(response) => {
                    let stack = Arc::downgrade(&self.stack);
                    return Ok(response.map(|body| PooledBody {
                        body,
                        sender: Some(sender),
                        stack,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Unsent on a connection that had closed while idle: try another.
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(SendError::Http(e.into_error())),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open and ready, if any.
    async fn checkout(&self) -> Option<SendRequest<ForwardBody>> {
        loop {
            let idle = {
                let mut stack = self.stack.idle.lock().ok()?;
                stack.pop()?
            };
            if idle.since.elapsed() >= self.stack.idle_timeout || idle.sender.is_closed() {
                continue;
            }
            let mut sender = idle.sender;
            // Only ready connections are given back; this is the check that it still is.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// A new connection, its task spawned. The name is resolved and its addresses tried in
    /// order within the connect timeout, each address given an equal share of what is left
    /// of it (hyper-util's `HttpConnector` splits it the same way; it also races IPv4 and
    /// IPv6, which this does not).
    async fn connect(&self) -> Result<SendRequest<ForwardBody>, SendError> {
        let deadline = Instant::now() + self.connect_timeout;
        let timed_out = |_| SendError::ConnectTimeout(self.connect_timeout);
        let addrs: Vec<_> = tokio::time::timeout_at(
            deadline,
            tokio::net::lookup_host((self.host.as_str(), self.port)),
        )
        .await
        .map_err(timed_out)?
        .map_err(SendError::Connect)?
        .collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address for the name");
        let mut stream = None;
        // Out of descriptors, idle client connections are closed and the address tried once
        // more.
        let mut retried = false;
        let mut i = 0;
        while let Some(addr) = addrs.get(i) {
            let left = deadline.saturating_duration_since(Instant::now());
            let share = left / u32::try_from(addrs.len() - i).unwrap_or(u32::MAX);
            match tokio::time::timeout(share, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    stream = Some(s);
                    break;
                }
                Ok(Err(e)) => {
                    if !retried
                        && let Some(d) = self.descriptors.get()
                        && d.connect_failed(&e, deadline).await
                    {
                        retried = true;
                        continue;
                    }
                    last = e;
                }
                Err(_) if i + 1 == addrs.len() => {
                    return Err(SendError::ConnectTimeout(self.connect_timeout));
                }
                Err(_) => {}
            }
            i += 1;
        }
        let stream = stream.ok_or(SendError::Connect(last))?;
        let held = self.descriptors.get().map(Descriptors::hold);
        let _ = stream.set_nodelay(true);
        let (sender, conn) = self.builder.handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
            // After the socket: the count falls once the descriptor is free.
            drop(held);
        });
        self.start_reaper();
        Ok(sender)
    }

    /// Starts, once, the task that closes idle connections past the idle timeout when no
    /// request comes to find them; it ends with the pool.
    fn start_reaper(&self) {
        use std::sync::atomic::Ordering;
        if self.stack.reaper.swap(true, Ordering::Relaxed) {
            return;
        }
        let (stack, every) = (Arc::downgrade(&self.stack), self.stack.idle_timeout);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(stack) = stack.upgrade() else { return };
                if let Ok(mut idle) = stack.idle.lock() {
                    idle.retain(|c| c.since.elapsed() < every && !c.sender.is_closed());
                }
            }
        });
    }
}

/// An answer's body from a pooled connection: when it ends, the connection goes back to the
/// pool; dropped before its end, the connection is closed.
#[derive(Debug)]
pub struct PooledBody {
    body: Incoming,
    sender: Option<SendRequest<ForwardBody>>,
    stack: Weak<Stack>,
}

impl PooledBody {
    /// Puts the connection back on the stack: now if hyper is ready for a next request on
    /// it, else once it is (it is still writing a request the upstream answered early).
    fn give_back(&mut self) {
        let Some(mut sender) = self.sender.take() else {
            return;
        };
        if sender.is_ready() {
            push(&self.stack, sender);
            return;
        }
        // Outside a runtime (dropped at shutdown) the connection is simply closed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let stack = self.stack.clone();
            runtime.spawn(async move {
                if sender.ready().await.is_ok() {
                    push(&stack, sender);
                }
            });
        }
    }
}

/// Puts `sender` on top of the stack; past the stack's cap, the least recently used idle
/// connection (the bottom one) is closed, or this one when the cap is 0.
fn push(stack: &Weak<Stack>, sender: SendRequest<ForwardBody>) {
    if let Some(stack) = stack.upgrade()
        && stack.max_idle > 0
        && let Ok(mut idle) = stack.idle.lock()
    {
        if idle.len() >= stack.max_idle {
            idle.remove(0);
        }
        idle.push(Idle {
            sender,
            since: Instant::now(),
        });
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.sender = None,
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // hyper's server does not poll a body that says it is at its end (a 204, an empty
        // answer): such a body ended whole.
        if self.body.is_end_stream() {
            self.give_back();
        }
    }
}
