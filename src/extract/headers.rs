//! Facts stated once: a header or query key shedgate reads must say one thing. Several lines
//! with the same value are one statement; several different values are ambiguous, and an
//! ambiguous fact is unreadable, never resolved by taking the first or the last (an upstream
//! may take the other one, and a sender could choose its reading).

use http::HeaderMap;
use http::header::{AsHeaderName, HeaderValue};

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

/// Reads header `name` of `headers` as one statement.
pub fn read_one<K: AsHeaderName>(headers: &HeaderMap, name: K) -> Stated<&HeaderValue> {
    headers.get_all(name).iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_repeated_or_ambiguous() {
        let mut h = HeaderMap::new();
        assert_eq!(read_one(&h, "x-stream"), Stated::Absent);
        h.append("x-stream", HeaderValue::from_static("a"));
        assert_eq!(read_one(&h, "x-stream").value().unwrap(), "a");
        h.append("x-stream", HeaderValue::from_static("a"));
        assert_eq!(read_one(&h, "x-stream").value().unwrap(), "a");
        h.append("x-stream", HeaderValue::from_static("b"));
        assert_eq!(read_one(&h, "x-stream"), Stated::Ambiguous);
        // Once ambiguous, a value seen before does not make it one statement again.
        assert_eq!(Stated::from_iter(["a", "b", "a"]), Stated::Ambiguous);
    }
}
