//! Idle keep-alive connections, parked: after [`PARK_AFTER`] without a request, a client
//! connection's task takes the socket back from hyper, frees hyper's buffers, and waits for
//! the socket to become readable (or the idle timeout, or the drain) holding only the socket
//! and the framing guard's state; the next request starts a new hyper connection on it.
//!
//! hyper's HTTP/1 connection keeps an 8 KiB read buffer and an 8 KiB write buffer for as long
//! as it lives (`proto/h1/io.rs`, `INIT_BUFFER_SIZE`; `http1::Builder` has no option to
//! release them), so 10,000 idle keep-alive connections held 153 MiB, where nginx, which frees
//! a connection's buffers when its request is done (`ngx_http_set_keepalive`), holds 6 MiB.
//! Parking brings shedgate's cost per idle connection to the socket, its 512-byte task and
//! a few small allocations: about 1.5 KB of RSS each (nginx: about 0.7 KB), so that 10,000
//! idle connections take no more RSS in all than nginx's master and worker with theirs
//! (docs/benchmark-history.md has the figures).
//!
//! Taking the socket back uses hyper's own graceful close of an idle connection
//! (`Connection::graceful_shutdown`, which closes a connection at once when hyper is between
//! messages: the last answer written out, nothing of a next request read) with the IO's
//! shutdown turned into a no-op ([`Activity::parking`]), then `Connection::into_parts`. It
//! is only done when the connection is between messages in that sense
//! ([`Activity::between_requests`]): every request received whole (the framing guard's count)
//! has been handed to the service, every answer's body has ended, and the last write to the
//! socket did not block (hyper writes until its buffer is empty or the socket is full, so an
//! answer still being flushed to a slow reader keeps the connection as it is; an answer that
//! ends the connection then closes it as before).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::framing::Progress;
use super::reuse::Reuse;

/// How long a client connection waits between requests before it is parked. A connection
/// that carries a request every few milliseconds (a busy keep-alive sender) keeps its hyper
/// connection and never pays for a new one; one idle for a second has let go of its buffers.
/// nginx frees them as soon as a request is done; one second keeps the rebuild off busy
/// connections at the cost of holding 16 KiB for that second.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// One client connection's request and answer counts, shared by its service (requests in),
/// its answers' bodies (answers done) and its IO (the parking flag). All counts start at 0
/// at accept.
#[derive(Debug)]
pub struct Activity {
    /// Requests handed to the service.
    requests: AtomicU64,
    /// Answers the service gave (their heads, in order; bodies may still be running).
    responses: AtomicU64,
    /// Answers whose body has ended (or was dropped by hyper).
    answered: AtomicU64,
    /// When the last answer's body ended (or the connection was accepted): milliseconds
    /// after `since`.
    last_done_ms: AtomicU64,
    since: Instant,
    /// Set while the connection's task takes the socket back from hyper: the IO's shutdown
    /// then leaves the socket open.
    parking: AtomicBool,
    /// Whether the last write or flush to the socket blocked: hyper still holds answer bytes.
    write_blocked: AtomicBool,
    /// Whether the request last handed to the service was HTTP/1.0 (its answer is the next
    /// one given: see [`Activity::response`]).
    http10: AtomicBool,
    /// The connection's place among the reusable ones, closed first when descriptors run
    /// low (`edge::descriptors`).
    pub reuse: Reuse,
}

impl Activity {
    /// A connection accepted now.
    pub fn new() -> Self {
        Activity {
            requests: AtomicU64::new(0),
            responses: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            last_done_ms: AtomicU64::new(0),
            since: Instant::now(),
            parking: AtomicBool::new(false),
            write_blocked: AtomicBool::new(false),
            http10: AtomicBool::new(false),
            reuse: Reuse::default(),
        }
    }

    /// Records whether a write or flush to the socket blocked (`Poll::Pending`).
    pub fn write_blocked(&self, blocked: bool) {
        self.write_blocked.store(blocked, Ordering::Relaxed);
    }

