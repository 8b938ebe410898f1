//! Body facts: latitude, longitude and event time read from a JSON body by JSON pointers
//! (RFC 6901), without building a document tree.
//!
//! The walk descends only along the configured pointers and skips every other value with
//! serde_json's iterative skipper, so the depth of unrelated parts of the document never
//! matters (serde_json's recursion limit applies only to values that are deserialised, and
//! nothing outside the pointers' paths is). Leaves are captured as raw JSON text and read
//! here, so a number beyond `f64` (`1e400`) makes that field unreadable instead of failing the
//! whole parse.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::time::{UnixMillis, parse_time_text, parse_unix_number};

/// A parsed JSON pointer (RFC 6901): its reference tokens, unescaped (`~1` → `/`, `~0` → `~`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<String>,
}

/// A JSON pointer that is not valid RFC 6901 or does not name a field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON pointer {text:?}: {why}")]
pub struct PointerError {
    text: String,
    why: &'static str,
}

impl JsonPointer {
    /// Parses `text`, which must start with `/` and name at least one token.
    ///
    /// # Errors
    /// [`PointerError`] for an empty pointer, a missing leading `/`, or a `~` not followed by
    /// `0` or `1` (RFC 6901 section 3).
    pub fn parse(text: &str) -> Result<Self, PointerError> {
        let err = |why| PointerError {
            text: text.to_owned(),
            why,
        };
        let Some(rest) = text.strip_prefix('/') else {
            return Err(err(
                "must start with '/' (the whole document cannot be a field)",
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(err("'~' must be followed by '0' or '1' (RFC 6901)")),
                    }
                } else {
                    token.push(c);
                }
            }
            tokens.push(token);
        }
        Ok(JsonPointer {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `self` is a proper or equal prefix of `other` (then one pointer's value would
    /// contain the other's).
    pub fn is_prefix_of(&self, other: &JsonPointer) -> bool {
        other.tokens.len() >= self.tokens.len() && other.tokens[..self.tokens.len()] == self.tokens
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Where a stream's events keep their facts. Defaults: `/lat`, `/lon`, `/occurred_at`.
#[derive(Debug, Clone)]
pub struct Extractor {
    lat: JsonPointer,
    lon: JsonPointer,
    time: JsonPointer,
    root: Node,
}

/// One of the three facts a pointer leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Lat,
    Lon,
    Time,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// Object member name or array index (as text) → child.
    children: Vec<(String, Option<usize>, Node)>,
    target: Option<Target>,
}

/// Two pointers of one stream overlap: one names a value inside the other's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pointers {0} and {1} overlap: one value would contain the other")]
pub struct OverlappingPointers(String, String);

impl Extractor {
    /// An extractor for the three facts.
    ///
    /// # Errors
    /// [`OverlappingPointers`] when one pointer equals or contains another.
    pub fn new(
        lat: JsonPointer,
        lon: JsonPointer,
        time: JsonPointer,
    ) -> Result<Self, OverlappingPointers> {
        let all = [
            (&lat, Target::Lat),
            (&lon, Target::Lon),
            (&time, Target::Time),
        ];
        for (i, (a, _)) in all.iter().enumerate() {
            for (b, _) in &all[i + 1..] {
                if a.is_prefix_of(b) || b.is_prefix_of(a) {
                    return Err(OverlappingPointers(a.text.clone(), b.text.clone()));
                }
            }
        }
        let mut root = Node::default();
        for (pointer, target) in all {
            let mut node = &mut root;
            for token in &pointer.tokens {
                let pos = node.children.iter().position(|(t, _, _)| t == token);
                let pos = pos.unwrap_or_else(|| {
                    let index = token.parse::<usize>().ok().filter(|_| {
                        // RFC 6901: array indices have no leading zeros.
                        token == "0" || !token.starts_with('0')
                    });
                    node.children.push((token.clone(), index, Node::default()));
                    node.children.len() - 1
                });
                node = &mut node.children[pos].2;
            }
            node.target = Some(target);
        }
        Ok(Extractor {
            lat,
            lon,
            time,
            root,
        })
    }

    /// The default pointers `/lat`, `/lon`, `/occurred_at`.
    pub fn default_pointers() -> (JsonPointer, JsonPointer, JsonPointer) {
        (
            JsonPointer::parse("/lat").unwrap_or_else(|_| unreachable!()),
            JsonPointer::parse("/lon").unwrap_or_else(|_| unreachable!()),
            JsonPointer::parse("/occurred_at").unwrap_or_else(|_| unreachable!()),
        )
    }

    /// The pointers, in order latitude, longitude, time.
    pub fn pointers(&self) -> [&JsonPointer; 3] {
        [&self.lat, &self.lon, &self.time]
    }

    /// Reads the facts from `body`. Never fails: what cannot be read is reported as such.
    pub fn extract(&self, body: &[u8]) -> Facts {
        let mut caps = Captures::default();
        let mut de = serde_json::Deserializer::from_slice(body);
        let walked = Walk {
            node: &self.root,
            caps: &mut caps,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end());
        if walked.is_err() {
            return Facts {
                body: BodyState::NotJson,
                coordinates: Coordinates::Missing,
                time: EventTime::Missing,
            };
        }
        let coordinates = match (caps.lat, caps.lon) {
            (None, _) | (_, None) => Coordinates::Missing,
            (Some(lat), Some(lon)) => match (read_number(lat), read_number(lon)) {
                (Some(lat), Some(lon)) => Coordinates::new(lat, lon),
                _ => Coordinates::Invalid,
            },
        };
        let time = match caps.time {
            None => EventTime::Missing,
            Some(raw) => read_time(raw).map_or(EventTime::Invalid, EventTime::At),
        };
        Facts {
            body: BodyState::Json,
            coordinates,
            time,
        }
    }
}

impl Default for Extractor {
    fn default() -> Self {
        let (lat, lon, time) = Self::default_pointers();
        Extractor::new(lat, lon, time).unwrap_or_else(|_| unreachable!())
    }
}

/// What the extractor found in a body.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Facts {
    /// Whether the body parsed as JSON at all.
    pub body: BodyState,
    /// The event's position.
    pub coordinates: Coordinates,
    /// The event's time.
    pub time: EventTime,
}

impl Facts {
    /// Facts of a body that was not read (a `never` stream's body streams through unread).
    pub const UNREAD: Facts = Facts {
        body: BodyState::Unread,
        coordinates: Coordinates::Missing,
        time: EventTime::Missing,
    };
}

/// Whether a body was read and parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Parsed as JSON.
    Json,
    /// Read, but not valid JSON: its facts are all missing.
    NotJson,
    /// Not read (streamed through).
    Unread,
}

/// An event position, validated: latitude in `[-90, 90]` and longitude in `[-180, 180]`
/// degrees, both finite. h3o accepts any finite value and wraps it into some cell, so a
/// swapped pair would land in a wrong cell: the check happens here, before h3o sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Coordinates {
    /// Degrees, in range.
    Valid {
        /// Latitude, degrees in `[-90, 90]`.
        lat: f64,
        /// Longitude, degrees in `[-180, 180]`.
        lon: f64,
    },
    /// Absent (or the body was not JSON).
    Missing,
    /// Present but not a finite number in range (swapped, NaN, `1e400`, a non-number).
    Invalid,
}

impl Coordinates {
    /// Validates a pair of degrees. Written so that NaN fails every comparison.
    pub fn new(lat: f64, lon: f64) -> Self {
        if (-90.0..=90.0).contains(&lat) && (-180.0..=180.0).contains(&lon) {
            Coordinates::Valid { lat, lon }
        } else {
            Coordinates::Invalid
        }
    }
}

/// An event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTime {
    /// Readable.
    At(UnixMillis),
    /// Absent.
    Missing,
    /// Present but not a time any supported form can read.
    Invalid,
}

