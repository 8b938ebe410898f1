//! The access log's line writer: an [`Entry`] written as one JSON line, by hand, into a
//! buffer ([`Formatter`]); the line's shape is [`super::line::Line`].

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::line::{Decided, Entry, body_name, outcome_of_status, rfc3339};
use crate::admission::{Decision, Verdict};
use crate::clock::UnixMillis;
use crate::extract::{BodyState, Coordinates, EventTime, Facts};

/// What [`Formatter`] needs that an entry does not carry.
#[derive(Debug, Clone)]
pub struct Format {
    /// `--replica`.
    pub replica: Arc<str>,
    /// `--access-log-full-peer`.
    pub full_peer: bool,
    /// The device key (`--access-log-secret-file`).
    pub device_key: Option<super::privacy::DeviceKey>,
}

/// Writes entries as JSON lines, by hand: keys and the policy's names (a grammar of
/// `[A-Za-z0-9_.-]`) as they are, anything a sender or an operator wrote escaped, numbers
/// through serde_json. It keeps the current second's time text and the last peer's. A shed
/// line takes about 0.37 µs, 0.52 µs with the device hash (`FORMAT_ONLY=1 cargo bench
/// --bench replay`, one run with the optional method and the message-id rule, the 2 cores
/// shared with other builds; 0.33 and 0.46 µs before, on a quiet machine; serde's derived
/// serializer took 1.6 µs, most of it escaping keys, a `String` per field and locating the
/// cell again). A message id that must be cut adds the SHA-256 of the whole id.
#[derive(Debug)]
pub struct Formatter {
    format: Format,
    /// The second `prefix` is of, unix seconds.
    second: i64,
    /// `2026-12-04T17:02:03.`
    prefix: String,
    peer: Option<(IpAddr, String)>,
    /// `--replica` as a JSON string, escaped once.
    replica: String,
}

impl Formatter {
    /// A formatter for `format`.
    pub fn new(format: Format) -> Self {
        Formatter {
            replica: serde_json::to_string(&*format.replica).unwrap_or_default(),
            format,
            second: i64::MIN,
            prefix: String::new(),
            peer: None,
        }
    }

