//! The request-smuggling guard: reads each request head on the raw connection bytes, before
//! hyper parses them, and flags framing that is ambiguous (RFC 9112 section 6.3).
//!
//! Why here and not in the middleware: for a request carrying both `Transfer-Encoding` and
//! `Content-Length`, hyper (correctly, per RFC 9112 section 6.3) lets `Transfer-Encoding`
//! win, drops `Content-Length` from the header map and closes the connection after the
//! response. The request that reaches the service then looks clean, so only the raw bytes can
//! tell that the sender framed it two ways — which is what a smuggling attempt does, and what
//! the proxy answers with 400 without forwarding anything.
//!
//! The tracker follows message boundaries (head, then a `Content-Length` body or chunked
//! body) and records one verdict per request head, in order. hyper serves an HTTP/1.1
//! connection's requests one at a time and in order, so the service takes the verdicts in
//! the same order ([`Verdicts::next`]). It does not parse a head a second time: one scan
//! of its lines finds where it ends (where hyper's parser ends every head it accepts) and
//! what the rules read (`framing/head.rs`). If the tracker ever cannot follow the stream (a
//! head it sees hyper would refuse, a `CONNECT`), it stops recording and every later request
//! is passed without a verdict: hyper's own parser still applies.

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};

use head::{HeadFacts, Scan};

pub use crate::metrics::ProtocolMismatch as WrongProtocol;

/// Largest request head the tracker buffers, bytes; past this it stops following the
/// connection. `--max-head` may not exceed it, so hyper refuses (431) every head the tracker
/// could not follow.
pub const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug)]
enum Phase {
    /// Reading a request head.
    Head,
    /// Skipping a `Content-Length` body: bytes left.
    Body(u64),
    /// Chunked body: reading a chunk-size line.
    ChunkSize,
    /// Chunked body: data bytes left in the current chunk, then its CRLF.
    ChunkData(u64),
    /// Chunked body: the CRLF after a chunk's data (bytes of it left).
    ChunkEnd(u8),
    /// Chunked body: trailer section, until an empty line.
    Trailers,
    /// Not following the connection any more.
    Lost,
}

/// What a connection's first bytes say: `Some(Some(p))` another protocol than HTTP/1.x (a
/// peer told this port speaks something else), `Some(None)` HTTP/1.x (or at least not one of
/// these), `None` too few bytes to tell (12 always tell).
///
/// - The HTTP/2 connection preface, `PRI * HTTP/2.0` (RFC 9113 section 3.4): an ingress or
///   client told the port speaks h2c (go#80416, istio#19966).
/// - A TLS handshake record: content type 22, version 3.x (RFC 8446 section 5.1): a peer told
///   the port speaks HTTPS (eks-anywhere#5780).
pub fn sniff(first: &[u8]) -> Option<Option<WrongProtocol>> {
    const H2: &[u8] = b"PRI * HTTP/2";
    match first {
        [] | [0x16] => None,
        [0x16, 0x03, ..] => Some(Some(WrongProtocol::TlsClientHello)),
        _ if first.len() < H2.len() && H2.starts_with(first) => None,
        _ if first.starts_with(H2) => Some(Some(WrongProtocol::Http2Preface)),
        _ => Some(None),
    }
}

#[derive(Debug)]
struct Tracker {
    /// What the connection's first bytes said (`None`: not known yet).
    sniffed: Option<Option<WrongProtocol>>,
    /// The connection's first bytes while too few have come to tell
    /// ([`sniff`] decides by the 12th), and how many.
    first: ([u8; 12], usize),
    phase: Phase,
    /// Bytes read but not consumed yet: only a partial head or chunk line waits here; body
    /// bytes are skipped as they arrive.
    pending: Vec<u8>,
    verdicts: VecDeque<Option<HeadVerdict>>,
    /// Longest header line accepted, bytes (name, `: `, value and CRLF).
    max_line: usize,
    /// Requests received whole (head and body), in order.
    complete: u64,
}

/// What is wrong with one request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadVerdict {
    /// Ambiguous framing: why.
    Framing(String),
    /// A header line longer than the limit (`--max-header-line`, bytes): 431.
    LineTooLong(usize),
}

/// The verdicts of one connection's request heads, in order: `Some(why)` for ambiguous
/// framing. Cheap to clone; shared between the connection's IO and its service.
#[derive(Debug, Clone)]
pub struct Verdicts(Arc<Mutex<Tracker>>);

impl Verdicts {
    /// The verdict of the next request the service sees (`None`: clean, or not known).
    pub fn next(&self) -> Option<HeadVerdict> {
        self.0.lock().ok()?.verdicts.pop_front().flatten()
    }

    /// Another protocol than HTTP/1.x, if the connection's first bytes were one.
    pub fn wrong_protocol(&self) -> Option<WrongProtocol> {
        self.0.lock().ok()?.sniffed.flatten()
    }

    /// Where the client's bytes stand, as far as the tracker can tell.
    pub fn progress(&self) -> Progress {
        self.0.lock().map_or(Progress::Unknown, |t| t.progress())
    }

