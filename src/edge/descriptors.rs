//! Open-file descriptors: the soft limit raised to the hard one at start, the sockets the
//! proxy holds counted against it, and, when they run low, idle client connections closed
//! oldest first, so that new requests, the admin listener and upstream connects still get a
//! descriptor (docs/operations.md "Descriptors").
//!
//! A Rust program keeps the soft `RLIMIT_NOFILE` it was started with: 1024 under systemd,
//! whose hard limit is 524288 (systemd#25478). Go's runtime raises soft to hard at start
//! (since 1.19); shedgate does the same ([`raise_limit`]).
//!
//! Descriptors can still run out. nginx (`src/core/ngx_connection.c`) keeps the connections
//! that wait for a request, accepted but silent or idle between keep-alive requests, in a
//! queue of *reusable* ones by when they became so (`ngx_reusable_connection`); when fewer
//! than a sixteenth of its connections are free, `ngx_drain_connections` closes the oldest,
//! `max(min(32, reusable / 8), 1)` a round, with a warning at most once a second. On
//! `EMFILE` from `accept` it stops accepting for 500 ms (`accept_mutex_delay`,
//! `src/event/ngx_event_accept.c`). shedgate:
//!
//! - counts the sockets it holds ([`Descriptors::open`]): client connections of both
//!   listeners and upstream connections;
//! - keeps a reserve ([`reserve_for`]: a sixteenth of the soft limit, at least
//!   [`RESERVE_MIN`]): the proxy listener accepts only while the sockets held leave it free,
//!   closing reusable connections first when they do not ([`Descriptors::room`]); the admin
//!   listener and upstream connects do not wait for it, so they find it free;
//! - on `EMFILE` or `ENFILE` from either listener's accept or from an upstream connect,
//!   closes reusable connections and waits for one to close (at most [`PAUSE`]), then tries
//!   again; with none to close, a listener stops accepting for [`PAUSE`] instead of spinning,
//!   and an upstream connect fails as before (502);
//! - never closes a connection with a request in flight or a head part-way (the connection
//!   checks for itself when told, `edge::serve`);
//! - counts each shortage by where it was met ([`DescriptorShortage`]) and warns at most
//!   once every [`WARN_EVERY`], saying how many shortages the silence hid.
//!
//! Reusable here: accepted with no request yet, and parked (idle for
//! [`PARK_AFTER`](super::keepalive::PARK_AFTER) between requests, `edge::keepalive`). A
//! keep-alive connection in its first second between requests is not: it is the likeliest
//! to carry the next request, and queueing it after every answer would take a lock shared by
//! every connection on every request.

mod limit;

pub use limit::{Limits, NOMINAL_CONNECTIONS, current_limits, needed, raise_and_log, raise_limit};

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::keepalive::Activity;
use crate::metrics::{DescriptorShortage, Metrics};

/// How long a listener stops accepting when descriptors ran out and nothing could be closed,
/// and the longest wait for a closing connection: nginx's `accept_mutex_delay` default.
pub const PAUSE: Duration = Duration::from_millis(500);
/// Most reusable connections closed in one round (nginx's `ngx_drain_connections`).
pub const DRAIN_MAX: usize = 32;
/// The smallest reserve of descriptors, whatever the limit: the process's own descriptors
/// (standard streams, the runtime's epoll and waker, both listeners, the policy watcher, the
/// access log; about 15) and room for admin connections and upstream connects.
pub const RESERVE_MIN: u64 = 64;
/// At most one descriptor warning this often (each kind: shortages, other accept errors).
pub const WARN_EVERY: Duration = Duration::from_secs(10);
/// How long a listener waits after an accept error that is not a descriptor shortage.
const OTHER_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The reserve kept free under a soft limit of `limit` descriptors: a sixteenth of it (where
/// nginx starts closing reusable connections), at least [`RESERVE_MIN`], at most half.
pub fn reserve_for(limit: u64) -> u64 {
    (limit / 16).max(RESERVE_MIN).min(limit / 2)
}

/// Which listener a connection came from: the proxy listener waits for the reserve
/// ([`Descriptors::room`]), the admin listener does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The client listener (`--listen`).
    Proxy,
    /// The admin listener (`--admin-listen`).
    Admin,
}