    /// Appends `entry`'s line, newline included, to `out`.
    pub fn write(&mut self, entry: &Entry, out: &mut Vec<u8>) {
        let policy = &entry.snapshot.policy;
        let note = &entry.note;
        out.extend_from_slice(b"{\"time\":\"");
        self.time(entry.at, out);
        out.extend_from_slice(b"\",\"id\":\"");
        hex(out, &entry.id.to_be_bytes());
        out.push(b'"');
        if let Some(id) = &entry.message_id {
            key(out, "message_id");
            message_id(out, id.as_bytes());
        }
        key(out, "replica");
        out.extend_from_slice(self.replica.as_bytes());
        if let Some(ip) = entry.peer {
            key(out, "peer");
            let full = self.format.full_peer;
            let text = match &self.peer {
                Some((seen, text)) if *seen == ip => text,
                _ => {
                    &self
                        .peer
                        .insert((ip, super::privacy::peer_text(ip, full)))
                        .1
                }
            };
            plain(out, text);
        }
        if let Some(method) = &entry.method {
            key(out, "method");
            // A method is a token (RFC 9110 section 9.1): nothing in it needs escaping.
            plain(out, method.as_str());
        }
        let route = entry.target.as_ref().and_then(|target| {
            policy
                .route_index(&crate::policy::path::route_path(target.path()))
                .map(|i| policy.routes()[i].prefix.as_str())
        });
        if let Some(route) = route {
            key(out, "route");
            escaped(out, route);
        }
        if let Some(id) = note.stream {
            key(out, "stream");
            plain(out, &policy.stream_policy(id).name);
        }
        key(out, "class");
        plain(out, policy.class_of(note.stream).as_str());
        // Named from the policy the request was routed by (the entry's snapshot), never
        // looked up on the request path.
        if let Some(spec) = note
            .upstream
            .and_then(|id| policy.upstreams().get(id.index()))
        {
            key(out, "upstream");
            plain(out, &spec.name);
        }
        key(out, "status");
        number(out, entry.status);
        let outcome = note.outcome.unwrap_or_else(|| {
            outcome_of_status(http::StatusCode::from_u16(entry.status).unwrap_or_default())
        });
        key(out, "outcome");
        plain(out, outcome.as_str());
        if let Some(reason) = note.reason {
            key(out, "reason");
            plain(out, reason);
        }
        if let Some(rule) = note.rule {
            key(out, "rule");
            plain(out, rule.as_str());
        }
        let decision = note.decided.as_ref().map(|d| &d.decision);
        if let Some(Verdict::WouldShed(reason)) = decision.map(|d| d.verdict) {
            key(out, "would_shed");
            plain(out, reason.as_str());
        }
        key(out, "policy");
        plain(out, policy.version());
        key(out, "sample");
        number(out, entry.sample);
        key(out, "body");
        plain(
            out,
            body_name(note.facts.map_or(BodyState::Unread, |f| f.body)),
        );
        if let Some(facts) = note.facts {
            self.facts(&facts, decision, out);
        }
        if let Some(d) = &note.decided {
            self.decided(policy, d, out);
        }
        if let (Some(key_), Some(text)) = (&self.format.device_key, &note.device) {
            key(out, "device");
            out.push(b'"');
            hex(out, &key_.digest(text));
            out.push(b'"');
        }
        if let Some(why) = note.device_untrusted {
            key(out, "device_untrusted");
            plain(out, why.as_str());
        }
        if let Some(latency) = entry.upstream {
            key(out, "upstream_status");
            number(out, entry.status);
            key(out, "upstream_ms");
            number(out, latency.as_secs_f64() * 1000.0);
        }
        if let Some(n) = note.request_bytes {
            key(out, "request_bytes");
            number(out, n);
        }
        if let Some(n) = entry.response_bytes {
            key(out, "response_bytes");
            number(out, n);
        }
        out.extend_from_slice(b"}\n");
    }

    fn facts(&self, facts: &Facts, decision: Option<&Decision>, out: &mut Vec<u8>) {
        if facts.ambiguous {
            key(out, "ambiguous");
            out.extend_from_slice(b"true");
        }
        match facts.coordinates {
            Coordinates::Valid { lat, lon } => {
                // Located by the decision; a body it did not locate (a `never` event named in
                // the body, a point far from every area: `Policy::locate`) is located here,
                // off the request path.
                let cell = decision
                    .and_then(|d| d.cell)
                    .or_else(|| crate::policy::Policy::cell_at(lat, lon));
                if let Some(cell) = cell {
                    key(out, "cell");
                    out.push(b'"');
                    let bits = u64::from(cell).to_be_bytes();
                    // 15 hex digits: the first is always 0 (mode and reserved bits).
                    let at = out.len();
                    hex(out, &bits);
                    out.remove(at);
                    out.push(b'"');
                }
            }
            Coordinates::Missing => {
                key(out, "points");
                plain(out, "missing");
            }
            Coordinates::Invalid => {
                key(out, "points");
                plain(out, "invalid");
            }
        }
        match facts.time {
            EventTime::At(at) => {
                key(out, "event_ms");
                number(out, at.0);
            }
            EventTime::Missing => {
                key(out, "event_time");
                plain(out, "missing");
            }
            EventTime::Invalid => {
                key(out, "event_time");
                plain(out, "invalid");
            }
        }
    }

