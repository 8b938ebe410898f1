//! The problem document written by hand ([`Problem::to_json`]), byte for byte as serde_json
//! writes it from the derived `Serialize`.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Explanation, Problem};

/// A shed's `detail`: `stream "NAME" shed (RULE) in area "AREA" (rank N); retry after S s`,
/// the names quoted as `{:?}` quotes them (a test compares it with that `format!`), written
/// without the formatter's escaping of every character of names that need none
/// (`scripts/instructions.sh --no`: a shed's answer 53,308 → 52,555–52,645 instructions;
/// the two integers through `itoa` instead of the formatter measured no better).
pub(super) fn shed_detail(explanation: &Explanation, retry_after: u32) -> String {
    let mut s = String::with_capacity(64 + explanation.stream.len() + explanation.area.len());
    s.push_str("stream ");
    debug_quoted(&mut s, &explanation.stream);
    s.push_str(" shed (");
    s.push_str(explanation.reason);
    s.push_str(") in area ");
    debug_quoted(&mut s, &explanation.area);
    // Writing to a `String` cannot fail.
    let _ = write!(
        s,
        " (rank {}); retry after {retry_after} s",
        explanation.rank
    );
    s
}

/// `value` as `{:?}` writes it: between quotes as it is when every byte is printable ASCII
/// other than `"` and `\` (bytes `Debug` writes as they are; a policy's names are such), else
/// through `Debug` itself.
fn debug_quoted(out: &mut String, value: &str) {
    if debug_plain(value) {
        out.push('"');
        out.push_str(value);
        out.push('"');
    } else {
        let _ = write!(out, "{value:?}");
    }
}

impl Problem<'_> {
    /// The document as serde_json writes it from the derived `Serialize` (byte for byte: a
    /// test compares them), written by hand: names as the constants they are, strings
    /// escaped as serde_json escapes them, fractions by serde_json. A shed's answer took
    /// 59,231–59,318 instructions with serde_json writing the document and takes
    /// 53,150–53,233 (callgrind, `scripts/instructions.sh` with pressure pinned at 0.8 and a
    /// body of the default rank).
    pub(super) fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(b"{\"type\":");
        json_str(&mut out, self.kind);
        out.extend_from_slice(b",\"title\":");
        json_str(&mut out, self.title);
        out.extend_from_slice(b",\"status\":");
        json_uint(&mut out, self.status.into());
        out.extend_from_slice(b",\"detail\":");
        json_str(&mut out, &self.detail);
        if let Some(secs) = self.retry_after {
            out.extend_from_slice(b",\"retry_after\":");
            json_uint(&mut out, secs);
        }
        if let Some(e) = self.explanation {
            json_explanation(&mut out, e);
        }
        out.push(b'}');
        out
    }
}

/// A shed's problem document (`urn:shedgate:problem:shed`, 503, its detail as
/// [`shed_detail`] words it, its `retry_after`, the explanation), byte for byte as
/// [`Problem::to_json`] writes it (a test compares them), with the constant head as one
/// piece and, when its names are [`debug_plain`], the detail written in place instead of
/// formatted and then escaped. With the answer's header name and `Retry-After` made once
/// ([`super::shed_response`]): `scripts/instructions.sh --no` 52,595 → 50,293 instructions
/// per request, the answer (`Rejection::into_response`) 6,860 → 4,480.
pub(super) fn shed_json(e: &Explanation, retry_after: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(
        b"{\"type\":\"urn:shedgate:problem:shed\",\"title\":\"Shed under load\",\
          \"status\":503,\"detail\":",
    );
    if debug_plain(&e.stream) && debug_plain(&e.area) {
        // The names as `{:?}` quotes them, each quote escaped for JSON.
        out.extend_from_slice(b"\"stream \\\"");
        out.extend_from_slice(e.stream.as_bytes());
        out.extend_from_slice(b"\\\" shed (");
        json_inner(&mut out, e.reason);
        out.extend_from_slice(b") in area \\\"");
        out.extend_from_slice(e.area.as_bytes());
        out.extend_from_slice(b"\\\" (rank ");
        json_uint(&mut out, e.rank.into());
        out.extend_from_slice(b"); retry after ");
        json_uint(&mut out, retry_after);
        out.extend_from_slice(b" s\"");
    } else {
        json_str(&mut out, &shed_detail(e, retry_after));
    }
    out.extend_from_slice(b",\"retry_after\":");
    json_uint(&mut out, retry_after);
    json_explanation(&mut out, e);
    out.push(b'}');
    out
}

