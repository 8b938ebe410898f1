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
//! the same order ([`Verdicts::next`]). If the tracker ever cannot follow the stream (a head
//! it cannot parse, an upgrade), it stops recording and every later request is passed
//! without a verdict: hyper's own parser still applies.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};

/// Largest request head the tracker buffers (hyper's default buffer limit is larger; past
/// this the tracker stops following the connection).
const MAX_HEAD: usize = 64 * 1024;
/// Most header lines the tracker parses.
const MAX_HEADERS: usize = 128;

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

#[derive(Debug)]
struct Tracker {
    phase: Phase,
    line: Vec<u8>,
    verdicts: VecDeque<Option<String>>,
}

/// The verdicts of one connection's request heads, in order: `Some(why)` for ambiguous
/// framing. Cheap to clone; shared between the connection's IO and its service.
#[derive(Debug, Clone)]
pub struct Verdicts(Arc<Mutex<Tracker>>);

impl Verdicts {
    /// The verdict of the next request the service sees (`None`: clean, or not known).
    pub fn next(&self) -> Option<String> {
        self.0.lock().ok()?.verdicts.pop_front().flatten()
    }
}

/// The verdict of one request, carried in its extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbiguousFraming(pub String);

/// Wraps a connection's IO; feeds every byte read to the tracker.
#[derive(Debug)]
pub struct FramingGuard<IO> {
    io: IO,
    tracker: Verdicts,
}

impl<IO> FramingGuard<IO> {
    /// Guards `io`; the returned [`Verdicts`] go to the connection's service.
    pub fn new(io: IO) -> (Self, Verdicts) {
        let tracker = Verdicts(Arc::new(Mutex::new(Tracker {
            phase: Phase::Head,
            line: Vec::new(),
            verdicts: VecDeque::new(),
        })));
        (
            FramingGuard {
                io,
                tracker: tracker.clone(),
            },
            tracker,
        )
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
        let mut scratch = [0u8; 8192];
        let cap = buf.remaining().min(scratch.len());
        let mut inner = hyper::rt::ReadBuf::new(&mut scratch[..cap]);
        match Pin::new(&mut this.io).poll_read(cx, inner.unfilled()) {
            Poll::Ready(Ok(())) => {
                let filled = inner.filled();
                if let Ok(mut t) = this.tracker.0.lock() {
                    t.feed(filled);
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

/// End (exclusive) of the first empty line at or after `from`: CRLF CRLF, or the bare-LF
/// form hyper also accepts.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let tail = buf.get(from..)?;
    let crlf = tail
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = tail.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let end = match (crlf, lf) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    Some(from + end)
}

impl Tracker {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.phase {
                Phase::Lost => return,
                Phase::Head => {
                    if self.line.is_empty() {
                        // Empty lines before a request line are ignored (RFC 9112 section 2.2).
                        let k = bytes
                            .iter()
                            .take_while(|&&b| b == b'\r' || b == b'\n')
                            .count();
                        bytes = &bytes[k..];
                        if bytes.is_empty() {
                            return;
                        }
                    }
                    let before = self.line.len();
                    self.push_line(bytes);
                    let Some(end) = head_end(&self.line, before.saturating_sub(3)) else {
                        return;
                    };
                    // The terminator ends in a byte of this read, so `end > before`.
                    bytes = &bytes[end - before..];
                    self.line.truncate(end);
                    let head = std::mem::take(&mut self.line);
                    self.head(&head);
                }
                Phase::Body(left) => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
                    bytes = &bytes[n..];
                    let left = left - n as u64;
                    self.phase = if left == 0 {
                        Phase::Head
                    } else {
                        Phase::Body(left)
                    };
                }
                Phase::ChunkSize | Phase::Trailers => {
                    let Some(nl) = bytes.iter().position(|&b| b == b'\n') else {
                        self.push_line(bytes);
                        return;
                    };
                    self.push_line(&bytes[..=nl]);
                    bytes = &bytes[nl + 1..];
                    let line = std::mem::take(&mut self.line);
                    self.chunk_line(&line);
                }
                Phase::ChunkData(left) => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
                    bytes = &bytes[n..];
                    let left = left - n as u64;
                    self.phase = if left == 0 {
                        Phase::ChunkEnd(2)
                    } else {
                        Phase::ChunkData(left)
                    };
                }
                Phase::ChunkEnd(left) => {
                    let n = usize::from(left).min(bytes.len());
                    bytes = &bytes[n..];
                    #[allow(clippy::cast_possible_truncation)]
                    let left = left - n as u8;
                    self.phase = if left == 0 {
                        Phase::ChunkSize
                    } else {
                        Phase::ChunkEnd(left)
                    };
                }
            }
        }
    }