    fn decided(&self, policy: &crate::policy::Policy, d: &Decided, out: &mut Vec<u8>) {
        let decision = &d.decision;
        if let Some(area) = decision.area {
            key(out, "area");
            plain(out, &policy.area(area).name);
        }
        key(out, "rank");
        number(out, decision.rank.get());
        if let Some(age) = decision.age_ms {
            key(out, "age_ms");
            number(out, age);
        }
        key(out, "pressure");
        number(out, decision.pressure.get());
        key(out, "pressure_raw");
        number(out, d.pressure_raw.get());
        if d.pinned {
            key(out, "pinned");
            out.extend_from_slice(b"true");
        }
        if let Some(s) = decision.schedule.and_then(|i| policy.schedules().get(i)) {
            key(out, "schedule");
            escaped(out, &s.name);
        }
        key(out, "probability");
        number(out, decision.probability);
        key(out, "draw");
        number(out, d.draw);
        let offset = d.now.since(d.local);
        if offset != 0 {
            key(out, "clock_offset_ms");
            number(out, offset);
        }
        key(out, "load");
        let [a, b, c] = d.load.class_inflight;
        out.extend_from_slice(b"{\"class_inflight\":[");
        number(out, a);
        out.push(b',');
        number(out, b);
        out.push(b',');
        number(out, c);
        out.extend_from_slice(b"],\"total\":");
        number(out, d.load.total);
        out.extend_from_slice(b",\"capacity\":");
        number(out, d.load.capacity);
        if d.load.floor.max_silence_ms.is_some() {
            let f = d.load.floor;
            out.extend_from_slice(b",\"floor\":{\"inflight\":");
            number(out, f.inflight);
            out.extend_from_slice(b",\"limit\":");
            number(out, f.limit);
            out.extend_from_slice(b",\"threshold\":");
            number(out, f.threshold);
            out.push(b'}');
        }
        out.push(b'}');
        key(out, "buffered_bytes");
        number(out, d.buffered);
        if let Some(h) = d.history {
            key(out, "device_history");
            out.extend_from_slice(b"{\"credit\":");
            number(out, h.credit);
            if let Some(ms) = h.since_admitted_ms {
                out.extend_from_slice(b",\"since_admitted_ms\":");
                number(out, ms);
            }
            if let Some(ms) = h.interval_ms {
                out.extend_from_slice(b",\"interval_ms\":");
                number(out, ms);
            }
            if let Some(at) = h.newest_delivered {
                out.extend_from_slice(b",\"newest_delivered_ms\":");
                number(out, at.0);
            }
            if let Some(ms) = h.since_delivered_ms {
                out.extend_from_slice(b",\"since_delivered_ms\":");
                number(out, ms);
            }
            out.push(b'}');
        }
        if let Some(credit) = decision.credit {
            key(out, "credit_after");
            number(out, credit);
        }
    }

    /// `at` as RFC 3339 UTC with milliseconds, the second's text kept.
    fn time(&mut self, at: UnixMillis, out: &mut Vec<u8>) {
        let (second, ms) = (at.0.div_euclid(1000), at.0.rem_euclid(1000));
        if second != self.second {
            let text = rfc3339(UnixMillis(second * 1000));
            // `2026-12-04T17:02:03.000Z` less its `000Z`.
            self.prefix = text[..text.len().saturating_sub(4)].to_owned();
            self.second = second;
        }
        out.extend_from_slice(self.prefix.as_bytes());
        let digit = |d: i64| b'0' + u8::try_from(d).unwrap_or(0);
        out.extend_from_slice(&[digit(ms / 100), digit(ms / 10 % 10), digit(ms % 10), b'Z']);
    }
}

/// `,"name":`
fn key(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

/// A string that needs no escaping (the policy's names, the proxy's own words), quoted.
fn plain(out: &mut Vec<u8>, text: &str) {
    debug_assert!(
        !text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20),
        "{text:?} needs escaping"
    );
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// Any string, escaped as JSON.
fn escaped(out: &mut Vec<u8>, text: &str) {
    let _ = serde_json::to_writer(&mut *out, text);
}

/// A number as JSON (a float that is not finite as `null`).
fn number(out: &mut Vec<u8>, n: impl Serialize) {
    let _ = serde_json::to_writer(&mut *out, &n);
}

/// Bytes as lower-case hex.
fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 15)]);
    }
}