/// The explanation's members, each after a comma, as its derived `Serialize` writes them
/// flattened into the problem document.
fn json_explanation(out: &mut Vec<u8>, e: &Explanation) {
    out.extend_from_slice(b",\"decision\":");
    json_str(out, e.decision);
    out.extend_from_slice(b",\"reason\":");
    json_str(out, e.reason);
    if let Some(would) = e.would_shed {
        out.extend_from_slice(b",\"would_shed\":");
        json_str(out, would);
    }
    out.extend_from_slice(b",\"stream\":");
    json_str(out, &e.stream);
    out.extend_from_slice(b",\"class\":");
    json_str(out, e.class);
    out.extend_from_slice(b",\"upstream\":");
    json_str(out, &e.upstream);
    out.extend_from_slice(b",\"area\":");
    json_str(out, &e.area);
    out.extend_from_slice(b",\"rank\":");
    json_uint(out, e.rank.into());
    out.extend_from_slice(b",\"probability\":");
    json_value(out, &e.probability);
    out.extend_from_slice(b",\"pressure\":");
    json_value(out, &e.pressure);
    if let Some(age) = e.age_seconds {
        out.extend_from_slice(b",\"age_seconds\":");
        json_value(out, &age);
    }
    if let Some(schedule) = &e.schedule {
        out.extend_from_slice(b",\"schedule\":");
        json_str(out, schedule);
    }
    out.extend_from_slice(b",\"policy_version\":");
    json_str(out, &e.policy_version);
    if let Some(device) = &e.device {
        out.extend_from_slice(b",\"device\":");
        json_device(out, device);
    }
}

/// Whether `{:?}` writes `value` between quotes as it is: every byte printable ASCII other
/// than `"` and `\\`.
fn debug_plain(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
}

/// An unsigned integer as JSON writes it, through `itoa` (serde_json's own).
fn json_uint(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `text` as a JSON string, escaped as serde_json escapes it: `\"`, `\\`, the short escapes
/// of `\b \f \n \r \t`, `\u00xx` for the other control characters, everything else as it
/// is.
fn json_str(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    json_inner(out, text);
    out.push(b'"');
}

/// `text` escaped as [`json_str`] escapes it, without the quotes around it.
fn json_inner(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    let mut run = 0;
    while let Some(at) = next_escape(bytes, run) {
        out.extend_from_slice(&bytes[run..at]);
        run = at + 1;
        let b = bytes[at];
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
    }
    out.extend_from_slice(&bytes[run..]);
}

/// An integer as JSON writes it (decimal, `-` for a negative one, through `itoa`, serde_json's
/// own), `null` for none.
fn json_int(out: &mut Vec<u8>, n: Option<i64>) {
    match n {
        Some(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// A device's history as its derived `Serialize` writes it.
fn json_device(out: &mut Vec<u8>, d: &crate::admission::DeviceHistory) {
    out.extend_from_slice(b"{\"credit\":");
    json_value(out, &d.credit);
    out.extend_from_slice(b",\"since_admitted_ms\":");
    json_int(out, d.since_admitted_ms);
    out.extend_from_slice(b",\"interval_ms\":");
    json_int(out, d.interval_ms);
    out.extend_from_slice(b",\"newest_delivered\":");
    json_int(out, d.newest_delivered.map(|t| t.0));
    out.extend_from_slice(b",\"since_delivered_ms\":");
    json_int(out, d.since_delivered_ms);
    out.push(b'}');
}

/// A value as serde_json writes it (numbers, the device's history).
fn json_value<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing into a vector fails only when the value's `Serialize` does, and these do not.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Where the first byte at or after `from` that a JSON string must escape is (a quote, a
/// backslash, a control character): eight bytes at a time, then one at a time. Against one
/// at a time throughout, a shed's answer 54,349 → 53,150–53,233 instructions.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let stop = crate::extract::string_stops(u64::from_le_bytes(word));
        if stop != 0 {
            return Some(at + (stop.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes
        .get(at..)?
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        .map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::next_escape;

    #[test]
    fn the_first_byte_to_escape_is_found_at_every_place_of_every_length() {
        for len in 0..20 {
            for stop in [b'"', b'\\', b'\n', 0x1f, 0] {
                for at in 0..=len {
                    let mut bytes = vec![b'a'; len];
                    if at < len {
                        bytes[at] = stop;
                    }
                    for from in 0..=len {
                        let expected = (from..len).find(|&i| bytes[i] == stop && i == at);
                        assert_eq!(next_escape(&bytes, from), expected, "{bytes:?} from {from}");
                    }
                }
            }
        }
    }
}
