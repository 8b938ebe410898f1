//! Header facts: a header shedgate reads must be stated once. Several lines with the same
//! value are one statement; several different values are ambiguous, and an ambiguous fact is
//! unreadable, never resolved by taking the first or the last (an upstream may take the other
//! one, and a sender could choose its reading).

use http::HeaderMap;
use http::header::{AsHeaderName, HeaderValue};

/// What a request says in one header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderRead<'a> {
    /// No line.
    Absent,
    /// One value (possibly on several identical lines).
    One(&'a HeaderValue),
    /// Different values on several lines.
    Ambiguous,
}

impl<'a> HeaderRead<'a> {
    /// The value, when there is exactly one.
    pub fn value(self) -> Option<&'a HeaderValue> {
        match self {
            HeaderRead::One(v) => Some(v),
            _ => None,
        }
    }
}

/// Reads header `name` of `headers` as one statement.
pub fn read_one<K: AsHeaderName>(headers: &HeaderMap, name: K) -> HeaderRead<'_> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return HeaderRead::Absent;
    };
    if values.all(|v| v == first) {
        HeaderRead::One(first)
    } else {
        HeaderRead::Ambiguous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_repeated_or_ambiguous() {
        let mut h = HeaderMap::new();
        assert_eq!(read_one(&h, "x-stream"), HeaderRead::Absent);
        h.append("x-stream", HeaderValue::from_static("a"));
        assert_eq!(read_one(&h, "x-stream").value().unwrap(), "a");
        h.append("x-stream", HeaderValue::from_static("a"));
        assert_eq!(read_one(&h, "x-stream").value().unwrap(), "a");
        h.append("x-stream", HeaderValue::from_static("b"));
        assert_eq!(read_one(&h, "x-stream"), HeaderRead::Ambiguous);
    }
}
