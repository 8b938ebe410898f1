//! What the framing rules read from one request head.

use super::{Phase, judge_framing};

/// Most header lines a head may have: past this the guard stops following the connection
/// (hyper refuses a head with more than its own limit, 100).
const MAX_HEADERS: usize = 128;

/// How a scan of the bytes at the start of a request head ended.
#[derive(Debug)]
pub(super) enum Scan<'a> {
    /// The head ends after this many bytes; what the rules read from it.
    Complete(usize, HeadFacts<'a>),
    /// The head has not ended yet.
    Partial,
    /// Bytes httparse (hence hyper) refuses, seen on the way: a CR before the request line
    /// that no LF follows, a request line that does not end with ` HTTP/1.1` or ` HTTP/1.0`
    /// (an HTTP/2 preface, a TLS hello, garbage), more than [`MAX_HEADERS`] header lines, a
    /// header line without a colon where the scan looks for one, a line folded onto the one
    /// before it (obs-fold: it starts with a space or a tab), a space or tab between
    /// `Transfer-Encoding` or `Content-Length` and its colon. hyper answers such a head itself
    /// and closes; the tracker stops following the connection, as it did when httparse
    /// refused a head (its boundaries unknown, the close lingers), rather than frame it by a
    /// `Content-Length` it misread or could not see. A bare CR inside a line is not looked
    /// for: such a head is framed by what it declares.
    Refused,
}

/// What the framing rules read from one request head, gathered in one scan of its bytes
/// ([`HeadFacts::scan`]).
#[derive(Debug, Default)]
pub(super) struct HeadFacts<'a> {
    /// Whether the method is `CONNECT`.
    connect: bool,
    /// How many `Transfer-Encoding` lines.
    te_lines: usize,
    /// The first `Transfer-Encoding` value (empty if none): what the framing rule judges.
    te_first: &'a [u8],
    /// The last `Transfer-Encoding` value (empty if none): its final coding frames the body.
    te_last: &'a [u8],
    /// The first `Content-Length` value, if any.
    content_length: Option<&'a [u8]>,
    /// Whether a header line is longer than the limit given to the scan (name, `: `, value
    /// and CRLF, as httparse delimits the name and value).
    pub(super) line_too_long: bool,
}

impl<'a> HeadFacts<'a> {
    /// Finds where the request head at the start of `buf` ends, and reads from its lines what
    /// the framing rules need, in one pass and without copying: each line is found with
    /// `memchr`, and only lines whose name is `Transfer-Encoding` or `Content-Length`, or
    /// that could be longer than `max_line` bytes, are read further.
    ///
    /// The head ends where httparse (hence hyper) ends it, for every head httparse accepts:
    /// such a head is empty lines (CRLF or LF, skipped), a request line, header lines, then an
    /// empty line, each line ending at its first LF (a CR only before that LF: no value,
    /// token or target holds a CR or LF). A name is the bytes before the first colon (no
    /// spaces there), a value the bytes after it with surrounding spaces and tabs trimmed, as
    /// httparse gives them. A head httparse refuses may be read some other way: hyper answers
    /// it 400 and closes the connection, so no later boundary depends on it.
    ///
    /// Replacing the second httparse parse of every head took the framing guard's read
    /// (`FramingGuard::poll_read`, socket read included) from 3,830 to 2,780 instructions per
    /// request on the harness's POST (`scripts/instructions.sh`; 3,840 to 2,760 on the
    /// `never` path, 3,560 to 2,490 on the no); this scan is about 990 of them (nine lines, a
    /// `memchr` call each about 46).
    pub(super) fn scan(buf: &'a [u8], max_line: usize) -> Scan<'a> {
        let mut pos = 0;
        // Empty lines before the request line, as httparse skips them.
        loop {
            match buf.get(pos) {
                None => return Scan::Partial,
                Some(b'\n') => pos += 1,
                Some(b'\r') => match buf.get(pos + 1) {
                    None => return Scan::Partial,
                    Some(b'\n') => pos += 2,
                    Some(_) => return Scan::Refused,
                },
                Some(_) => break,
            }
        }
        let mut facts = HeadFacts {
            connect: buf[pos..].starts_with(b"CONNECT "),
            ..HeadFacts::default()
        };
        let Some(end) = memchr::memchr(b'\n', &buf[pos..]) else {
            return Scan::Partial;
        };
        let request_line = &buf[pos..pos + end];
        let request_line = request_line.strip_suffix(b"\r").unwrap_or(request_line);
        if !(request_line.ends_with(b" HTTP/1.1") || request_line.ends_with(b" HTTP/1.0")) {
            return Scan::Refused;
        }
        pos += end + 1;
        let mut headers = 0;
        loop {
            let Some(end) = memchr::memchr(b'\n', &buf[pos..]) else {
                return Scan::Partial;
            };
            let line = &buf[pos..pos + end];
            pos += end + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                return Scan::Complete(pos, facts);
            }
            headers += 1;
            if headers > MAX_HEADERS || !facts.header(line, end + 1, max_line) {
                return Scan::Refused;
            }
        }
    }

