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

/// The shapes the scanner is compared with the serde visitor on: plain pointers (nested,
/// array indices, escaped tokens), and every format preset in every content mode (batches,
/// events arrays, single events, `crs`, streams and devices).
fn oracle_extractors() -> Vec<Extractor> {
    let mut all = vec![
        Extractor::default(),
        ex("/position/latitude", "/coords/0", "/position/fixTime"),
        ex("/a~1b", "/m~0n", "/t"),
        ex("/é", "/k\"q", "/1/0"),
    ];
    let formats = [
        formats::Format::Owntracks,
        formats::Format::Traccar,
        formats::Format::Overland,
        formats::Format::Geojson,
        formats::Format::Cloudevents,
        formats::Format::StandardWebhooks,
    ];
    for format in formats {
        for &mode in format.modes() {
            all.push(Extractor::new(format.preset(mode).0).unwrap());
        }
    }
    all
}

/// Documents the presets read, each a seed for the mangling below.
const ORACLE_SEEDS: &[&str] = &[
    r#"{"lat":52.52,"lon":13.405,"occurred_at":"2026-05-28T20:26:40Z","device_id":"veh-1","x":[1,{"y":null}]}"#,
    r#"{"position":{"latitude":"52.5","fixTime":1780000000000},"coords":[13.4,52.5,{"z":true}],"a/b":1,"m~n":-2e1,"t":1780000000}"#,
    r#"{"é":1.5,"k\"q":2,"1":[[3]],"\u00e9":7,"lat":"5\u0032"}"#,
    r#"{"_type":"location","lat":52.52,"lon":13.4,"tst":1780000000,"tid":"ab","topic":"owntracks/u/d"}"#,
    r#"{"locations":[{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,52.5]},"properties":{"timestamp":"2026-05-28T20:26:40Z","device_id":"d1"}}],"current":{"geometry":{"coordinates":[13.5,52.6]},"properties":{"timestamp":"2026-05-28T20:27:40Z"}}}"#,
    r#"{"type":"FeatureCollection","crs":{"type":"name","properties":{"name":"urn:ogc:def:crs:OGC:1.3:CRS84"}},"features":[{"geometry":{"coordinates":[13.4,52.5,30]},"properties":{"time":1780000000}},{"geometry":null}]}"#,
    r#"[{"specversion":"1.0","type":"vehicle.position","time":"2026-05-28T20:26:40Z","data":{"lat":1,"lon":2}},{"type":"geofence.transition","data":{"lat":"1","lon":"2"}}]"#,
    r#"{"type":"vehicle.position","timestamp":"2026-05-28T20:26:40Z","data":{"lat":1,"lon":2,"device_id":7}}"#,
    r#"{"device":{"id":12,"uniqueId":"abc"},"position":{"latitude":52.5,"longitude":13.4,"fixTime":"2026-05-28T20:26:40.000+00:00","deviceId":12}}"#,
    "  [ ] ",
    "{}",
    "null",
];

/// Bytes that make a document's grammar, its escapes and its UTF-8 go wrong or right.
const ORACLE_BYTES: &[&[u8]] = &[
    b"\"",
    b"\\",
    b",",
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b" ",
    b"\x01",
    b"\xff",
    b"\xc3",
    b"\xa9",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"0",
    b"01",
    b"-",
    b".",
    b"e",
    b"E+",
    b"1e400",
    b"true",
    b"nul",
    b"\t",
    b"\x7f",
    b"\xef\xbb\xbf",
    b"\"lat\"",
    b"\"lat\":",
    b"\"device_id\":\"x\"",
];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]

    /// The scanner reads every body as the serde visitor did: the same body state (JSON or
    /// not), the same events and facts, on documents mangled at random.
    #[test]
    fn the_scanner_reads_as_serde_json_did(
        seed in 0..ORACLE_SEEDS.len(),
        edits in proptest::collection::vec(
            (0usize..4, proptest::prelude::any::<proptest::sample::Index>(), 0..ORACLE_BYTES.len()),
            0..4,
        ),
    ) {
        let mut body = ORACLE_SEEDS[seed].as_bytes().to_vec();
        for (kind, at, with) in edits {
            let at = at.index(body.len() + 1);
            let with = ORACLE_BYTES[with];
            match kind {
                0 => body.splice(at..at, with.iter().copied()).for_each(drop),
                1 if at < body.len() => { body.remove(at); }
                2 if at < body.len() => body.splice(at..=at, with.iter().copied()).for_each(drop),
                _ => body.truncate(at),
            }
        }
        for e in oracle_extractors() {
            proptest::prop_assert_eq!(
                e.extract(&body),
                super::oracle::extract(&e, &body),
                "{}", String::from_utf8_lossy(&body)
            );
        }
    }
}

#[test]
fn the_scanner_reads_the_seeds_and_the_edges_as_serde_json_did() {
    let deep_path = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let edges = [
        "",
        " ",
        "1",
        "-0",
        "1e400",
        "\"\\ud800\"",
        "{\"lat\":1e400}",
        "{\"lat\":\"\\ud800\"}",
        "{\"\\ud800\":1}",
        "{\"\\u006cat\":1,\"lon\":2,\"occurred_at\":3}",
        "{\"a\":1,}",
        "[1,]",
        "{\"lat\":1} x",
        "{\"lat\":01}",
        "{\"x\":\"\x01\"}",
        "{\"x\":\"\\x\"}",
        "{\"position\":1e400}",
        "{\"position\":\"\\ud800\"}",
        &deep_path,
    ];
    let mut bodies: Vec<Vec<u8>> = ORACLE_SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect();
    bodies.extend(edges.iter().map(|s| s.as_bytes().to_vec()));
    bodies.push(b"{\"x\":\"\xff\",\"lat\":1,\"lon\":2}".to_vec());
    bodies.push(b"{\"\xff\":1,\"lat\":1,\"lon\":2}".to_vec());
    bodies.push(b"{\"lat\":\"\xff\",\"lon\":2}".to_vec());
    let nested = |n: usize| format!("{}{}", "{\"a\":".repeat(n), "}".repeat(n)).into_bytes();
    for e in oracle_extractors() {
        let mut deep = e.clone();
        let pointer = format!("/{}", vec!["a"; 130].join("/"));
        if let Ok(d) = Extractor::pointers(
            JsonPointer::parse(&pointer).unwrap(),
            JsonPointer::parse("/lon").unwrap(),
            JsonPointer::parse("/t").unwrap(),
        ) {
            deep = d;
        }
        for body in bodies
            .iter()
            .chain([nested(126), nested(127), nested(128)].iter())
        {
            for ex in [&e, &deep] {
                assert_eq!(
                    ex.extract(body),
                    super::oracle::extract(ex, body),
                    "{}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }
}