/// Longest message id written whole, bytes: a sender's ids are UUIDs or similar (Standard
/// Webhooks' `msg_` + 27 characters).
const MAX_MESSAGE_ID: usize = 128;

/// How much of a longer id (or one that is not UTF-8) is kept before its hash, bytes at most
/// (cut on a character boundary).
const MESSAGE_ID_PREFIX: usize = 96;

/// A sender's message id as a JSON string. Valid UTF-8 of at most [`MAX_MESSAGE_ID`] bytes is
/// written whole (escaped as JSON: quotes, backslashes and control characters). Anything else,
/// a longer id or bytes that are not UTF-8 (a header's obs-text), is written as its first
/// [`MESSAGE_ID_PREFIX`] bytes or fewer (on a character boundary; bytes that are not UTF-8 as
/// U+FFFD), then `…#` and the first 8 bytes of the SHA-256 of the whole id as 16 hex digits:
/// at most 116 bytes, and two ids that differ anywhere are never written alike
/// (`printf %s "$ID" | sha256sum | cut -c1-16` finds a cut id's line).
fn message_id(out: &mut Vec<u8>, id: &[u8]) {
    if id.len() <= MAX_MESSAGE_ID
        && let Ok(text) = std::str::from_utf8(id)
    {
        escaped(out, text);
        return;
    }
    use sha2::Digest as _;
    let head = String::from_utf8_lossy(&id[..id.len().min(MESSAGE_ID_PREFIX)]);
    let mut end = head.len().min(MESSAGE_ID_PREFIX);
    while !head.is_char_boundary(end) {
        end -= 1;
    }
    let digest = sha2::Sha256::digest(id);
    // The escaped head less its closing quote, then the marker and the hash (hex needs no
    // escaping), then the quote.
    escaped(out, &head[..end]);
    out.pop();
    out.extend_from_slice("…#".as_bytes());
    hex(out, &digest[..8]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(id: &[u8]) -> String {
        let mut out = Vec::new();
        message_id(&mut out, id);
        serde_json::from_slice(&out).expect("a JSON string")
    }

    /// Ids a sender chooses: UTF-8 kept, JSON special characters escaped, long ones and ones
    /// that are not UTF-8 cut with their hash, never two alike.
    #[test]
    fn message_ids_are_kept_or_cut_with_their_hash() {
        for id in [
            "msg_1",
            "msg_5_café_\u{2028}_\u{202e}",
            "a\"b\\c\td\u{7f}e\u{1b}[31m",
        ] {
            assert_eq!(written(id.as_bytes()), id);
        }
        let whole = "é".repeat(64);
        assert_eq!(written(whole.as_bytes()), whole, "128 bytes: whole");
        let (a, b) = (
            format!("msg_7_{}1", "B".repeat(130)),
            format!("msg_7_{}2", "B".repeat(130)),
        );
        let (wa, wb) = (written(a.as_bytes()), written(b.as_bytes()));
        assert_ne!(wa, wb);
        assert!(
            wa.starts_with(&a[..96]) && wa.len() <= MAX_MESSAGE_ID,
            "{wa}"
        );
        use sha2::Digest as _;
        let hash: String = sha2::Sha256::digest(a.as_bytes())[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(wa.ends_with(&format!("…#{hash}")), "{wa}");
        // A cut on a character boundary: 95 bytes of `x`, then a 2-byte character.
        let long = format!("{}é{}", "x".repeat(95), "y".repeat(100));
        assert!(written(long.as_bytes()).starts_with(&format!("{}…#", "x".repeat(95))));
        // Not UTF-8 (Latin-1 obs-text): kept apart from its lossy reading.
        let latin = b"caf\xe9";
        let w = written(latin);
        assert!(w.starts_with("caf\u{fffd}…#"), "{w}");
        assert_ne!(written(b"caf\xe8"), w);
    }
}