impl Listener {
    /// Its name in log lines: `proxy` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Proxy => "proxy",
            Listener::Admin => "admin",
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One warning at most every [`WARN_EVERY`].
#[derive(Debug, Default)]
struct Warning {
    last: Option<Instant>,
    hidden: u64,
}

impl Warning {
    /// Whether to warn now; if so, how many warnings were held back since the last one.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|t| now < t + WARN_EVERY) {
            self.hidden += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.hidden))
    }
}

/// The reusable connections, oldest first.
#[derive(Debug, Default)]
struct Queue {
    next: u64,
    by_age: BTreeMap<u64, Arc<Activity>>,
}

/// How long a listener waits before its next accept, after a failed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait ends then at the latest.
    pub until: Instant,
    /// It ends sooner when a connection told to close has closed (the count of those,
    /// [`Descriptors::settled`], is no longer this).
    pub on_close: Option<u64>,
}

/// The process's descriptors: the sockets it holds against the soft limit, and the queue of
/// reusable connections. One per process, shared by both listeners and the upstream pool.
#[derive(Debug)]
pub struct Descriptors {
    /// Sockets held: client connections of both listeners, upstream connections.
    open: AtomicU64,
    /// The soft limit (`u64::MAX` when unknown).
    limit: u64,
    /// The proxy listener accepts while fewer sockets than this are held.
    threshold: u64,
    /// Connections told to close that have not closed (nor declined) yet.
    closing: AtomicU64,
    /// Connections told to close that have closed or declined, ever.
    settled: AtomicU64,
    /// Notified when one of those settles.
    settle: Notify,
    queue: Mutex<Queue>,
    shortage_warning: Mutex<Warning>,
    error_warning: Mutex<Warning>,
    metrics: Option<Arc<Metrics>>,
}

impl Descriptors {
    /// Descriptors under a soft limit of `limit` (`None`: unknown, no reserve is kept);
    /// shortages are counted on `metrics`.
    pub fn new(limit: Option<u64>, metrics: Option<Arc<Metrics>>) -> Self {
        let (limit, threshold) = match limit {
            Some(l) => (l, l - reserve_for(l)),
            None => (u64::MAX, u64::MAX),
        };
        Descriptors {
            open: AtomicU64::new(0),
            limit,
            threshold,
            closing: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            settle: Notify::new(),
            queue: Mutex::default(),
            shortage_warning: Mutex::default(),
            error_warning: Mutex::default(),
            metrics,
        }
    }

    /// Descriptors under the process's soft limit now ([`current_limits`]).
    pub fn of_process(metrics: Option<Arc<Metrics>>) -> Self {
        Self::new(current_limits().map(|l| l.soft), metrics)
    }

    /// Sockets held now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections told to close that have closed or found themselves busy, ever.
    pub fn settled(&self) -> u64 {
        self.settled.load(Ordering::Acquire)
    }

