//! Format presets: where real senders put the stream, the coordinates and the time
//! (docs/decision.md "Decision rule", step 1; examples in tests/cases/formats). Each preset is a [`Shape`] (and,
//! for CloudEvents, one per content mode) plus where the stream name comes from.
//!
//! | preset | events | coordinates | time | stream |
//! |---|---|---|---|---|
//! | `pointers` | the body | `/lat`, `/lon` (the stream's pointers) | `/occurred_at` | header |
//! | `owntracks` | the body | `/lat`, `/lon` | `/tst` (unix s) | body `/_type`, as `owntracks.<_type>` |
//! | `traccar` | the body | `/position/latitude`, `/position/longitude` | `/position/fixTime`, else `/event/eventTime` | header |
//! | `overland` | `/locations[*]`, and `/current` (the newest position, beside a backlog) | GeoJSON `/geometry/coordinates` | `/properties/timestamp` | the route's `stream` |
//! | `geojson` | the Feature, or `/features[*]` | GeoJSON `/geometry/coordinates` | `/properties/time`, else `/properties/timestamp` | header |
//! | `cloudevents` binary | the body (`data`) | `/lat`, `/lon` | `ce-time` header | `ce-type` header |
//! | `cloudevents` structured | the body | `/data/lat`, `/data/lon` | `/time` | body `/type` |
//! | `cloudevents` batched | `[*]` | `/data/lat`, `/data/lon` | `/time` | each event's `/type` |
//! | `osmand` | the request | query (else form body) `lat`, `lon`; else JSON `/location/coords/latitude`, `/location/coords/longitude` | query (else form) `timestamp`; else JSON `/location/timestamp` | header, or the route's `stream` |
//! | `standard-webhooks` | the body | `/data/lat`, `/data/lon` | `/timestamp` (never the `webhook-timestamp` header: a delivery attempt's time) | body `/type` |

use serde::{Deserialize, Serialize};

use super::{JsonPointer, ParamKeys, Shape};

/// A format preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Plain JSON pointers (the stream's `lat`, `lon`, `time`).
    #[default]
    Pointers,
    /// OwnTracks HTTP mode.
    Owntracks,
    /// Traccar position and event forwarding.
    Traccar,
    /// Overland (a batch of GeoJSON Points).
    Overland,
    /// GeoJSON Feature or FeatureCollection.
    Geojson,
    /// CloudEvents HTTP binding: binary, structured and batched content modes.
    Cloudevents,
    /// Standard Webhooks.
    StandardWebhooks,
    /// The OsmAnd protocol (Traccar Client, and GPSLogger-style query URLs): facts in the
    /// query string or a form body, else Traccar Client's JSON.
    Osmand,
}

/// CloudEvents content mode, from `Content-Type` (CloudEvents HTTP binding, section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentMode {
    /// `application/cloudevents-batch+json`.
    Batched,
    /// `application/cloudevents+json`.
    Structured,
    /// Anything else: the body is the event's data, attributes are `ce-` headers.
    Binary,
}

impl ContentMode {
    /// Index, among `modes`, of the mode this `Content-Type` selects; 0 (the first, the
    /// format's default) when it is not among them.
    pub fn pick(
        content_type: Option<&[u8]>,
        modes: impl IntoIterator<Item = ContentMode>,
    ) -> usize {
        let want = ContentMode::of(content_type);
        modes.into_iter().position(|m| m == want).unwrap_or(0)
    }

    /// The mode a `Content-Type` value selects.
    pub fn of(content_type: Option<&[u8]>) -> Self {
        let essence = content_type.map(media_type).unwrap_or_default();
        let structured = b"application/cloudevents";
        if essence.eq_ignore_ascii_case(b"application/cloudevents-batch+json") {
            ContentMode::Batched
        } else if essence
            .get(..structured.len())
            .is_some_and(|e| e.eq_ignore_ascii_case(structured))
        {
            ContentMode::Structured
        } else {
            ContentMode::Binary
        }
    }
}