    /// A request of HTTP `version` reached the service.
    pub fn request(&self, version: http::Version) {
        self.http10
            .store(version == http::Version::HTTP_10, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the request being answered (the last to reach the service) is HTTP/1.0.
    pub fn answering_http10(&self) -> bool {
        self.http10.load(Ordering::Relaxed)
    }

    /// The service gave an answer: returns its index, 0 for the connection's first. hyper
    /// answers a connection's requests one at a time and in order, so the n-th answer is the
    /// n-th request's.
    pub fn response(&self) -> u64 {
        self.responses.fetch_add(1, Ordering::Relaxed)
    }

    /// An answer's body ended.
    fn answer_done(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_done_ms.store(ms, Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Release);
    }

    /// Requests handed to the service whose answers have not ended yet: an HTTP/2
    /// connection's open streams (`edge::serve::h2`).
    pub fn in_flight(&self) -> u64 {
        let answered = self.answered.load(Ordering::Acquire);
        self.requests
            .load(Ordering::Relaxed)
            .saturating_sub(answered)
    }

    /// When the connection last became idle: the end of its last answer, or the accept.
    pub fn idle_since(&self) -> Instant {
        self.since + Duration::from_millis(self.last_done_ms.load(Ordering::Relaxed))
    }

    /// Whether the connection is between requests with nothing of the next one read:
    /// `progress` (the framing guard's) is at a message boundary after exactly as many
    /// requests as reached the service, every one of them has been answered (its body ended),
    /// and the last write to the socket did not block.
    pub fn between_requests(&self, progress: Progress) -> bool {
        let answered = self.answered.load(Ordering::Acquire);
        let requests = self.requests.load(Ordering::Relaxed);
        !self.write_blocked.load(Ordering::Relaxed)
            && matches!(progress, Progress::Between(n) if n == requests && answered == requests)
    }

    /// Sets or clears the parking flag (see [`Activity::parking`]).
    pub fn set_parking(&self, parking: bool) {
        self.parking.store(parking, Ordering::Relaxed);
    }

    /// Whether the connection's task is taking the socket back from hyper: the IO's
    /// shutdown must leave the socket open.
    pub fn parking(&self) -> bool {
        self.parking.load(Ordering::Relaxed)
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

pin_project! {
    /// An answer's body that tells the connection's [`Activity`] when it is done: when hyper
    /// drops it (its last frame taken into hyper's write buffer, or the connection failed).
    pub struct Answer<B> {
        #[pin]
        body: B,
        activity: Option<std::sync::Arc<Activity>>,
    }

    impl<B> PinnedDrop for Answer<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(a) = this.project().activity.take() {
                a.answer_done();
            }
        }
    }
}

impl<B> Answer<B> {
    /// Wraps `body`, an answer on the connection of `activity`.
    pub fn new(body: B, activity: std::sync::Arc<Activity>) -> Self {
        Answer {
            body,
            activity: Some(activity),
        }
    }
}

/// A request handed to the service on an HTTP/2 connection, until its answer's body takes
/// over ([`Pending::answer`]): dropped before that (the client reset the stream, or the
/// connection ended), it counts as answered, so that the connection's
/// [`Activity::in_flight`] falls back when streams end without an answer.
#[derive(Debug)]
pub struct Pending(Option<std::sync::Arc<Activity>>);

impl Pending {
    /// A request on the connection of `activity` (counted by [`Activity::request`]).
    pub fn new(activity: std::sync::Arc<Activity>) -> Self {
        Pending(Some(activity))
    }

    /// The request's answer: its body ends the request's count when hyper drops it.
    pub fn answer<B>(mut self, body: B) -> Answer<B> {
        Answer {
            body,
            activity: self.0.take(),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.answer_done();
        }
    }
}

impl<B: Body> Body for Answer<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn between_requests_needs_every_answer_done_and_nothing_left_to_write() {
        let a = std::sync::Arc::new(Activity::new());
        assert!(a.between_requests(Progress::Between(0)), "fresh connection");
        assert!(!a.between_requests(Progress::InHead(0)), "a head part-way");
        a.request(http::Version::HTTP_11);
        assert!(!a.between_requests(Progress::Between(1)), "answer pending");
        let body = Answer::new(http_body_util::Empty::<Bytes>::new(), a.clone());
        assert!(!a.between_requests(Progress::Between(1)), "body not ended");
        a.write_blocked(true);
        drop(body);
        assert!(
            !a.between_requests(Progress::Between(1)),
            "answer still flushing"
        );
        a.write_blocked(false);
        assert!(a.between_requests(Progress::Between(1)));
        assert!(
            !a.between_requests(Progress::Between(2)),
            "a request not yet served"
        );
        assert!(!a.between_requests(Progress::InBody(1)));
        assert!(!a.between_requests(Progress::Unknown));
    }
}