#[derive(Default)]
struct Captures<'de> {
    lat: Option<&'de RawValue>,
    lon: Option<&'de RawValue>,
    time: Option<&'de RawValue>,
}

impl<'de> Captures<'de> {
    fn set(&mut self, target: Target, raw: &'de RawValue) {
        // Duplicate keys: the last one wins, as serde_json and most JSON readers do.
        match target {
            Target::Lat => self.lat = Some(raw),
            Target::Lon => self.lon = Some(raw),
            Target::Time => self.time = Some(raw),
        }
    }
}

/// The text of a JSON string without its quotes, unescaped only when it has escapes.
fn string_content(raw: &RawValue) -> Option<std::borrow::Cow<'_, str>> {
    let text = raw.get();
    if !text.starts_with('"') {
        return None;
    }
    if !text.contains('\\') {
        return Some(std::borrow::Cow::Borrowed(&text[1..text.len() - 1]));
    }
    serde_json::from_str::<String>(text)
        .ok()
        .map(std::borrow::Cow::Owned)
}

/// A number, or a string holding one ("numbers as strings", a common sender habit).
fn read_number(raw: &RawValue) -> Option<f64> {
    let text = raw.get();
    let first = *text.as_bytes().first()?;
    if first == b'-' || first.is_ascii_digit() {
        return text.parse::<f64>().ok();
    }
    string_content(raw)?.trim().parse::<f64>().ok()
}

fn read_time(raw: &RawValue) -> Option<UnixMillis> {
    let text = raw.get();
    let first = *text.as_bytes().first()?;
    if first == b'-' || first.is_ascii_digit() {
        return parse_unix_number(text.parse::<f64>().ok()?);
    }
    parse_time_text(&string_content(raw)?)
}

/// Descends along the pointer tree; everything else is skipped.
struct Walk<'a, 'de> {
    node: &'a Node,
    caps: &'a mut Captures<'de>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// The value under one matched key or index: either a leaf to capture or a node to walk.
struct Step<'a, 'de> {
    node: &'a Node,
    caps: &'a mut Captures<'de>,
}

impl<'de> DeserializeSeed<'de> for Step<'_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.node.target {
            Some(target) => {
                let raw = <&'de RawValue as de::Deserialize<'de>>::deserialize(deserializer)?;
                self.caps.set(target, raw);
                Ok(())
            }
            None => Walk {
                node: self.node,
                caps: self.caps,
            }
            .deserialize(deserializer),
        }
    }
}