    /// Frees what the tracker holds for a partial head, when it holds none (an idle
    /// connection, `edge::keepalive`).
    pub fn release(&self) {
        if let Ok(mut t) = self.0.lock() {
            if t.pending.is_empty() {
                t.pending = Vec::new();
            }
            t.verdicts.shrink_to_fit();
        }
    }
}

/// Where a connection's request bytes stand. Each variant carries how many requests have been
/// received whole (head and body), counting from 0 at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// At a message boundary: nothing of the next request has arrived.
    Between(u64),
    /// Part of a request head has arrived.
    InHead(u64),
    /// A request's body is still arriving.
    InBody(u64),
    /// The tracker stopped following the connection (see the module docs).
    Unknown,
}

impl Progress {
    /// Whether the request with this 0-based index on the connection has been received
    /// whole; `None` when the tracker cannot tell.
    pub fn received(self, index: u64) -> Option<bool> {
        match self {
            Progress::Between(n) | Progress::InHead(n) | Progress::InBody(n) => Some(n > index),
            Progress::Unknown => None,
        }
    }
}

/// The verdict of one request, carried in its extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbiguousFraming(pub String);

/// A request with a header line over the limit (bytes), carried in its extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderLineTooLong(pub usize);

/// Wraps a connection's IO; feeds every byte read to the tracker.
#[derive(Debug)]
pub struct FramingGuard<IO> {
    io: IO,
    tracker: Verdicts,
    /// Another protocol on the first bytes, until taken ([`FramingGuard::take_mismatch`]).
    mismatch: Option<WrongProtocol>,
    /// The tracker's progress after the last read, kept so the connection's own IO reads it
    /// without taking the tracker's lock a second time per read.
    progress: Progress,
}

impl<IO> FramingGuard<IO> {
    /// Guards `io`; the returned [`Verdicts`] go to the connection's service. A header line
    /// longer than `max_line` bytes is flagged too (nginx's default per line is 8 KiB; hyper
    /// has no per-line limit, only one per head).
    pub fn new(io: IO, max_line: usize) -> (Self, Verdicts) {
        let tracker = Verdicts(Arc::new(Mutex::new(Tracker {
            sniffed: None,
            first: ([0; 12], 0),
            phase: Phase::Head,
            pending: Vec::new(),
            verdicts: VecDeque::new(),
            max_line,
            complete: 0,
        })));
        (
            FramingGuard {
                io,
                tracker: tracker.clone(),
                mismatch: None,
                progress: Progress::Between(0),
            },
            tracker,
        )
    }

    /// Where the client's bytes stood after the last read (see [`Verdicts::progress`]).
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Another protocol than HTTP/1.x, once, as soon as the first bytes have said so.
    pub fn take_mismatch(&mut self) -> Option<WrongProtocol> {
        self.mismatch.take()
    }

    /// The wrapped IO.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The wrapped IO, mutably (not to be read from: the guard would miss the bytes).
    pub fn get_mut(&mut self) -> &mut IO {
        &mut self.io
    }
}

