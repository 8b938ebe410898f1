//! The access-log line of a request hyper's parser refused and answered itself (400 for a
//! head that does not parse: obs-fold, a space before the colon, a bare CR, a control byte in
//! a header value; 431 for a head over `--max-head`), so that every answered request has its
//! line (docs/operations.md "Access log"). It is written with what is known: the peer, and
//! the method, route and message id when the head's bytes still tell them.

use std::net::IpAddr;
use std::sync::Arc;

use crate::live::PolicyStore;
use crate::metrics::Outcome;
use crate::record::{AccessLog, Entry, Note};

/// The line's `reason` for a head hyper refused as malformed (400).
pub const MALFORMED_HEAD: &str = "malformed-head";
/// The line's `reason` for a head over `--max-head` (hyper's 431).
pub const HEAD_TOO_LARGE: &str = "head-too-large";

/// Most header lines read from a refused head to find its message id (the framing guard's
/// limit).
const MAX_HEADERS: usize = 128;

/// What writing a refused head's line needs: the access log, and the live policy (its
/// version and routes, the clock and the random draw for sampling).
#[derive(Debug, Clone)]
pub struct Refusals {
    /// The access log.
    pub log: Arc<AccessLog>,
    /// The live policy and the process's clock.
    pub store: Arc<PolicyStore>,
}

/// The status hyper answered a parse error with (`hyper::proto::h1::role`, `on_error`):
/// 431 for a head too large, 400 for the rest; `None` for an error it answers not at all
/// (an HTTP/2 preface, refused elsewhere, or a timeout).
pub fn answered(error: &hyper::Error) -> Option<(u16, &'static str)> {
    if !error.is_parse() || error.is_parse_version_h2() {
        return None;
    }
    // hyper's 414 (a target over 65,534 bytes) cannot happen: `--max-head` is at most
    // 64 KiB, and a head over it is refused as too large first.
    Some(if error.is_parse_too_large() {
        (431, HEAD_TOO_LARGE)
    } else {
        (400, MALFORMED_HEAD)
    })
}

impl Refusals {
    /// Writes the line of a head from `peer` that hyper answered `status` itself, for
    /// `reason`; `head` is what hyper had read of the connection and not used (the refused
    /// head first). Sampled as any rejection.
    pub fn record(&self, peer: IpAddr, head: &[u8], (status, reason): (u16, &'static str)) {
        let sources = self.store.sources();
        let draw = if self.log.samples_all() {
            0.0
        } else {
            sources.draw()
        };
        let Some(sample) = self.log.sampled(Outcome::Rejected, draw) else {
            return;
        };
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        // httparse fills the method and target as it reads them, whatever fails after.
        let complete = matches!(req.parse(head), Ok(httparse::Status::Complete(_)));
        let method = req
            .method
            .and_then(|m| http::Method::from_bytes(m.as_bytes()).ok());
        let target = req.path.and_then(|p| http::Uri::try_from(p).ok());
        let message_id = complete
            .then(|| {
                crate::record::line::MESSAGE_ID_HEADERS
                    .iter()
                    .find_map(|name| {
                        req.headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case(name))
                    })
                    .and_then(|h| http::HeaderValue::from_bytes(h.value).ok())
            })
            .flatten();
        self.log.submit(&Entry {
            id: self.log.request_id(),
            at: sources.now(),
            peer: Some(peer),
            method,
            target,
            message_id,
            snapshot: self.store.load(),
            note: Note {
                outcome: Some(Outcome::Rejected),
                reason: Some(reason),
                ..Note::default()
            },
            status,
            upstream: None,
            response_bytes: Some(0),
            sample,
        });
    }
}
