//! Assessment: a request's body and headers read into the one stream and the facts that
//! [`decide`](super::decide) takes. Written once, for the proxy, `shedgate explain` and the
//! decision bench.

use std::sync::LazyLock;

use http::HeaderMap;
use http::header::CONTENT_TYPE;

use super::summarise;
use crate::extract::formats::media_type;
use crate::extract::headers::{Stated, read_one};
use crate::extract::placeholder::is_placeholder;
use crate::extract::time::parse_time_text;
use crate::extract::{Coordinates, DeviceId, DeviceText, EventFacts, EventTime, Extractor, Facts};
use crate::policy::{Policy, StreamId};

/// What is known of a request before its body is read: the route that matched and its content
/// mode, and the stream when a header, the route or the caller named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The matched route and its content mode, as indices into the policy's routes (see
    /// [`Policy::route_index`] and [`crate::policy::Route::mode_index`]); `None` when no
    /// route matched.
    pub route: Option<(usize, usize)>,
    /// `Some(stream)`: known before the body (`Some(None)`: a stream the policy does not
    /// name, or none); `None`: each event names its stream in the body.
    pub known: Option<Option<StreamId>>,
    /// A header that names the stream or the content mode was stated twice, differently:
    /// the stream is unknown (`known` is `Some(None)`), so never shed, and counted.
    pub ambiguous: bool,
}

/// The pointers of a stream nobody classified (`/lat`, `/lon`, `/occurred_at`), for bodies
/// read on a route whose stream turned out unknown.
static DEFAULT_EXTRACTOR: LazyLock<Extractor> = LazyLock::new(Extractor::default);

/// Reads `body` as `reading` and the policy say, and reduces its events to the request's
/// stream and facts (see [`summarise`] for batches).
///
/// - The extractor is the route mode's (unless the route only names the stream), else the
///   known stream's mode for the request's `Content-Type`, else the default pointers.
/// - Query or form keys, when the extractor names them, come before the JSON body
///   (`query` is the request target's query, without the `?`).
/// - A mode's time header (CloudEvents binary mode's `ce-time`) gives every event's time.
/// - Each event's stream is the known one, or the one its body names, mapped through the
///   route's stream source.
/// - A body without events (an empty batch) has no coordinates and no time.
///
/// Never fails: what cannot be read is reported in the facts.
pub fn assess(
    policy: &Policy,
    reading: Reading,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> (Option<StreamId>, Facts) {
    let (stream, facts, _) = assess_with_device(policy, reading, headers, query, body);
    (stream, facts)
}

/// The device id a request states, as [`assess_with_device`] judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedDevice {
    /// No id (none stated, several, or no route or stream to key one in).
    None,
    /// One id: its text as stated (for the access log's keyed hash); [`Facts::device`] is
    /// its key.
    Id(String),
    /// A placeholder that names no device (`unknown`, `null`, one the policy lists:
    /// [`crate::extract::placeholder::is_placeholder`]): [`Facts::device`] is `None`, so the
    /// request is decided as one naming no device.
    Placeholder,
}

