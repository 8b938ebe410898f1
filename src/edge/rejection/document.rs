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
    if value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
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
        json_value(&mut out, &self.status);
        out.extend_from_slice(b",\"detail\":");
        json_str(&mut out, &self.detail);
        if let Some(secs) = self.retry_after {
            out.extend_from_slice(b",\"retry_after\":");
            json_value(&mut out, &secs);
        }
        if let Some(e) = self.explanation {
            out.extend_from_slice(b",\"decision\":");
            json_str(&mut out, e.decision);
            out.extend_from_slice(b",\"reason\":");
            json_str(&mut out, e.reason);
            if let Some(would) = e.would_shed {
                out.extend_from_slice(b",\"would_shed\":");
                json_str(&mut out, would);
            }
            out.extend_from_slice(b",\"stream\":");
            json_str(&mut out, &e.stream);
            out.extend_from_slice(b",\"class\":");
            json_str(&mut out, e.class);
            out.extend_from_slice(b",\"upstream\":");
            json_str(&mut out, &e.upstream);
            out.extend_from_slice(b",\"area\":");
            json_str(&mut out, &e.area);
            out.extend_from_slice(b",\"rank\":");
            json_value(&mut out, &e.rank);
            out.extend_from_slice(b",\"probability\":");
            json_value(&mut out, &e.probability);
            out.extend_from_slice(b",\"pressure\":");
            json_value(&mut out, &e.pressure);
            if let Some(age) = e.age_seconds {
                out.extend_from_slice(b",\"age_seconds\":");
                json_value(&mut out, &age);
            }
            if let Some(schedule) = &e.schedule {
                out.extend_from_slice(b",\"schedule\":");
                json_str(&mut out, schedule);
            }
            out.extend_from_slice(b",\"policy_version\":");
            json_str(&mut out, &e.policy_version);
            if let Some(device) = &e.device {
                out.extend_from_slice(b",\"device\":");
                json_device(&mut out, device);
            }
        }
        out.push(b'}');
        out
    }
}

/// `text` as a JSON string, escaped as serde_json escapes it: `\"`, `\\`, the short escapes
/// of `\b \f \n \r \t`, `\u00xx` for the other control characters, everything else as it
/// is.
fn json_str(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
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
    out.push(b'"');
}

/// An integer as JSON writes it (decimal, `-` for a negative one), `null` for none.
fn json_int(out: &mut Vec<u8>, n: Option<i64>) {
    let Some(n) = n else {
        out.extend_from_slice(b"null");
        return;
    };
    if n < 0 {
        out.push(b'-');
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        // A digit: `rest % 10` is below 10.
        digits[at] = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
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
