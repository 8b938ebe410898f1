//! Facts stated once: a header or query key shedgate reads must say one thing. Several lines
//! with the same value are one statement; several different values are ambiguous, and an
//! ambiguous fact is unreadable, never resolved by taking the first or the last (an upstream
//! may take the other one, and a sender could choose its reading).
//!
//! An underscore twin of a header (`X_Stream` beside `X-Stream`) is one more line of it: CGI
//! and WSGI upstreams read both as `HTTP_X_STREAM` (httpd PR #558, caddy#7808, envoy PR
//! #10700), so a twin that disagrees is a second reading, and a twin alone states the fact in
//! a form HTTP does not name and such an upstream does: ambiguous either way.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// What a request says about one fact, over all the places it states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stated<T> {
    /// Nowhere.
    Absent,
    /// One value (possibly stated several times).
    One(T),
    /// Different values.
    Ambiguous,
}

impl<T: PartialEq> Stated<T> {
    /// This statement and one more.
    #[must_use]
    pub fn and(self, value: T) -> Self {
        match self {
            Stated::Absent => Stated::One(value),
            Stated::One(v) if v == value => Stated::One(v),
            _ => Stated::Ambiguous,
        }
    }
}

impl<T> Stated<T> {
    /// The value, when there is exactly one.
    pub fn value(self) -> Option<T> {
        match self {
            Stated::One(v) => Some(v),
            _ => None,
        }
    }
}

impl<T: PartialEq> FromIterator<T> for Stated<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        values.into_iter().fold(Stated::Absent, Stated::and)
    }
}

/// Reads header `name` of `headers` as one statement, its underscore twins included (see the
/// module docs): a twin with the same value as every line of `name` is the same statement;
/// one that differs, or a twin without `name` itself, is [`Stated::Ambiguous`].
///
/// The twin check walks the request's header names once (no allocation), and only for a
/// name with a `-`; with no twin present it adds one comparison of lengths per name.
pub fn read_one<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Stated<&'a HeaderValue> {
    let stated: Stated<&HeaderValue> = headers.get_all(name).iter().collect();
    let wanted = name.as_str().as_bytes();
    if !wanted.contains(&b'-') || !headers.keys().any(|k| is_twin(k.as_str(), wanted)) {
        return stated;
    }
    if stated == Stated::Absent {
        return Stated::Ambiguous;
    }
    headers
        .iter()
        .filter(|(k, _)| is_twin(k.as_str(), wanted))
        .fold(stated, |s, (_, v)| s.and(v))
}

/// Whether `candidate` (a lower-case header name) is an underscore twin of `name` (lower
/// case, with a `-`): the same name once each `_` reads as `-`, and not `name` itself.
pub fn is_twin(candidate: &str, name: &[u8]) -> bool {
    let c = candidate.as_bytes();
    c.len() == name.len()
        && c.contains(&b'_')
        && c.iter()
            .zip(name)
            .all(|(&a, &b)| a == b || (a == b'_' && b == b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const X_STREAM: HeaderName = HeaderName::from_static("x-stream");

    #[test]
    fn once_repeated_or_ambiguous() {
        let mut h = HeaderMap::new();
        assert_eq!(read_one(&h, &X_STREAM), Stated::Absent);
        h.append("x-stream", HeaderValue::from_static("a"));
        assert_eq!(read_one(&h, &X_STREAM).value().unwrap(), "a");
        h.append("x-stream", HeaderValue::from_static("a"));
        assert_eq!(read_one(&h, &X_STREAM).value().unwrap(), "a");
        h.append("x-stream", HeaderValue::from_static("b"));
        assert_eq!(read_one(&h, &X_STREAM), Stated::Ambiguous);
        // Once ambiguous, a value seen before does not make it one statement again.
        assert_eq!(Stated::from_iter(["a", "b", "a"]), Stated::Ambiguous);
    }

    #[test]
    fn an_underscore_twin_is_one_more_line_of_its_header() {
        let twin = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in pairs {
                h.append(*n, HeaderValue::from_static(v));
            }
            h
        };
        let h = twin(&[("x-stream", "a"), ("x_stream", "b")]);
        assert_eq!(read_one(&h, &X_STREAM), Stated::Ambiguous, "disagreeing");
        let h = twin(&[("x-stream", "a"), ("x_stream", "a")]);
        assert_eq!(read_one(&h, &X_STREAM).value().unwrap(), "a", "agreeing");
        let h = twin(&[("x_stream", "a")]);
        assert_eq!(read_one(&h, &X_STREAM), Stated::Ambiguous, "a twin alone");
        let ce = HeaderName::from_static("ce-time");
        let h = twin(&[("ce-time", "a"), ("ce_time", "b"), ("x_other", "c")]);
        assert_eq!(read_one(&h, &ce), Stated::Ambiguous);
        // Names that are not twins: another name, one without `_`, or the name itself.
        let h = twin(&[("x-stream", "a"), ("x_streams", "b"), ("xxstream", "c")]);
        assert_eq!(read_one(&h, &X_STREAM).value().unwrap(), "a");
        assert!(!is_twin("x-stream", b"x-stream"));
        assert!(is_twin("x_forwarded_for", b"x-forwarded-for"));
        assert!(is_twin("x-forwarded_for", b"x-forwarded-for"));
        assert!(!is_twin("x_forwarded-fox", b"x-forwarded-for"));
    }
}