/// Matches an object key against a node's children without allocating.
struct KeySeed<'a>(&'a Node);

impl<'de, 'a> DeserializeSeed<'de> for KeySeed<'a> {
    type Value = Option<&'a Node>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 'a> Visitor<'de> for KeySeed<'a> {
    type Value = Option<&'a Node>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self
            .0
            .children
            .iter()
            .find(|(t, _, _)| t == key)
            .map(|(_, _, n)| n))
    }
}

macro_rules! ignore_scalars {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<(), E> { Ok(()) })*
    };
}

impl<'de> Visitor<'de> for Walk<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    // A scalar where the pointer expected an object or array: the fact is simply absent.
    ignore_scalars!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(child) = map.next_key_seed(KeySeed(self.node))? {
            match child {
                Some(child) => map.next_value_seed(Step {
                    node: child,
                    caps: &mut *self.caps,
                })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            let child = self
                .node
                .children
                .iter()
                .find(|(_, i, _)| *i == Some(index))
                .map(|(_, _, n)| n);
            let more = match child {
                Some(child) => seq
                    .next_element_seed(Step {
                        node: child,
                        caps: &mut *self.caps,
                    })?
                    .is_some(),
                None => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(lat: &str, lon: &str, time: &str) -> Extractor {
        Extractor::new(
            JsonPointer::parse(lat).unwrap(),
            JsonPointer::parse(lon).unwrap(),
            JsonPointer::parse(time).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn reads_defaults() {
        let f = Extractor::default()
            .extract(br#"{"lat":52.52,"lon":13.405,"occurred_at":"2026-05-28T20:26:40Z"}"#);
        assert_eq!(
            f.coordinates,
            Coordinates::Valid {
                lat: 52.52,
                lon: 13.405
            }
        );
        assert_eq!(f.time, EventTime::At(UnixMillis(1_780_000_000_000)));
    }

    #[test]
    fn nested_pointers_and_array_indices() {
        let e = ex("/position/latitude", "/coords/0", "/position/fixTime");
        let f = e.extract(
            br#"{"coords":[13.4,52.5],"position":{"fixTime":1780000000000,"latitude":"52.5"}}"#,
        );
        assert_eq!(
            f.coordinates,
            Coordinates::Valid {
                lat: 52.5,
                lon: 13.4
            }
        );
        assert_eq!(f.time, EventTime::At(UnixMillis(1_780_000_000_000)));
    }

    #[test]
    fn escaped_pointer_tokens() {
        let e = ex("/a~1b", "/m~0n", "/t");
        let f = e.extract(br#"{"a/b":1,"m~n":2,"t":1780000000}"#);
        assert_eq!(f.coordinates, Coordinates::Valid { lat: 1.0, lon: 2.0 });
    }

    #[test]
    fn deep_unrelated_nesting_does_not_matter() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let body =
            format!(r#"{{"extras":{deep},"lat":52.52,"lon":13.405,"occurred_at":1780000000}}"#);
        let f = Extractor::default().extract(body.as_bytes());
        assert_eq!(
            f.coordinates,
            Coordinates::Valid {
                lat: 52.52,
                lon: 13.405
            }
        );
    }

    #[test]
    fn unreadable_values() {
        let e = Extractor::default();
        for body in [
            r#"{"lat":1e400,"lon":13.4}"#,
            r#"{"lat":"NaN","lon":"Infinity"}"#,
            r#"{"lat":151.2,"lon":-33.8}"#,
            r#"{"lat":true,"lon":{}}"#,
        ] {
            assert_eq!(
                e.extract(body.as_bytes()).coordinates,
                Coordinates::Invalid,
                "{body}"
            );
        }
        let f = e.extract(br#"{"lat":1}"#);
        assert_eq!(f.coordinates, Coordinates::Missing);
        assert_eq!(f.time, EventTime::Missing);
        let f = e.extract(br#"{"lat":1,"lon":2,"occurred_at":"soon"}"#);
        assert_eq!(f.time, EventTime::Invalid);
        for body in ["", "not json", r#"{"lat":1,"lon":2"#, "[1,2] x"] {
            assert_eq!(
                e.extract(body.as_bytes()).body,
                BodyState::NotJson,
                "{body}"
            );
        }
        // A top-level array or scalar is JSON without the facts.
        assert_eq!(e.extract(b"[1,2]").coordinates, Coordinates::Missing);
    }

    #[test]
    fn pointer_errors() {
        assert!(JsonPointer::parse("").is_err());
        assert!(JsonPointer::parse("lat").is_err());
        assert!(JsonPointer::parse("/a~2").is_err());
        assert!(
            Extractor::new(
                JsonPointer::parse("/p").unwrap(),
                JsonPointer::parse("/p/lon").unwrap(),
                JsonPointer::parse("/t").unwrap()
            )
            .is_err()
        );
    }
}
