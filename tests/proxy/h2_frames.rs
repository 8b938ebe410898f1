//! A raw HTTP/2 client over TLS (ALPN `h2`) for the HTTP/2 tests: frames written and read as
//! they are (RFC 9113 section 4), so that a test can send what a well-behaved client library
//! would not (streams past the advertised limit, streams reset as soon as opened, a stream
//! after the last id of a `GOAWAY`) and see every frame the proxy sends, in order.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::tls::Ca;

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
/// `END_STREAM` on DATA and HEADERS; `ACK` on SETTINGS and PING.
pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
/// `SETTINGS_MAX_CONCURRENT_STREAMS` (RFC 9113 section 6.5.2).
pub(crate) const MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// `SETTINGS_INITIAL_WINDOW_SIZE`.
pub(crate) const INITIAL_WINDOW_SIZE: u16 = 0x4;
/// `SETTINGS_MAX_HEADER_LIST_SIZE`.
pub(crate) const MAX_HEADER_LIST_SIZE: u16 = 0x6;
/// Error codes (RFC 9113 section 7).
pub(crate) const NO_ERROR: u32 = 0x0;
pub(crate) const PROTOCOL_ERROR: u32 = 0x1;
pub(crate) const CANCEL: u32 = 0x8;
pub(crate) const REFUSED_STREAM: u32 = 0x7;
pub(crate) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame as read.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
    pub(crate) payload: Vec<u8>,
}

impl Frame {
    /// A 32-bit word of the payload at `at` (the top bit cleared where it is reserved).
    pub(crate) fn word(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }

    /// A GOAWAY's last stream id and error code.
    pub(crate) fn goaway(&self) -> (u32, u32) {
        assert_eq!(self.kind, GOAWAY, "{self:?}");
        (self.word(0) & 0x7fff_ffff, self.word(4))
    }

    /// A SETTINGS frame's value of `id`.
    pub(crate) fn setting(&self, id: u16) -> Option<u32> {
        assert_eq!(self.kind, SETTINGS);
        self.payload
            .chunks(6)
            .find(|c| u16::from_be_bytes([c[0], c[1]]) == id)
            .map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]))
    }
}

/// A frame's bytes.
pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 section 5.1) after `first`'s high bits.
fn int(value: usize, n: u32, first: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | u8::try_from(value).unwrap());
        return;
    }
    out.push(first | u8::try_from(max).unwrap());
    let mut rest = value - max;
    while rest >= 128 {
        out.push(u8::try_from(rest % 128).unwrap() | 0x80);
        rest /= 128;
    }
    out.push(u8::try_from(rest).unwrap());
}

/// A header block: every field a literal without indexing with a new name (RFC 7541
/// section 6.2.2), no Huffman coding, so that no state is shared between blocks.
pub(crate) fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0);
        int(name.len(), 7, 0, &mut out);
        out.extend_from_slice(name.as_bytes());
        int(value.len(), 7, 0, &mut out);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// The fields of a request to the proxy: `method` `path` on `https://localhost`, then `extra`.
pub(crate) fn request<'a>(
    method: &'a str,
    path: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut fields = vec![
        (":method", method),
        (":scheme", "https"),
        (":path", path),
        (":authority", "localhost"),
    ];
    fields.extend_from_slice(extra);
    fields
}

/// The `:status` a response header block begins with: a static-table entry (RFC 7541
/// appendix A), or a literal whose name is `:status` and whose value is three digits, Huffman
/// coded (the h2 crate's encoder) or not. `None` for anything else.
pub(crate) fn status(block: &[u8]) -> Option<u16> {
    match block.first()? {
        0x88 => return Some(200),
        0x89 => return Some(204),
        0x8a => return Some(206),
        0x8b => return Some(304),
        0x8c => return Some(400),
        0x8d => return Some(404),
        0x8e => return Some(500),
        0x48 | 0x08 | 0x18 => {}
        _ => return None,
    }
    let (head, value) = (block.get(1)?, block.get(2..)?);
    let len = usize::from(head & 0x7f);
    let value = value.get(..len)?;
    let digits = if head & 0x80 == 0 {
        String::from_utf8(value.to_vec()).ok()?
    } else {
        // The Huffman codes of the digits (RFC 7541 appendix B): 0, 1, 2 in five bits
        // (00000, 00001, 00010), 3 to 9 in six (011001 to 011111); padding is ones.
        let bits: Vec<u8> = value
            .iter()
            .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
            .collect();
        let mut at = 0;
        let mut out = String::new();
        while out.len() < 3 {
            let take = |n: usize| {
                bits.get(at..at + n)
                    .map(|b| b.iter().fold(0u8, |acc, bit| acc << 1 | bit))
            };
            let five = take(5)?;
            if five <= 2 {
                out.push(char::from(b'0' + five));
                at += 5;
            } else {
                let six = take(6)?;
                if !(0b011001..=0b011111).contains(&six) {
                    return None;
                }
                out.push(char::from(b'0' + six - 0b011001 + 3));
                at += 6;
            }
        }
        out
    };
    digits.parse().ok()
}

