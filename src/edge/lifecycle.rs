//! A client connection's lifecycle on its raw bytes, around the framing guard: the deadline
//! for a request head once it has started, and the lingering close after an early answer.
//!
//! hyper has one timer for the wait for a head, armed from accept or from the end of the
//! previous response, so it cannot tell an idle keep-alive connection from a slow head.
//! shedgate sets hyper's timer to the idle timeout (`--idle-timeout`, 75 s, above the 60 s
//! that nginx, AWS ALB and most balancers keep backend connections) and cuts a head that has
//! started but not finished after `--header-read-timeout` here (docs/responses.md
//! "Connections").
//!
//! The lingering close is Apache's and nginx's (`lingering_close`, `lingering_time` 30 s,
//! `lingering_timeout` 5 s): when shedgate answers before the request body has arrived (413,
//! a 503 decided from the head), closing at once would leave the client's unread bytes in
//! the kernel, which then resets the connection, and the reset can destroy the answer before
//! a client that writes the whole body before it reads has seen it. So the write side is shut
//! down first (the client sees the answer and EOF), and input is read and discarded until
//! the request ends, the client closes, or the bounds below.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use tokio::time::{Instant, Sleep};

use super::framing::{FramingGuard, Progress};
use super::keepalive::Activity;
use crate::metrics::{CloseReason, Metrics};

/// Longest lingering close: nginx's `lingering_time` default.
pub const LINGER_TIME: Duration = Duration::from_secs(30);
/// A lingering close ends after this long without input: nginx's `lingering_timeout` default.
pub const LINGER_IDLE: Duration = Duration::from_secs(5);
/// Most input a lingering close discards, bytes (64 MiB: 13 s of a 40 Mbit/s upload).
pub const LINGER_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug)]
enum Linger {
    /// Not closing yet.
    Open,
    /// Discarding input after the write side was shut down: bytes so far, and when it ends
    /// at the latest.
    Draining { read: u64, until: Instant },
    /// Closed.
    Done,
}

/// A client connection's IO: the framing guard plus the head deadline and the lingering
/// close. Timers are tokio's, so tests drive them with paused time.
#[derive(Debug)]
pub struct ClientIo<IO> {
    io: FramingGuard<IO>,
    header_read_timeout: Duration,
    /// Armed while a head is part-way, and while lingering; reused across heads. Made on
    /// first use (most heads arrive in one read and never arm it) and dropped when the
    /// connection is parked (with the lifecycle: [`ClientIo::into_guard`]).
    timer: Option<Pin<Box<Sleep>>>,
    /// The head the timer is armed for: how many requests had been received whole when it
    /// started (`None`: no head part-way).
    head: Option<u64>,
    linger: Linger,
    metrics: Option<std::sync::Arc<Metrics>>,
    /// The connection's counts and parking flag (`edge::keepalive`).
    activity: std::sync::Arc<Activity>,
    /// Bytes to read again before the socket's, after the connection was parked.
    /// Bytes hyper had read but not used when the connection was taken back from it
    /// (`edge::keepalive`), read again before the socket's: the framing guard has seen them
    /// already. Empty when the connection was parked at a message boundary; kept so that no
    /// byte can be lost if hyper and the framing guard ever disagree.
    unread: bytes::Bytes,
}

impl<IO> ClientIo<IO> {
    /// Wraps a guarded connection, reading where its bytes stand from the guard. A head part-way for
    /// longer than `header_read_timeout` fails the read (hyper closes the connection without
    /// an answer, as nginx does for `client_header_timeout`). Closes are counted on
    /// `metrics` when given. While `activity` says the connection is being parked, shutdown
    /// leaves the socket open.
    pub fn new(
        io: FramingGuard<IO>,
        header_read_timeout: Duration,
        metrics: Option<std::sync::Arc<Metrics>>,
        activity: std::sync::Arc<Activity>,
    ) -> Self {
        ClientIo {
            io,
            header_read_timeout,
            timer: None,
            head: None,
            linger: Linger::Open,
            metrics,
            activity,
            unread: bytes::Bytes::new(),
        }
    }

