//! Extraction tests: bodies in, facts out.

use super::*;

fn ex(lat: &str, lon: &str, time: &str) -> Extractor {
    Extractor::pointers(
        JsonPointer::parse(lat).unwrap(),
        JsonPointer::parse(lon).unwrap(),
        JsonPointer::parse(time).unwrap(),
    )
    .unwrap()
}

#[test]
fn reads_defaults() {
    let f = Extractor::default()
        .extract_one(br#"{"lat":52.52,"lon":13.405,"occurred_at":"2026-05-28T20:26:40Z"}"#);
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
    let f = e.extract_one(
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
    let f = e.extract_one(br#"{"a/b":1,"m~n":2,"t":1780000000}"#);
    assert_eq!(f.coordinates, Coordinates::Valid { lat: 1.0, lon: 2.0 });
}

#[test]
fn deep_unrelated_nesting_does_not_matter() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = format!(r#"{{"extras":{deep},"lat":52.52,"lon":13.405,"occurred_at":1780000000}}"#);
    let f = Extractor::default().extract_one(body.as_bytes());
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
            e.extract_one(body.as_bytes()).coordinates,
            Coordinates::Invalid,
            "{body}"
        );
    }
    let f = e.extract_one(br#"{"lat":1}"#);
    assert_eq!(f.coordinates, Coordinates::Missing);
    assert_eq!(f.time, EventTime::Missing);
    let f = e.extract_one(br#"{"lat":1,"lon":2,"occurred_at":"soon"}"#);
    assert_eq!(f.time, EventTime::Invalid);
    for body in ["", "not json", r#"{"lat":1,"lon":2"#, "[1,2] x"] {
        assert_eq!(
            e.extract_one(body.as_bytes()).body,
            BodyState::NotJson,
            "{body}"
        );
    }
    // A top-level array or scalar is JSON without the facts.
    assert_eq!(e.extract_one(b"[1,2]").coordinates, Coordinates::Missing);
}

#[test]
fn facts_stated_twice_differently_are_unreadable() {
    let e = Extractor::default();
    let f = e.extract(br#"{"lat":1,"lon":2,"lat":3,"occurred_at":1780000000}"#);
    assert_eq!(f.events[0].coordinates, Coordinates::Invalid);
    assert_eq!(
        f.events[0].time,
        EventTime::At(UnixMillis(1_780_000_000_000))
    );
    assert!(f.events[0].ambiguous);
    let f = e.extract(br#"{"lat":1,"lon":2,"occurred_at":1780000000,"occurred_at":1}"#);
    assert_eq!(f.events[0].time, EventTime::Invalid);
    // The same value twice is one statement.
    let f = e.extract(br#"{"lat":1,"lon":2,"lat":1}"#);
    assert_eq!(
        f.events[0].coordinates,
        Coordinates::Valid { lat: 1.0, lon: 2.0 }
    );
    assert!(!f.events[0].ambiguous);
    // A parent object twice is never merged.
    let nested = ex("/p/lat", "/p/lon", "/t");
    let f = nested.extract(br#"{"p":{"lat":1},"p":{"lon":2}}"#);
    assert_eq!(f.events[0].coordinates, Coordinates::Invalid);
    // An events array twice: the body is ambiguous.
    let shape = Shape {
        arrays: vec![JsonPointer::parse("/e").unwrap()],
        ..Shape::plain(
            JsonPointer::parse("/lat").unwrap(),
            JsonPointer::parse("/lon").unwrap(),
            JsonPointer::parse("/t").unwrap(),
        )
    };
    let batch = Extractor::new(Shape {
        root: false,
        ..shape
    })
    .unwrap();
    assert!(batch.extract(br#"{"e":[{"lat":1}],"e":[]}"#).ambiguous);
    assert!(!batch.extract(br#"{"e":[{"lat":1}]}"#).ambiguous);
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let f = Extractor::default().extract_one(b"\xEF\xBB\xBF{\"lat\":52.52,\"lon\":13.405}");
    assert_eq!(f.body, BodyState::Json);
    assert_eq!(f.coordinates, Coordinates::new(52.52, 13.405));
    // Only at the start, and only the whole mark.
    for body in [&b"{}\xEF\xBB\xBF"[..], b"\xEF\xBB{}"] {
        assert_eq!(
            Extractor::default().extract_one(body).body,
            BodyState::NotJson
        );
    }
}

#[test]
fn pointer_errors() {
    assert!(JsonPointer::parse("").is_err());
    assert!(JsonPointer::parse("lat").is_err());
    assert!(JsonPointer::parse("/a~2").is_err());
    assert!(
        Extractor::pointers(
            JsonPointer::parse("/p").unwrap(),
            JsonPointer::parse("/p/lon").unwrap(),
            JsonPointer::parse("/t").unwrap()
        )
        .is_err()
    );
}

#[test]
fn query_and_form_that_disagree_are_ambiguous() {
    let (shape, _, _) = super::formats::Format::Osmand.preset(super::formats::ContentMode::Binary);
    let e = Extractor::new(shape).unwrap();
    let q = "lat=52.52&lon=13.405&timestamp=1780000000";
    let same = e.extract_request(Some(q), true, q.as_bytes());
    assert_eq!(same.events[0].coordinates, Coordinates::new(52.52, 13.405));
    assert!(!same.events[0].ambiguous);
    let other = e.extract_request(Some(q), true, b"lat=48.1&lon=11.5&timestamp=1780000000");
    assert_eq!(other.events[0].coordinates, Coordinates::Invalid);
    assert_eq!(
        other.events[0].time,
        EventTime::At(UnixMillis(1_780_000_000_000))
    );
    assert!(other.events[0].ambiguous);
}
