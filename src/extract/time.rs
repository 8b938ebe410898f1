//! Event times: the one place where a sender's time value becomes unix milliseconds.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::clock::UnixMillis;

/// Numbers at or above this magnitude are unix milliseconds, below it unix seconds.
/// 1e11 seconds is the year 5138, and 1e11 milliseconds is March 1973: no plausible event
/// time in seconds reaches it, and none in milliseconds is below it.
const MILLIS_MAGNITUDE: f64 = 1e11;

/// Parses an event time given as text: RFC 3339 (`Z` or an offset, with or without
/// fractions), an ISO 8601 offset without a colon (`-0700`), or a numeric string holding
/// unix seconds or milliseconds (told apart by magnitude, see [`parse_unix_number`]).
/// Returns `None` for anything else.
pub fn parse_time_text(text: &str) -> Option<UnixMillis> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let first = text.as_bytes()[0];
    if first.is_ascii_digit() || first == b'-' || first == b'+' || first == b'.' {
        // "2026-05-28T..." starts with a digit too: try the number first, it fails fast.
        if let Ok(n) = text.parse::<f64>() {
            return parse_unix_number(n);
        }
    }
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return to_millis(t);
    }
    parse_offset_without_colon(text)
}

/// Parses a time given as a query or form value: every form [`parse_time_text`] reads, and
/// `YYYY-MM-DD HH:MM:SS` with optional fractions (`.fff`), which the OsmAnd protocol sends
/// in UTC (the space arrives as `%20` or `+`, decoded before this). Only here is a time
/// without an offset read as UTC: in a JSON body it stays unreadable.
pub fn parse_param_time(text: &str) -> Option<UnixMillis> {
    parse_time_text(text).or_else(|| {
        let format = time::macros::format_description!(
            "[year]-[month]-[day] [hour]:[minute]:[second][optional [.[subsecond]]]"
        );
        time::PrimitiveDateTime::parse(text.trim(), &format)
            .ok()
            .and_then(|t| to_millis(t.assume_utc()))
    })
}

/// Unix seconds or milliseconds as a number, told apart by magnitude: `|n| >= 1e11` is
/// milliseconds. Returns `None` when not finite or out of `i64` range.
pub fn parse_unix_number(n: f64) -> Option<UnixMillis> {
    if !n.is_finite() {
        return None;
    }
    let ms = if n.abs() >= MILLIS_MAGNITUDE {
        n
    } else {
        n * 1000.0
    };
    if ms.abs() >= 9.2e18 {
        return None;
    }
    // Float-to-int `as` saturates and the range was checked above.
    #[expect(clippy::cast_possible_truncation, reason = "range checked")]
    Some(UnixMillis(ms.round() as i64))
}

fn to_millis(t: OffsetDateTime) -> Option<UnixMillis> {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .ok()
        .map(UnixMillis)
}

/// `2026-05-28T13:26:20-0700` (ISO 8601 basic offset): rewrite the offset with a colon and
/// parse as RFC 3339.
fn parse_offset_without_colon(text: &str) -> Option<UnixMillis> {
    let bytes = text.as_bytes();
    let n = bytes.len();
    if n < 5 {
        return None;
    }
    let (sign, digits) = (bytes[n - 5], &bytes[n - 4..]);
    if !(sign == b'+' || sign == b'-') || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut fixed = String::with_capacity(n + 1);
    fixed.push_str(&text[..n - 2]);
    fixed.push(':');
    fixed.push_str(&text[n - 2..]);
    OffsetDateTime::parse(&fixed, &Rfc3339)
        .ok()
        .and_then(to_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_780_000_000_000; // 2026-05-28T20:26:40Z

    #[test]
    fn rfc3339_forms() {
        assert_eq!(parse_time_text("2026-05-28T20:26:40Z"), Some(UnixMillis(T)));
        assert_eq!(
            parse_time_text("2026-05-28T20:26:40.250Z"),
            Some(UnixMillis(T + 250))
        );
        assert_eq!(
            parse_time_text("2026-05-28T20:26:40.000+00:00"),
            Some(UnixMillis(T))
        );
        assert_eq!(
            parse_time_text("2026-05-28T22:26:40+02:00"),
            Some(UnixMillis(T))
        );
        assert_eq!(
            parse_time_text("2026-05-28T13:26:20-0700"),
            Some(UnixMillis(T - 20_000))
        );
    }

    #[test]
    fn unix_numbers_and_numeric_strings() {
        assert_eq!(parse_unix_number(1_780_000_000.0), Some(UnixMillis(T)));
        assert_eq!(parse_unix_number(1_780_000_000_000.0), Some(UnixMillis(T)));
        assert_eq!(
            parse_unix_number(1_780_000_000.25),
            Some(UnixMillis(T + 250))
        );
        assert_eq!(parse_time_text("1780000000"), Some(UnixMillis(T)));
        assert_eq!(parse_time_text(" 1780000000000 "), Some(UnixMillis(T)));
    }

    #[test]
    fn garbage_is_none() {
        for s in [
            "",
            "yesterday",
            "NaN",
            "inf",
            "2026-13-40T00:00:00Z",
            "1e400",
        ] {
            assert_eq!(parse_time_text(s), None, "{s:?}");
        }
        assert_eq!(parse_unix_number(f64::NAN), None);
        assert_eq!(parse_unix_number(1e300), None);
    }
}