/// A raw HTTP/2 connection to the proxy.
pub(crate) struct Raw {
    tls: TlsStream<TcpStream>,
    buf: Vec<u8>,
}

impl Raw {
    /// Connects offering only `h2`, checks that ALPN chose it, and sends the connection
    /// preface with an empty SETTINGS frame (RFC 9113 section 3.4).
    pub(crate) async fn open(proxy: std::net::SocketAddr, ca: &Ca) -> Raw {
        let tcp = TcpStream::connect(proxy).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let tls = tokio_rustls::TlsConnector::from(ca.client_config_offering(&[b"h2"]))
            .connect(name, tcp)
            .await
            .expect("TLS handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let mut raw = Raw {
            tls,
            buf: Vec::new(),
        };
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend(frame(SETTINGS, 0, 0, &[]));
        raw.write(&preface).await;
        raw
    }

    pub(crate) async fn write(&mut self, bytes: &[u8]) {
        self.tls.write_all(bytes).await.unwrap();
        self.tls.flush().await.unwrap();
    }

    /// HEADERS on `stream` with the whole block, `END_STREAM` when `end`.
    pub(crate) async fn headers(&mut self, stream: u32, fields: &[(&str, &str)], end: bool) {
        let flags = END_HEADERS | if end { END_STREAM } else { 0 };
        self.write(&frame(HEADERS, flags, stream, &hpack(fields)))
            .await;
    }

    /// DATA on `stream`, `END_STREAM` when `end`.
    pub(crate) async fn data(&mut self, stream: u32, bytes: &[u8], end: bool) {
        let flags = if end { END_STREAM } else { 0 };
        self.write(&frame(DATA, flags, stream, bytes)).await;
    }

    /// The next frame the proxy sends, `None` once it has closed the connection. SETTINGS
    /// are acknowledged as they come (and returned). Waits at most 10 s: a margin, the
    /// frames awaited are each the consequence of something already sent.
    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if self.buf.len() >= 9 {
                let len = usize::from(self.buf[0]) << 16
                    | usize::from(self.buf[1]) << 8
                    | usize::from(self.buf[2]);
                if self.buf.len() >= 9 + len {
                    let head: Vec<u8> = self.buf.drain(..9).collect();
                    let payload = self.buf.drain(..len).collect();
                    let f = Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
                        payload,
                    };
                    if f.kind == SETTINGS && f.flags & ACK == 0 {
                        self.write(&frame(SETTINGS, ACK, 0, &[])).await;
                    }
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = tokio::time::timeout(Duration::from_secs(10), self.tls.read(&mut chunk))
                .await
                .expect("the proxy sends a frame or closes");
            match n {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Frames until one matches `want` (those before it returned too, in order); panics if
    /// the connection closes first.
    pub(crate) async fn until(&mut self, want: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        let mut seen = Vec::new();
        loop {
            let f = self
                .next()
                .await
                .unwrap_or_else(|| panic!("closed before the awaited frame; saw {seen:?}"));
            let done = want(&f);
            seen.push(f);
            if done {
                return seen;
            }
        }
    }

    /// Every frame until the proxy closes the connection.
    pub(crate) async fn until_closed(&mut self) -> Vec<Frame> {
        let mut seen = Vec::new();
        while let Some(f) = self.next().await {
            seen.push(f);
        }
        seen
    }
}

#[test]
fn the_status_reader_reads_static_plain_and_huffman_forms() {
    assert_eq!(status(&[0x88]), Some(200));
    assert_eq!(status(&[0x08, 0x03, b'5', b'0', b'3']), Some(503));
    // "413" Huffman coded: 011010 00001 011001, padded with ones: 0x68 0x2c 0xff.
    assert_eq!(status(&[0x48, 0x83, 0x68, 0x2c, 0xff]), Some(413));
}