    fn push_line(&mut self, bytes: &[u8]) {
        if self.line.len() + bytes.len() > MAX_HEAD {
            self.phase = Phase::Lost;
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn head(&mut self, head: &[u8]) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => {
                self.phase = Phase::Lost;
                return;
            }
        }
        let mut te = Vec::new();
        let mut cl = Vec::new();
        let mut upgrade = req.method == Some("CONNECT");
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                te.push(h.value);
            } else if h.name.eq_ignore_ascii_case("content-length") {
                cl.push(h.value);
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                upgrade = true;
            }
        }
        let verdict = if !te.is_empty() && !cl.is_empty() {
            Some("Transfer-Encoding beside Content-Length (request smuggling)".to_owned())
        } else if te.len() > 1 {
            Some("more than one Transfer-Encoding header line".to_owned())
        } else {
            te.first()
                .filter(|v| !v.eq_ignore_ascii_case(b"chunked"))
                .map(|v| {
                    format!(
                        "Transfer-Encoding {:?} is not exactly \"chunked\"",
                        String::from_utf8_lossy(v)
                    )
                })
        };
        self.verdicts.push_back(verdict);
        if upgrade {
            self.phase = Phase::Lost;
        } else if let Some(v) = te.last() {
            let chunked = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.rsplit(',').next())
                .is_some_and(|s| s.trim().eq_ignore_ascii_case("chunked"));
            // A final coding other than chunked: hyper refuses it and closes.
            self.phase = if chunked {
                Phase::ChunkSize
            } else {
                Phase::Lost
            };
        } else if let Some(v) = cl.first() {
            match std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                Some(0) => self.phase = Phase::Head,
                Some(n) => self.phase = Phase::Body(n),
                None => self.phase = Phase::Lost,
            }
        } else {
            self.phase = Phase::Head;
        }
    }

    fn chunk_line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\r', '\n']);
        if matches!(self.phase, Phase::Trailers) {
            if text.is_empty() {
                self.phase = Phase::Head;
            }
            return;
        }
        let size = text.split(';').next().unwrap_or("").trim();
        match u64::from_str_radix(size, 16) {
            Ok(0) => self.phase = Phase::Trailers,
            Ok(n) => self.phase = Phase::ChunkData(n),
            Err(_) => self.phase = Phase::Lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdicts(stream: &[u8], split_every: usize) -> Vec<Option<String>> {
        let mut t = Tracker {
            phase: Phase::Head,
            line: Vec::new(),
            verdicts: VecDeque::new(),
        };
        for chunk in stream.chunks(split_every) {
            t.feed(chunk);
        }
        t.verdicts.into_iter().collect()
    }

    const PIPELINE: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n\
GET /c HTTP/1.1\r\nHost: x\r\n\r\n\
POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";

    #[test]
    fn follows_pipelined_requests_at_any_split() {
        for split in [1, 2, 3, 7, 64, 10_000] {
            let v = verdicts(PIPELINE, split);
            assert_eq!(v.len(), 4, "split {split}");
            assert!(v[..3].iter().all(Option::is_none), "split {split}: {v:?}");
            assert!(
                v[3].as_deref().is_some_and(|w| w.contains("beside")),
                "{v:?}"
            );
        }
    }

    #[test]
    fn flags_codings_that_are_not_exactly_chunked() {
        for te in [
            "chunked\t",
            "Chunked ",
            "gzip, chunked",
            "chunked, chunked",
            " chunked",
        ] {
            let req =
                format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n0\r\n\r\n");
            let v = verdicts(req.as_bytes(), 5);
            // httparse trims surrounding whitespace of a value; codings that stay ambiguous
            // after that are flagged.
            if te.trim().eq_ignore_ascii_case("chunked") {
                assert_eq!(v, vec![None], "{te:?}");
            } else {
                assert!(v[0].is_some(), "{te:?}");
            }
        }
        let twice = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert!(verdicts(twice, 9)[0].is_some());
    }

    #[test]
    fn the_case_file() {
        let raw = b"POST /ingest HTTP/1.1\r\nHost: a\r\nX-Stream: vehicle.position\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\t\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
        let v = verdicts(raw, 11);
        assert!(v[0].is_some());
        assert_eq!(v.len(), 2);
    }
}