/// As [`assess`], with the device id as the request states it (the text [`Facts::device`]
/// is keyed from), for the access log's keyed hash of it, or that it was a placeholder.
pub fn assess_with_device(
    policy: &Policy,
    reading: Reading,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> (Option<StreamId>, Facts, NamedDevice) {
    let stream = reading.known.flatten();
    // `Content-Type` is read only where it changes the reading: the content mode of a stream
    // read without a route, when its format has more than one, and whether a body is a form,
    // when the extractor reads query or form keys. (The route's mode was picked from it
    // already, by the caller.) An ambiguous `Content-Type` reads as none; it never reaches
    // the stream's read mode (the stream is unknown then).
    let content_type = || read_one(headers, &CONTENT_TYPE).value();
    let mode = reading
        .route
        .map(|(i, j)| policy.routes()[i].mode_at(j))
        .filter(|m| !m.stream_pointers);
    let (extractor, time_header, device_headers): (_, _, &[http::HeaderName]) = match (mode, stream)
    {
        (Some(m), _) => (&m.extractor, m.time_header.as_ref(), &m.device_headers),
        (None, Some(id)) => {
            let s = policy.stream_policy(id);
            let m = match s.modes.as_slice() {
                [one] => one,
                _ => s.read_mode(content_type().map(http::HeaderValue::as_bytes)),
            };
            (&m.extractor, m.time_header.as_ref(), &m.device_headers)
        }
        (None, None) => (&*DEFAULT_EXTRACTOR, None, &[]),
    };
    let form = extractor.shape().params.is_some()
        && content_type().is_some_and(|v| {
            media_type(v.as_bytes()).eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
        });
    let mut body_facts = extractor.extract_request(query, form, body);
    if body_facts.ambiguous {
        // The events themselves are stated twice: nothing of the body is believed. A stream
        // the body was to name is unknown, so never shed.
        let facts = Facts {
            body: body_facts.body,
            coordinates: Coordinates::Invalid,
            time: EventTime::Invalid,
            ambiguous: true,
            device: None,
        };
        return (reading.known.flatten(), facts, NamedDevice::None);
    }
    // CloudEvents binary mode: the time is an attribute header, not in the data.
    if let Some(h) = time_header {
        let time = match read_one(headers, h) {
            Stated::Absent => None,
            Stated::One(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(parse_time_text)
                    .map_or(EventTime::Invalid, EventTime::At),
            ),
            Stated::Ambiguous => {
                for e in &mut body_facts.events {
                    e.ambiguous = true;
                }
                Some(EventTime::Invalid)
            }
        };
        // An unreadable header leaves the body's own time (binary mode has none).
        for e in &mut body_facts.events {
            match time {
                Some(EventTime::At(at)) => e.time = EventTime::At(at),
                Some(t) if e.time == EventTime::Missing => e.time = t,
                _ => {}
            }
        }
    }
    let source = reading
        .route
        .map(|(i, j)| &policy.routes()[i].mode_at(j).stream);
    // Each event's stream: known before the body, or named in the body (mapped by the route).
    let stream_of = |e: &EventFacts| match (reading.known, source) {
        (Some(known), _) => known,
        (None, Some(source)) => e
            .stream
            .as_deref()
            .and_then(|v| source.map_field(v))
            .and_then(|n| policy.stream(&n)),
        (None, None) => None,
    };
    // An opaque envelope (an encrypted OwnTracks message) says so in the body state, so it is
    // counted apart; its stream is whatever the route maps the envelope's type to.
    let opaque = reading
        .route
        .map(|(i, _)| policy.routes()[i].format.opaque_values())
        .unwrap_or_default();
    if !opaque.is_empty()
        && body_facts
            .events
            .iter()
            .any(|e| e.stream.as_deref().is_some_and(|v| opaque.contains(&v)))
    {
        body_facts.body = crate::extract::BodyState::Opaque;
    }
    if body_facts.events.is_empty() {
        let no_facts = Facts {
            body: body_facts.body,
            coordinates: Coordinates::Missing,
            time: EventTime::Missing,
            ambiguous: false,
            device: None,
        };
        return (stream, no_facts, NamedDevice::None);
    }
    let (stream, mut facts) = summarise(policy, body_facts.body, &body_facts.events, stream_of);
    let (device, ambiguous) = device_of(&body_facts.events, headers, device_headers);
    facts.ambiguous |= ambiguous;
    // Keyed by where it was read: the route's prefix, else the stream's name.
    let scope = match (reading.route, stream) {
        (Some((i, _)), _) => Some(policy.routes()[i].prefix.as_str()),
        (None, Some(id)) => Some(policy.stream_policy(id).name.as_str()),
        (None, None) => None,
    };
    let named = match scope.zip(device) {
        None => NamedDevice::None,
        Some((_, id)) if is_placeholder(&id, &policy.device_trust().placeholders) => {
            NamedDevice::Placeholder
        }
        Some((scope, id)) => {
            facts.device = Some(DeviceId::of(scope, &id));
            NamedDevice::Id(id)
        }
    };
    (stream, facts, named)
}

/// The one device a request's events name (docs/decision.md "Devices"): every event's id
/// alike, or, when no event names one, the format's device headers together (joined with
/// `/`). Events that name different devices, or some an id and some none, name no device;
/// a header or key stated twice, differently, names none and is ambiguous (the second value).
fn device_of(
    events: &[EventFacts],
    headers: &HeaderMap,
    device_headers: &[http::HeaderName],
) -> (Option<String>, bool) {
    let mut ids = events.iter().map(|e| e.device.as_ref());
    let first = ids.next().flatten();
    match first {
        Some(DeviceText::Ambiguous) => return (None, true),
        Some(DeviceText::Id(id)) => {
            let same = events
                .iter()
                .all(|e| matches!(&e.device, Some(DeviceText::Id(other)) if other == id));
            let ambiguous = events
                .iter()
                .any(|e| e.device == Some(DeviceText::Ambiguous));
            return (same.then(|| id.to_string()), ambiguous);
        }
        None if events.iter().any(|e| e.device.is_some()) => {
            let ambiguous = events
                .iter()
                .any(|e| e.device == Some(DeviceText::Ambiguous));
            return (None, ambiguous);
        }
        None => {}
    }
    if device_headers.is_empty() {
        return (None, false);
    }
    let mut parts = Vec::with_capacity(device_headers.len());
    for h in device_headers {
        match read_one(headers, h) {
            Stated::One(v) => match v.to_str() {
                Ok(text) if !text.trim().is_empty() => parts.push(text.trim()),
                _ => return (None, false),
            },
            Stated::Absent => return (None, false),
            Stated::Ambiguous => return (None, true),
        }
    }
    (Some(parts.join("/")), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::UnixMillis;
    use crate::extract::BodyState;
    use crate::policy::PolicyFiles;

    fn policy() -> Policy {
        let files = PolicyFiles::from_texts(
            r#"
[streams."vehicle.position"]
supersession = "self-superseding"

[streams."geofence.transition"]
supersession = "never"

[[routes]]
prefix = "/ingest/ce"
format = "cloudevents"
"#,
            None,
        );
        crate::policy::compile(&files).unwrap().policy
    }

    fn route(policy: &Policy, content_type: &str) -> Reading {
        let i = policy.route_index("/ingest/ce").unwrap();
        let j = policy.routes()[i].mode_index(Some(content_type.as_bytes()));
        Reading {
            route: Some((i, j)),
            known: None,
            ambiguous: false,
        }
    }

    #[test]
    fn a_known_stream_is_read_with_its_own_pointers() {
        let p = policy();
        let id = p.stream("vehicle.position");
        let reading = Reading {
            route: None,
            known: Some(id),
            ambiguous: false,
        };
        let body = br#"{"lat":52.52,"lon":13.405,"occurred_at":1780000000}"#;
        let (stream, facts) = assess(&p, reading, &HeaderMap::new(), None, body);
        assert_eq!(stream, id);
        assert_eq!(facts.coordinates, Coordinates::new(52.52, 13.405));
        assert_eq!(facts.time, EventTime::At(UnixMillis(1_780_000_000_000)));
    }

    #[test]
    fn a_batch_with_one_never_event_is_that_stream() {
        let p = policy();
        let body = br#"[
            {"type":"vehicle.position","time":"2026-05-28T20:26:40Z","data":{"lat":1,"lon":2}},
            {"type":"geofence.transition","time":"2026-05-28T20:26:40Z","data":{"lat":1,"lon":2}}
        ]"#;
        let reading = route(&p, "application/cloudevents-batch+json");
        let (stream, _) = assess(&p, reading, &HeaderMap::new(), None, body);
        assert_eq!(stream, p.stream("geofence.transition"));
    }

    #[test]
    fn binary_mode_takes_the_time_from_its_header() {
        let p = policy();
        let mut headers = HeaderMap::new();
        headers.insert("ce-time", "2026-05-28T20:26:40Z".parse().unwrap());
        let reading = Reading {
            known: Some(p.stream("vehicle.position")),
            ..route(&p, "application/json")
        };
        let (_, facts) = assess(&p, reading, &headers, None, br#"{"lat":1,"lon":2}"#);
        assert_eq!(facts.time, EventTime::At(UnixMillis(1_780_000_000_000)));
    }

    #[test]
    fn an_empty_batch_has_no_facts_but_its_body_state() {
        let p = policy();
        let reading = route(&p, "application/cloudevents-batch+json");
        let (stream, facts) = assess(&p, reading, &HeaderMap::new(), None, b"[]");
        assert_eq!(stream, None);
        assert_eq!(facts.body, BodyState::Json);
        assert_eq!(facts.coordinates, Coordinates::Missing);
        assert_eq!(facts.time, EventTime::Missing);
    }
}