    /// Reads one header line (`line` without its line end; `raw`, its length with it); false
    /// when the line has no colon where one was looked for, is folded (starts with a space
    /// or a tab), or spaces a framing header's name from its colon (see [`Scan::Refused`]).
    fn header(&mut self, line: &'a [u8], raw: usize, max_line: usize) -> bool {
        if matches!(line.first(), Some(b' ' | b'\t'))
            || spaced(line, b"transfer-encoding")
            || spaced(line, b"content-length")
        {
            return false;
        }
        // name + ": " + value + CRLF is at most the raw line plus 2 (no space after the colon,
        // a bare LF), so only a line that long is measured.
        if raw + 2 > max_line {
            let Some(colon) = memchr::memchr(b':', line) else {
                return false;
            };
            if colon + 2 + value(&line[colon + 1..]).len() + 2 > max_line {
                self.line_too_long = true;
            }
        }
        if named(line, b"transfer-encoding") {
            let v = value(&line[18..]);
            if self.te_lines == 0 {
                self.te_first = v;
            }
            self.te_lines += 1;
            self.te_last = v;
        } else if self.content_length.is_none() && named(line, b"content-length") {
            self.content_length = Some(value(&line[15..]));
        }
        true
    }

    /// The framing verdict ([`judge_framing`]; it reads only whether there are none, one or
    /// several `Transfer-Encoding` lines, and the first).
    pub(super) fn judge(&self) -> Option<String> {
        let te: &[&[u8]] = match self.te_lines {
            0 => &[],
            1 => &[self.te_first],
            _ => &[self.te_first, self.te_last],
        };
        judge_framing(te, self.content_length.is_some())
    }

    /// Where the body of a request with this head ends, as hyper frames it (RFC 9112 section
    /// 6.3): chunked if the final coding is chunked, else `Content-Length`, else no body.
    pub(super) fn next_phase(&self) -> Phase {
        if self.connect {
            return Phase::Lost;
        }
        if self.te_lines > 0 {
            let chunked = std::str::from_utf8(self.te_last)
                .ok()
                .and_then(|s| s.rsplit(',').next())
                .is_some_and(|s| s.trim().eq_ignore_ascii_case("chunked"));
            // A final coding other than chunked: hyper refuses it and closes.
            return if chunked {
                Phase::ChunkSize
            } else {
                Phase::Lost
            };
        }
        match self.content_length {
            None => Phase::Head,
            Some(v) => match std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                Some(0) => Phase::Head,
                Some(n) => Phase::Body(n),
                None => Phase::Lost,
            },
        }
    }
}

/// Whether a header line (without its line end) has the name `lower` (lowercase ASCII),
/// in any case: the name is the bytes before the first colon.
fn named(line: &[u8], lower: &[u8]) -> bool {
    line.get(lower.len()) == Some(&b':') && line[..lower.len()].eq_ignore_ascii_case(lower)
}

/// Whether a header line (without its line end) starts with the name `lower` (lowercase
/// ASCII, in any case) followed by a space or a tab: a name httparse refuses, since no space
/// may come before the colon (RFC 9112 section 5.1).
fn spaced(line: &[u8], lower: &[u8]) -> bool {
    matches!(line.get(lower.len()), Some(b' ' | b'\t'))
        && line[..lower.len()].eq_ignore_ascii_case(lower)
}