    /// Counts an upstream socket until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>) -> Held {
        self.open.fetch_add(1, Ordering::Relaxed);
        Held(Arc::clone(self))
    }

    /// Counts a client connection just accepted until the returned guard is dropped, and
    /// queues it as reusable until its first request ([`Descriptors::in_use`]).
    pub fn accepted(self: &Arc<Self>, activity: &Arc<Activity>) -> Client {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.reusable(activity);
        Client {
            descriptors: Arc::clone(self),
            activity: Arc::clone(activity),
        }
    }

    /// Queues a connection as reusable, the newest (a connection parked between requests).
    pub fn reusable(&self, activity: &Arc<Activity>) {
        let mut queue = lock(&self.queue);
        let old = activity.reuse.key.load(Ordering::Relaxed);
        if old != 0 {
            queue.by_age.remove(&old);
        }
        queue.next += 1;
        let key = queue.next;
        queue.by_age.insert(key, Arc::clone(activity));
        activity.reuse.key.store(key, Ordering::Relaxed);
    }

    /// Takes a connection off the queue: a request came, or it resumed from the park. One
    /// atomic read when it is not queued (every request after a connection's first).
    pub fn in_use(&self, activity: &Activity) {
        if activity.reuse.key.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut queue = lock(&self.queue);
        let key = activity.reuse.key.swap(0, Ordering::AcqRel);
        if key != 0 {
            queue.by_age.remove(&key);
        }
    }

    /// A connection told to close was busy after all (a request had come): it stays open.
    pub fn declined(&self, activity: &Activity) {
        if activity.reuse.evicted.swap(false, Ordering::AcqRel) {
            self.settled_one();
        }
    }

    fn settled_one(&self) {
        self.closing.fetch_sub(1, Ordering::AcqRel);
        self.settled.fetch_add(1, Ordering::AcqRel);
        self.settle.notify_waiters();
    }

    /// Tells the oldest reusable connections to close: `max(min(32, queued / 8), 1)` of them
    /// (nginx's round). Returns how many.
    ///
    /// Each is marked told and closing before its key is cleared, under the queue's lock: a
    /// connection ending meanwhile either takes itself off the queue first (and is not
    /// told) or sees the mark when it finds its key cleared, and settles it ([`Client`]).
    fn drain(&self) -> usize {
        let picked: Vec<Arc<Activity>> = {
            let mut queue = lock(&self.queue);
            let n = (queue.by_age.len() / 8).clamp(1, DRAIN_MAX);
            std::iter::from_fn(|| queue.by_age.pop_first().map(|(_, a)| a))
                .take(n)
                .inspect(|a| {
                    self.closing.fetch_add(1, Ordering::AcqRel);
                    a.reuse.evicted.store(true, Ordering::Release);
                    a.reuse.key.store(0, Ordering::Release);
                })
                .collect()
        };
        for activity in &picked {
            activity.reuse.wake();
        }
        picked.len()
    }

    /// Waits, for the proxy listener, until the sockets held leave the reserve free,
    /// telling the oldest reusable connections to close as needed and waiting for them;
    /// with none to close, it checks again every [`PAUSE`]. Cancel-safe: dropped and called
    /// again, it does not tell more connections to close than the reserve needs.
    pub async fn room(&self) {
        // The common case, without touching the `Notify`'s waiter list (two locks).
        if self.open() < self.threshold {
            return;
        }
        let mut counted = false;
        loop {
            let mut settled = pin!(self.settle.notified());
            settled.as_mut().enable();
            let open = self.open();
            if open < self.threshold {
                return;
            }
            if !counted {
                counted = true;
                self.shortage(DescriptorShortage::Reserve, "closing idle connections");
            }
            if open.saturating_sub(self.closing.load(Ordering::Acquire)) >= self.threshold {
                self.drain();
            }
            let _ = tokio::time::timeout(PAUSE, settled).await;
        }
    }

    /// Counts a shortage met at `at`, and warns unless a warning was given less than
    /// [`WARN_EVERY`] ago.
    fn shortage(&self, at: DescriptorShortage, what: &str) {
        if let Some(m) = &self.metrics {
            m.descriptor_shortage(at);
        }
        if let Some(hidden) = lock(&self.shortage_warning).allow(Instant::now()) {
            tracing::warn!(
                at = at.as_str(),
                open_sockets = self.open(),
                limit = self.limit,
                reserve = self.limit - self.threshold,
                reusable = lock(&self.queue).by_age.len(),
                shortages_not_logged = hidden,
                "open files running out: {what}"
            );
        }
    }

    /// A listener's accept failed with `e`: a descriptor shortage (`EMFILE`, `ENFILE`) is
    /// counted and the oldest reusable connections are told to close; the listener then
    /// waits as the returned [`Backoff`] says. Another error waits 50 ms. Either warns at
    /// most every [`WARN_EVERY`].
    pub fn accept_failed(&self, e: &std::io::Error, listener: Listener) -> Backoff {
        let now = Instant::now();
        if !is_shortage(e) {
            if let Some(hidden) = lock(&self.error_warning).allow(now) {
                tracing::warn!(error = %e, errors_not_logged = hidden, "accept failed");
            }
            return Backoff {
                until: now + OTHER_ERROR_PAUSE,
                on_close: None,
            };
        }
        let at = match listener {
            Listener::Proxy => DescriptorShortage::Accept,
            Listener::Admin => DescriptorShortage::AdminAccept,
        };
        let since = self.settled();
        if self.drain() > 0 || self.closing.load(Ordering::Acquire) > 0 {
            self.shortage(at, "accept failed, closing idle connections");
            Backoff {
                until: now + PAUSE,
                on_close: Some(since),
            }
        } else {
            self.shortage(at, "accept failed, none idle: pausing accepts for 500 ms");
            Backoff {
                until: now + PAUSE,
                on_close: None,
            }
        }
    }

    /// An upstream connect failed with `e`: when that is a descriptor shortage, counts it,
    /// tells the oldest reusable connections to close and waits for one (until `deadline`
    /// or [`PAUSE`], whichever is sooner). Returns whether one closed, so that trying again
    /// may succeed.
    pub async fn connect_failed(&self, e: &std::io::Error, deadline: Instant) -> bool {
        if !is_shortage(e) {
            return false;
        }
        let since = self.settled();
        let closing = self.drain() > 0 || self.closing.load(Ordering::Acquire) > 0;
        self.shortage(
            DescriptorShortage::UpstreamConnect,
            if closing {
                "upstream connect failed, closing idle connections"
            } else {
                "upstream connect failed, none idle to close"
            },
        );
        if !closing {
            return false;
        }
        let backoff = Backoff {
            until: deadline.min(Instant::now() + PAUSE),
            on_close: Some(since),
        };
        self.wait(backoff).await;
        self.settled() != since
    }

    /// Waits as `backoff` says: until its time, or until a connection told to close has
    /// closed since.
    pub async fn wait(&self, backoff: Backoff) {
        let Some(since) = backoff.on_close else {
            tokio::time::sleep_until(backoff.until).await;
            return;
        };
        let mut sleep = pin!(tokio::time::sleep_until(backoff.until));
        loop {
            let mut settled = pin!(self.settle.notified());
            settled.as_mut().enable();
            if self.settled() != since {
                return;
            }
            tokio::select! {
                () = settled => {}
                () = sleep.as_mut() => return,
            }
        }
    }

    /// The next connection of `listener`: after the wait a failed accept asked for
    /// (`backoff`, cleared once waited), and, on the proxy listener, once the reserve is
    /// free ([`Descriptors::room`]). Cancel-safe, as `TcpListener::accept` is.
    ///
    /// # Errors
    /// `accept`'s; pass it to [`Descriptors::accept_failed`].
    pub async fn accept(
        &self,
        socket: &TcpListener,
        listener: Listener,
        backoff: &mut Option<Backoff>,
    ) -> std::io::Result<(TcpStream, std::net::SocketAddr)> {
        if let Some(b) = *backoff {
            self.wait(b).await;
            *backoff = None;
        }
        if listener == Listener::Proxy {
            self.room().await;
        }
        socket.accept().await
    }
}

