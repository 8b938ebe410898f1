//! What the framing rules read from one request head.

use super::{Phase, judge_framing};

/// What the framing rules read from one request head, gathered in one pass over its header
/// lines (the rules used to walk them five times: twice per header name, and once for line
/// lengths). With the uninitialised header slots this took the harness's request from 66,773
/// to 66,109 and from 67,984 to 67,300 instructions (`scripts/instructions.sh`, two pairs of
/// runs, interleaved: about 670 fewer).
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
    /// The longest header line, bytes (name, `: `, value and CRLF).
    pub(super) longest_line: usize,
}

impl<'a> HeadFacts<'a> {
    pub(super) fn read(req: &httparse::Request<'_, 'a>) -> Self {
        let mut facts = HeadFacts {
            connect: req.method == Some("CONNECT"),
            ..HeadFacts::default()
        };
        for h in req.headers.iter() {
            facts.longest_line = facts.longest_line.max(h.name.len() + 2 + h.value.len() + 2);
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                if facts.te_lines == 0 {
                    facts.te_first = h.value;
                }
                facts.te_lines += 1;
                facts.te_last = h.value;
            } else if facts.content_length.is_none()
                && h.name.eq_ignore_ascii_case("content-length")
            {
                facts.content_length = Some(h.value);
            }
        }
        facts
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