    /// Bytes hyper had read but not used when the connection was taken back from it: they
    /// are read again first (the framing guard has seen them already).
    pub fn unread(&mut self, bytes: bytes::Bytes) {
        self.unread = bytes;
    }

    /// Starts the head's deadline from now.
    fn arm(&mut self) {
        let deadline = Instant::now() + self.header_read_timeout;
        self.reset(deadline);
    }

    /// Sets the timer to `deadline`, making it if need be.
    fn reset(&mut self, deadline: Instant) {
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Polls the timer; an unarmed timer never fires.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.timer {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// The guarded connection back, when nothing is under way on it (parked between
    /// requests, `edge::keepalive`): no head part-way, no lingering close, nothing unread.
    /// Otherwise `Err(self)`, unchanged.
    #[expect(clippy::result_large_err, reason = "Err hands the lifecycle back")]
    pub fn into_guard(self) -> Result<FramingGuard<IO>, Self> {
        if self.head.is_none() && matches!(self.linger, Linger::Open) && self.unread.is_empty() {
            Ok(self.io)
        } else {
            Err(self)
        }
    }

    fn count(&self, reason: CloseReason) {
        if let Some(m) = &self.metrics {
            m.connection_closed(reason);
        }
    }
}

impl<IO: Read + Unpin> Read for ClientIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.unread.is_empty() {
            let mut buf = buf;
            let n = buf.remaining().min(this.unread.len());
            buf.put_slice(&this.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if let Some(wrong) = this.io.take_mismatch()
                    && let Some(m) = &this.metrics
                {
                    m.protocol_mismatch(wrong);
                }
                match this.io.progress() {
                    // A new head: one read can end a head and start the next.
                    Progress::InHead(n) if this.head != Some(n) => {
                        this.head = Some(n);
                        this.arm();
                    }
                    Progress::InHead(_) => {}
                    _ => this.head = None,
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.head.is_some() && this.poll_timer(cx).is_ready() {
                    this.head = None;
                    this.count(CloseReason::HeaderTimeout);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "request head not complete within the header read timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<IO: Read + Write + Unpin> Write for ClientIo<IO> {
    /// Writing an answer restarts the deadline of a head that arrived (pipelined) while the
    /// answer was being prepared: its time counts from when the connection is free for it.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.head.is_some() {
            this.arm();
        }
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        this.activity.write_blocked(written.is_pending());
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        this.activity.write_blocked(flushed.is_pending());
        flushed
    }

    /// Shuts the write side down; then, if the client is still sending a request, lingers.
    /// While the connection is being parked, does nothing: the socket stays open.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.activity.parking() {
            return Poll::Ready(Ok(()));
        }
        loop {
            match &mut this.linger {
                Linger::Done => return Poll::Ready(Ok(())),
                Linger::Open => {
                    let sending = !matches!(this.io.progress(), Progress::Between(_));
                    ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
                    if !sending {
                        this.linger = Linger::Done;
                        continue;
                    }
                    let now = Instant::now();
                    this.linger = Linger::Draining {
                        read: 0,
                        until: now + LINGER_TIME,
                    };
                    this.reset(now + LINGER_IDLE);
                }
                Linger::Draining { read, until } => {
                    let mut scratch = [0u8; 8192];
                    let mut chunk = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut this.io).poll_read(cx, chunk.unfilled()) {
                        Poll::Ready(Ok(())) if !chunk.filled().is_empty() => {
                            *read += chunk.filled().len() as u64;
                            let ended = matches!(this.io.progress(), Progress::Between(_));
                            if ended || *read >= LINGER_BYTES {
                                this.linger = Linger::Done;
                            } else {
                                let idle_end = (Instant::now() + LINGER_IDLE).min(*until);
                                this.reset(idle_end);
                            }
                        }
                        // EOF or an error: the client is gone.
                        Poll::Ready(_) => this.linger = Linger::Done,
                        Poll::Pending => {
                            ready!(this.poll_timer(cx));
                            this.linger = Linger::Done;
                        }
                    }
                }
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.head.is_some() {
            this.arm();
        }
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.activity.write_blocked(written.is_pending());
        written
    }
}