impl<IO: Read + Unpin> Read for FramingGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        // Read into a scratch buffer we can inspect, then copy out. hyper's cursor does not
        // expose what a read filled, and reads are small (hyper's buffer grows to 8 KiB+).
        // The scratch is left uninitialised (`ReadBuf::uninit`): zeroing 8 KiB per read was
        // 1.2% of the proxy's CPU under the throughput harness (docs/benchmark-history.md).
        let mut scratch = [const { MaybeUninit::<u8>::uninit() }; 8192];
        let cap = buf.remaining().min(scratch.len());
        let mut inner = hyper::rt::ReadBuf::uninit(&mut scratch[..cap]);
        match Pin::new(&mut this.io).poll_read(cx, inner.unfilled()) {
            Poll::Ready(Ok(())) => {
                let filled = inner.filled();
                if let Ok(mut t) = this.tracker.0.lock() {
                    let unknown = t.sniffed.is_none();
                    t.feed(filled);
                    this.progress = t.progress();
                    if unknown {
                        this.mismatch = t.sniffed.flatten();
                    }
                }
                buf.put_slice(filled);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<IO: Write + Unpin> Write for FramingGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

impl Tracker {
    fn progress(&self) -> Progress {
        match self.phase {
            Phase::Lost => Progress::Unknown,
            Phase::Head if self.pending.is_empty() => Progress::Between(self.complete),
            Phase::Head => Progress::InHead(self.complete),
            _ => Progress::InBody(self.complete),
        }
    }

    fn feed(&mut self, input: &[u8]) {
        if self.sniffed.is_none() {
            // Once per connection: its first bytes, however the first reads split them.
            let (head, len) = &mut self.first;
            let take = input.len().min(head.len() - *len);
            head[*len..*len + take].copy_from_slice(&input[..take]);
            *len += take;
            self.sniffed = sniff(&head[..*len]);
        }
        if matches!(self.phase, Phase::Lost) {
            return;
        }
        // Bytes are parsed where they lie: only what is left of a partial head or chunk line
        // is kept for the next read (copying every read into `pending` first was a memcpy and,
        // per connection, an allocation that the throughput profile showed).
        if self.pending.is_empty() {
            let used = self.consume(input);
            if !matches!(self.phase, Phase::Lost) {
                self.pending.extend_from_slice(&input[used..]);
            }
        } else {
            let mut pending = std::mem::take(&mut self.pending);
            pending.extend_from_slice(input);
            let used = self.consume(&pending);
            if !matches!(self.phase, Phase::Lost) {
                pending.drain(..used);
                self.pending = pending;
            }
        }
    }

    /// Follows the connection through `buf`; returns how many bytes were used (the rest is a
    /// partial head or chunk line).
    fn consume(&mut self, buf: &[u8]) -> usize {
        let mut pos = 0;
        while pos < buf.len() {
            let avail = buf.len() - pos;
            match self.phase {
                Phase::Lost => break,
                Phase::Head => match HeadFacts::scan(&buf[pos..], self.max_line) {
                    Scan::Complete(n, facts) => {
                        let verdict = facts
                            .judge()
                            .map(HeadVerdict::Framing)
                            .or_else(|| self.line_too_long(&facts));
                        let next = facts.next_phase();
                        self.verdicts.push_back(verdict);
                        if matches!(next, Phase::Head) {
                            self.complete += 1;
                        }
                        self.phase = next;
                        pos += n;
                    }
                    Scan::Partial if avail <= MAX_HEAD => break,
                    _ => self.phase = Phase::Lost,
                },
                Phase::Body(left) => {
                    let n = left.min(avail as u64);
                    pos += usize::try_from(n).unwrap_or(avail);
                    self.phase = if left == n {
                        self.complete += 1;
                        Phase::Head
                    } else {
                        Phase::Body(left - n)
                    };
                }
                Phase::ChunkSize | Phase::Trailers => {
                    let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
                        if avail > MAX_HEAD {
                            self.phase = Phase::Lost;
                        }
                        break;
                    };
                    let raw = &buf[pos..pos + nl];
                    pos += nl + 1;
                    // A bare LF ends no line hyper reads (RFC 9112 section 7.1: CRLF).
                    let Some(raw) = raw.strip_suffix(b"\r") else {
                        self.phase = Phase::Lost;
                        break;
                    };
                    let line = String::from_utf8_lossy(raw).into_owned();
                    self.chunk_line(&line);
                }
                Phase::ChunkData(left) => {
                    let n = left.min(avail as u64);
                    pos += usize::try_from(n).unwrap_or(avail);
                    self.phase = if left == n {
                        Phase::ChunkEnd(2)
                    } else {
                        Phase::ChunkData(left - n)
                    };
                }
                Phase::ChunkEnd(left) => {
                    let n = usize::from(left).min(avail);
                    pos += n;
                    #[expect(clippy::cast_possible_truncation, reason = "n is at most left, a u8")]
                    let left = left - n as u8;
                    self.phase = if left == 0 {
                        Phase::ChunkSize
                    } else {
                        Phase::ChunkEnd(left)
                    };
                }
            }
        }
        pos.min(buf.len())
    }

    fn line_too_long(&self, facts: &HeadFacts<'_>) -> Option<HeadVerdict> {
        facts
            .line_too_long
            .then_some(HeadVerdict::LineTooLong(self.max_line))
    }

    fn chunk_line(&mut self, text: &str) {
        if matches!(self.phase, Phase::Trailers) {
            if text.is_empty() {
                self.complete += 1;
                self.phase = Phase::Head;
            }
            return;
        }
        // Hex digits only, as hyper reads them: `from_str_radix` alone would take a `+5`.
        let size = text
            .split(';')
            .next()
            .unwrap_or("")
            .trim_end_matches([' ', '\t']);
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
            self.phase = Phase::Lost;
            return;
        }
        match u64::from_str_radix(size, 16) {
            Ok(0) => self.phase = Phase::Trailers,
            Ok(n) => self.phase = Phase::ChunkData(n),
            Err(_) => self.phase = Phase::Lost,
        }
    }
}

/// The framing rule, from a request's `Transfer-Encoding` values and whether it has a
/// `Content-Length`: `Some(why)` when ambiguous (RFC 9112 sections 6.1 and 6.3) — both
/// headers, several `Transfer-Encoding` lines, or a coding that is not exactly `chunked`.
/// The raw-bytes guard applies it to every head; the middleware applies it again to the
/// parsed headers for connections the guard stopped following.
pub fn judge_framing(transfer_encoding: &[&[u8]], has_content_length: bool) -> Option<String> {
    if !transfer_encoding.is_empty() && has_content_length {
        return Some("Transfer-Encoding beside Content-Length (request smuggling)".to_owned());
    }
    if transfer_encoding.len() > 1 {
        return Some("more than one Transfer-Encoding header line".to_owned());
    }
    transfer_encoding
        .first()
        .filter(|v| !v.eq_ignore_ascii_case(b"chunked"))
        .map(|v| {
            format!(
                "Transfer-Encoding {:?} is not exactly \"chunked\"",
                String::from_utf8_lossy(v)
            )
        })
}

mod head;
#[cfg(test)]
mod tests;