/// A header value from the bytes after the colon (the line end excluded), as httparse gives
/// it: spaces and tabs trimmed on both sides (and a CR at the end).
fn value(after_colon: &[u8]) -> &[u8] {
    let start = after_colon
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(after_colon.len());
    let rest = &after_colon[start..];
    let end = rest
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t' && b != b'\r')
        .map_or(0, |i| i + 1);
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What httparse reads from a head: its length, and the facts [`HeadFacts::scan`] reads,
    /// with the longest header line (name, `: `, value, CRLF); `None` while partial, `Err`
    /// when refused.
    fn by_httparse(buf: &[u8]) -> Result<Option<(usize, String, usize)>, ()> {
        let mut headers = [httparse::EMPTY_HEADER; 200];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                let te: Vec<&[u8]> = req
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
                    .map(|h| h.value)
                    .collect();
                let cl = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map(|h| h.value);
                let longest = req
                    .headers
                    .iter()
                    .map(|h| h.name.len() + 2 + h.value.len() + 2)
                    .max()
                    .unwrap_or(0);
                let facts = format!(
                    "{} {} {:?} {:?} {:?}",
                    req.method == Some("CONNECT"),
                    te.len(),
                    te.first().copied().unwrap_or(b""),
                    te.last().copied().unwrap_or(b""),
                    cl
                );
                Ok(Some((n, facts, longest)))
            }
            Ok(httparse::Status::Partial) => Ok(None),
            Err(_) => Err(()),
        }
    }

    fn by_scan(buf: &[u8], max_line: usize) -> Option<Option<(usize, String, bool)>> {
        match HeadFacts::scan(buf, max_line) {
            Scan::Complete(n, f) => Some(Some((
                n,
                format!(
                    "{} {} {:?} {:?} {:?}",
                    f.connect, f.te_lines, f.te_first, f.te_last, f.content_length
                ),
                f.line_too_long,
            ))),
            Scan::Partial => Some(None),
            Scan::Refused => None,
        }
    }

    /// Heads close to the framing rules' inputs: odd case, spacing and line ends, leading
    /// empty lines, long lines, and a few bytes httparse refuses.
    fn heads() -> impl Strategy<Value = Vec<u8>> {
        let name = prop_oneof![
            Just("Transfer-Encoding".to_owned()),
            Just("transfer-encoding".to_owned()),
            Just("TRANSFER-ENCODING".to_owned()),
            Just("Content-Length".to_owned()),
            Just("content-LENGTH".to_owned()),
            Just("Transfer-Encodings".to_owned()),
            Just("Content-Lengt".to_owned()),
            Just("Host".to_owned()),
            "[A-Za-z_-]{1,20}",
        ];
        let value = "[ \t]{0,2}[ -~\t]{0,12}[ \t]{0,2}|[a-z]{0,40}|x{100,300}";
        let eol = prop_oneof![6 => Just("\r\n"), 3 => Just("\n"), 1 => Just("\r")];
        let colon = prop_oneof![10 => Just(":"), 1 => Just(" :"), 1 => Just("")];
        let line =
            (name, colon, value, eol.clone()).prop_map(|(n, c, v, e)| format!("{n}{c}{v}{e}"));
        (
            "(\r\n|\n){0,2}",
            concat!(
                "(GET|POST|CONNECT|PRI|get) (/[a-z]{0,6}|\\*|[a-z.:0-9]{1,10}) ",
                "HTTP/(1\\.1|1\\.0|2\\.0)"
            ),
            eol.clone(),
            prop::collection::vec(line, 0..6),
            eol,
            "[a-z\r\n]{0,8}",
        )
            .prop_map(|(lead, rl, e1, lines, e2, tail)| {
                format!("{lead}{rl}{e1}{}{e2}{tail}", lines.concat()).into_bytes()
            })
    }

    /// Heads hyper refuses whose framing the scan would otherwise misread (a `Content-Length`
    /// it could not see, a folded value) stop the tracker, so their body is drained while
    /// hyper's 400 goes out; a folded line and a spaced framing name, in any case.
    #[test]
    fn folded_lines_and_spaced_framing_names_are_refused() {
        for head in [
            &b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 100000\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length\t: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nTRANSFER-ENCODING : chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 10\r\n 00\r\n\r\n",
            b"POST / HTTP/1.1\nX-Stream: a\n\tb\n\n",
        ] {
            assert!(by_httparse(head).is_err(), "{head:?}");
            assert_eq!(by_scan(head, 8192), None, "{head:?}");
        }
        // Names that only begin like a framing header are read as other headers.
        let head = b"POST / HTTP/1.1\r\nContent-Lengths : 1\r\nContent-Length: 0\r\n\r\n";
        assert!(by_scan(head, 8192).is_some());
    }

    proptest! {
        /// Wherever httparse ends a head it accepts, the scan ends it there too and reads the
        /// same framing facts and line lengths; on every prefix httparse waits on, the scan
        /// waits too (never refusing what httparse may yet accept).
        #[test]
        fn the_scan_reads_heads_as_httparse_does(
            head in prop_oneof![heads(), prop::collection::vec(any::<u8>(), 0..200)],
        ) {
            for cut in 0..=head.len() {
                let part = &head[..cut];
                match by_httparse(part) {
                    Ok(Some((n, facts, longest))) => {
                        let limits =
                            [longest.saturating_sub(1), longest, longest + 1, longest + 2, 20];
                        for max_line in limits {
                            let scanned = by_scan(part, max_line);
                            prop_assert_eq!(
                                scanned,
                                Some(Some((n, facts.clone(), longest > max_line))),
                                "{:?} at {}", String::from_utf8_lossy(part), max_line
                            );
                        }
                    }
                    Ok(None) => prop_assert_eq!(
                        by_scan(part, 8192),
                        Some(None),
                        "{:?}",
                        String::from_utf8_lossy(part)
                    ),
                    Err(()) => {
                        let _ = by_scan(part, 8192);
                    }
                }
            }
        }
    }
}