/// The media type of a `Content-Type` value, parameters and surrounding whitespace left out
/// (RFC 9110 section 8.3.1); compare it case-insensitively. Borrowed: nothing is allocated.
pub fn media_type(content_type: &[u8]) -> &[u8] {
    content_type
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii()
}

/// Where a preset takes the stream from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresetStream {
    /// The proxy's stream header (or the route's).
    Header,
    /// A named header.
    NamedHeader(&'static str),
    /// A body field, with a prefix put before its value.
    Field(JsonPointer, &'static str),
}

fn p(text: &str) -> JsonPointer {
    JsonPointer::parse(text).unwrap_or_else(|_| unreachable!("preset pointers are valid"))
}

impl Format {
    /// The shape of events of this format (for CloudEvents, of the given content mode), and
    /// where the stream comes from, and a header holding the time if the body does not.
    pub fn preset(self, mode: ContentMode) -> (Shape, PresetStream, Option<&'static str>) {
        let one = |lat: &str, lon: &str, time: &[&str]| Shape {
            root: true,
            lat: Some(p(lat)),
            lon: Some(p(lon)),
            time: time.iter().map(|t| p(t)).collect(),
            ..Shape::default()
        };
        match self {
            Format::Pointers => (
                one("/lat", "/lon", &["/occurred_at"]),
                PresetStream::Header,
                None,
            ),
            Format::Owntracks => (
                Shape {
                    device: Some(p("/topic")),
                    ..one("/lat", "/lon", &["/tst"])
                },
                PresetStream::Field(p("/_type"), "owntracks."),
                None,
            ),
            Format::Traccar => (
                Shape {
                    device: Some(p("/device/uniqueId")),
                    ..one(
                        "/position/latitude",
                        "/position/longitude",
                        &["/position/fixTime", "/event/eventTime"],
                    )
                },
                PresetStream::Header,
                None,
            ),
            Format::Overland => (
                Shape {
                    arrays: vec![p("/locations")],
                    singles: vec![p("/current")],
                    lonlat: Some(p("/geometry/coordinates")),
                    time: vec![p("/properties/timestamp")],
                    crs: vec![p("/crs"), p("/geometry/crs")],
                    device: Some(p("/properties/device_id")),
                    ..Shape::default()
                },
                PresetStream::Header,
                None,
            ),
            Format::Geojson => (
                Shape {
                    root: true,
                    arrays: vec![p("/features")],
                    lonlat: Some(p("/geometry/coordinates")),
                    time: vec![p("/properties/time"), p("/properties/timestamp")],
                    crs: vec![p("/crs"), p("/geometry/crs")],
                    ..Shape::default()
                },
                PresetStream::Header,
                None,
            ),
            Format::Cloudevents => match mode {
                ContentMode::Binary => (
                    one("/lat", "/lon", &[]),
                    PresetStream::NamedHeader("ce-type"),
                    Some("ce-time"),
                ),
                ContentMode::Structured | ContentMode::Batched => {
                    let mut shape = one("/data/lat", "/data/lon", &["/time"]);
                    shape.stream = Some(p("/type"));
                    shape.device = Some(p("/subject"));
                    if mode == ContentMode::Batched {
                        shape.root = false;
                        shape.root_array = true;
                    }
                    (shape, PresetStream::Field(p("/type"), ""), None)
                }
            },
            Format::StandardWebhooks => (
                one("/data/lat", "/data/lon", &["/timestamp"]),
                PresetStream::Field(p("/type"), ""),
                None,
            ),
            Format::Osmand => (
                Shape {
                    params: Some(ParamKeys {
                        lat: "lat".into(),
                        lon: "lon".into(),
                        time: vec!["timestamp".into()],
                        device: vec!["id".into(), "deviceid".into()],
                    }),
                    device: Some(p("/device_id")),
                    ..one(
                        "/location/coords/latitude",
                        "/location/coords/longitude",
                        &["/location/timestamp"],
                    )
                },
                PresetStream::Header,
                None,
            ),
        }
    }

    /// Headers that name the device when the body does not, all of them together (their
    /// values joined with `/`): OwnTracks' `X-Limit-U` and `X-Limit-D` (user and device; its
    /// `tid` is a two-letter label many devices share, never an identity); CloudEvents
    /// binary mode's `ce-subject` (never `ce-source`, often one gateway for a fleet).
    pub fn device_headers(self, mode: ContentMode) -> &'static [&'static str] {
        match (self, mode) {
            (Format::Owntracks, _) => &["x-limit-u", "x-limit-d"],
            (Format::Cloudevents, ContentMode::Binary) => &["ce-subject"],
            _ => &[],
        }
    }

    /// The body this format's sender counts as a successful delivery, when its client reads
    /// the body of a 2xx (served as `application/json`; the policy's `Policy::stale_body` picks it):
    /// - `owntracks`: `[]`. OwnTracks 2.5.x treats a 2xx as delivered only when the body
    ///   parses as a JSON array (the commands to run; empty: none), and re-queues anything
    ///   else.
    /// - `overland`: `{"result":"ok"}`. Overland deletes a batch only on a JSON object whose
    ///   `result` is `"ok"`.
    /// - every other format: `None` (their senders look at the status only).
    pub fn success_body(self) -> Option<&'static str> {
        match self {
            Format::Owntracks => Some("[]"),
            Format::Overland => Some(r#"{"result":"ok"}"#),
            _ => None,
        }
    }

    /// Values of the preset's body stream field that name an opaque envelope: an event whose
    /// facts, and whose real type, the proxy cannot read, and which may carry a never-shed
    /// event. OwnTracks with encryption sends every message, transitions included, as
    /// `{"_type":"encrypted","data":"…"}`. A stream such a value maps to must be `never`
    /// (`check` refuses anything else), and these events are counted apart.
    pub fn opaque_values(self) -> &'static [&'static str] {
        match self {
            Format::Owntracks => &["encrypted"],
            _ => &[],
        }
    }

    /// Where an event's data sits in this content mode, for pointer overrides (which are
    /// relative to the data): `/data` for CloudEvents structured and batched events (in
    /// binary mode the body is the data); the event itself for every other format.
    pub fn data_root(self, mode: ContentMode) -> Option<&'static str> {
        match (self, mode) {
            (Format::Cloudevents, ContentMode::Structured | ContentMode::Batched) => Some("/data"),
            _ => None,
        }
    }

    /// Whether the format's events come from the body in more than one content mode.
    pub fn modes(self) -> &'static [ContentMode] {
        match self {
            Format::Cloudevents => &[
                ContentMode::Binary,
                ContentMode::Structured,
                ContentMode::Batched,
            ],
            _ => &[ContentMode::Binary],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::{Coordinates, EventTime, Extractor};

    fn extract(format: Format, mode: ContentMode, body: &str) -> crate::extract::BodyFacts {
        let (mut shape, stream, _) = format.preset(mode);
        if let PresetStream::Field(p, _) = stream {
            shape.stream = Some(p);
        }
        Extractor::new(shape).unwrap().extract(body.as_bytes())
    }

    #[test]
    fn coordinates_in_every_order() {
        // Named fields, GeoJSON [lon, lat] (with altitude), numbers as strings.
        let named = extract(
            Format::Pointers,
            ContentMode::Binary,
            r#"{"lat":"52.5","lon":13.4}"#,
        );
        let geo = extract(
            Format::Geojson,
            ContentMode::Binary,
            r#"{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,52.5,34.0]}}"#,
        );
        let strings = extract(
            Format::Geojson,
            ContentMode::Binary,
            r#"{"geometry":{"coordinates":["13.4","52.5"]}}"#,
        );
        for f in [named, geo, strings] {
            assert_eq!(
                f.events[0].coordinates,
                Coordinates::Valid {
                    lat: 52.5,
                    lon: 13.4
                }
            );
        }
        // A swapped GeoJSON pair (lat first) with lat out of range is invalid, not wrapped.
        let swapped = extract(
            Format::Geojson,
            ContentMode::Binary,
            r#"{"geometry":{"coordinates":[-33.8,151.2]}}"#,
        );
        assert_eq!(swapped.events[0].coordinates, Coordinates::Invalid);
    }

    #[test]
    fn batches_are_read_per_event() {
        let f = extract(
            Format::Cloudevents,
            ContentMode::Batched,
            r#"[{"type":"a","time":"2026-05-28T20:26:40Z","data":{"lat":1,"lon":2}},{"type":"b","data":{}}]"#,
        );
        assert!(f.batch);
        assert_eq!(f.events.len(), 2);
        assert_eq!(f.events[0].stream.as_deref(), Some("a"));
        assert_eq!(f.events[1].stream.as_deref(), Some("b"));
        assert_eq!(
            f.events[0].coordinates,
            Coordinates::Valid { lat: 1.0, lon: 2.0 }
        );
        assert_eq!(f.events[1].coordinates, Coordinates::Missing);
        assert!(matches!(f.events[0].time, EventTime::At(_)));
        // A FeatureCollection is a batch; a single Feature is not.
        let fc = extract(
            Format::Geojson,
            ContentMode::Binary,
            r#"{"type":"FeatureCollection","features":[{"geometry":{"coordinates":[1,2]}},{"geometry":{"coordinates":[3,4]}}]}"#,
        );
        assert!(fc.batch);
        assert_eq!(fc.events.len(), 2);
        // Traccar: fixTime, else the event's time.
        let t = extract(
            Format::Traccar,
            ContentMode::Binary,
            r#"{"event":{"eventTime":"2026-05-28T20:26:40.000+00:00"}}"#,
        );
        assert!(matches!(t.events[0].time, EventTime::At(_)));
        assert_eq!(t.events[0].coordinates, Coordinates::Missing);
    }

    #[test]
    fn overland_current_joins_the_batch() {
        let body = r#"{"locations":[{"geometry":{"coordinates":[11.58,48.13]},"properties":{"timestamp":"2026-05-28T18:26:40Z"}}],
            "current":{"geometry":{"coordinates":[13.405,52.52]},"properties":{"timestamp":"2026-05-28T20:26:40Z"}}}"#;
        let f = extract(Format::Overland, ContentMode::Binary, body);
        assert!(f.batch);
        assert_eq!(f.events.len(), 2);
        assert_eq!(f.events[1].coordinates, Coordinates::new(52.52, 13.405));
        // `current` first, null, or absent: never an extra untimed event.
        let first =
            r#"{"current":{"properties":{"timestamp":"2026-05-28T20:26:40Z"}},"locations":[]}"#;
        assert_eq!(
            extract(Format::Overland, ContentMode::Binary, first)
                .events
                .len(),
            1
        );
        for none in [
            r#"{"locations":[],"current":null}"#,
            r#"{"locations":[],"current":{}}"#,
        ] {
            let f = extract(Format::Overland, ContentMode::Binary, none);
            assert!(f.events.is_empty(), "{none}");
        }
    }

    #[test]
    fn content_modes() {
        assert_eq!(
            ContentMode::of(Some(b"application/cloudevents-batch+json")),
            ContentMode::Batched
        );
        assert_eq!(
            ContentMode::of(Some(b"application/cloudevents+json; charset=utf-8")),
            ContentMode::Structured
        );
        assert_eq!(
            ContentMode::of(Some(b"application/json")),
            ContentMode::Binary
        );
        assert_eq!(ContentMode::of(None), ContentMode::Binary);
    }
}