/// Whether `e` says the process (`EMFILE`) or the system (`ENFILE`) is out of descriptors.
pub fn is_shortage(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// An upstream socket, counted while this lives.
#[derive(Debug)]
pub struct Held(Arc<Descriptors>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A client connection, counted while this lives, and taken off the queue of reusable ones
/// when it ends. Drop it after the socket ([`Client::serving`]).
#[derive(Debug)]
pub struct Client {
    descriptors: Arc<Descriptors>,
    activity: Arc<Activity>,
}

impl Client {
    /// The connection's task, `served`, holding this count: the task's future is dropped
    /// first (and the socket with it), then the count falls. No bigger than `served` and two
    /// pointers (an `async` block awaiting `served` would hold it twice).
    pub fn serving<F: Future>(self, served: F) -> Counted<F> {
        Counted {
            served,
            client: self,
        }
    }
}

pin_project_lite::pin_project! {
    /// A client connection's task with its [`Client`] count ([`Client::serving`]). Fields
    /// drop in order: the task's future, then the count.
    #[derive(Debug)]
    pub struct Counted<F> {
        #[pin]
        served: F,
        client: Client,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().served.poll(cx)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let d = &self.descriptors;
        d.in_use(&self.activity);
        d.open.fetch_sub(1, Ordering::Relaxed);
        if self.activity.reuse.evicted.swap(false, Ordering::AcqRel) {
            d.settled_one();
        }
    }
}

#[cfg(test)]
mod tests;
