//! Body facts: latitude, longitude and event time read from a JSON body by JSON pointers
//! (RFC 6901), without building a document tree.
//!
//! The walk (`scan.rs`) descends only along the configured pointers and checks every other
//! value for its grammar only, without recursion, so the depth of unrelated parts of the
//! document never matters. Leaves are captured as raw JSON text and read here, so a number
//! beyond `f64` (`1e400`) makes that field unreadable instead of failing the whole parse.

pub mod coding;
pub mod crs;
pub mod formats;
pub mod headers;
#[cfg(test)]
mod oracle;
pub mod params;
pub mod placeholder;
mod pointer;
mod scan;
pub mod time;
mod walk;

pub use params::ParamKeys;
pub use pointer::{JsonPointer, PointerError};
pub use scan::string_stops;

use crate::clock::UnixMillis;
use walk::Captures;

/// Where a body keeps its events and each event its facts: the compiled form of a format
/// preset (see [`formats`]) or of a stream's plain pointers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// The document itself is one event (its pointers apply at the root).
    pub root: bool,
    /// The document is an array of events (CloudEvents batched mode).
    pub root_array: bool,
    /// Arrays of events inside the document (Overland `/locations`, GeoJSON `/features`).
    /// When any is present in a body, the body is a batch of its elements.
    pub arrays: Vec<JsonPointer>,
    /// Single events inside the document that join its batch (Overland's `/current`, the
    /// device's newest position beside a backlog in `/locations`). Each is read with the
    /// event pointers when it is an object with a readable fact.
    pub singles: Vec<JsonPointer>,
    /// Latitude, relative to the event.
    pub lat: Option<JsonPointer>,
    /// Longitude, relative to the event.
    pub lon: Option<JsonPointer>,
    /// A GeoJSON position `[lon, lat]`, relative to the event (instead of `lat`/`lon`).
    pub lonlat: Option<JsonPointer>,
    /// Event time candidates, relative to the event: the first readable one is used.
    pub time: Vec<JsonPointer>,
    /// GeoJSON `crs` members, relative to the event (the event's own, its geometry's): one
    /// that is not CRS84 makes the event's coordinates unreadable ([`crs`]); at the root of a
    /// batch, every event's.
    pub crs: Vec<JsonPointer>,
    /// The event's stream, when the body names it.
    pub stream: Option<JsonPointer>,
    /// The device that sent the event (a string, or a number read as written), relative to
    /// the event: an identity unique to one device (docs/decision.md "Devices").
    pub device: Option<JsonPointer>,
    /// Query or form keys holding the facts (the OsmAnd protocol): read from the query
    /// string when any key is there, else from an `application/x-www-form-urlencoded` body,
    /// else the JSON pointers apply to the body.
    pub params: Option<ParamKeys>,
}

impl Shape {
    /// The pointers as written, by role, for `GET /policy`.
    pub fn describe(&self) -> serde_json::Value {
        let texts =
            |ps: &[JsonPointer]| ps.iter().map(|p| p.as_str().to_owned()).collect::<Vec<_>>();
        let one = |p: &Option<JsonPointer>| p.as_ref().map(|p| p.as_str().to_owned());
        serde_json::json!({
            "events": if self.root_array { vec!["[*]".to_owned()] } else { texts(&self.arrays) },
            "single_events": texts(&self.singles),
            "lat": one(&self.lat),
            "lon": one(&self.lon),
            "lonlat": one(&self.lonlat),
            "time": texts(&self.time),
            "stream": one(&self.stream),
            "device": one(&self.device),
            "crs": texts(&self.crs),
            "params": self.params.as_ref().map(ParamKeys::describe),
        })
    }

    /// One event at the root with the given pointers.
    pub fn plain(lat: JsonPointer, lon: JsonPointer, time: JsonPointer) -> Self {
        Shape {
            root: true,
            lat: Some(lat),
            lon: Some(lon),
            time: vec![time],
            ..Shape::default()
        }
    }
}

/// Reads a body's events and their facts, as a [`Shape`] says.
#[derive(Debug, Clone)]
pub struct Extractor {
    shape: Shape,
    root: Node,
}

/// What a pointer leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Lat,
    Lon,
    LonLat,
    Time(usize),
    Stream,
    Crs,
    Device,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// Object member name or array index (as text) → child.
    children: Vec<(String, Option<usize>, Node)>,
    target: Option<Target>,
    /// This value is an array of events; each element is walked with this subtree.
    each: Option<Box<Node>>,
    /// This value is one more event of the batch, walked with this subtree.
    one: Option<Box<Node>>,
    /// What this subtree holds, as bits of [`mask`]: the targets under it, and
    /// [`mask::EVENTS`] when it holds events arrays or single events.
    mask: u16,
}

/// Bits naming what a subtree of the pointer tree holds, for ambiguity (a fact stated twice,
/// differently, is unreadable).
mod mask {
    use super::Target;

    pub(super) const LAT: u16 = 1;
    pub(super) const LON: u16 = 1 << 1;
    pub(super) const LONLAT: u16 = 1 << 2;
    /// One bit per time candidate, from bit 3.
    pub(super) const TIMES: u16 = 0b1111 << 3;
    pub(super) const STREAM: u16 = 1 << 7;
    pub(super) const EVENTS: u16 = 1 << 8;
    pub(super) const CRS: u16 = 1 << 9;
    pub(super) const DEVICE: u16 = 1 << 10;

    /// The bit of one target.
    pub(super) fn of(target: Target) -> u16 {
        match target {
            Target::Lat => LAT,
            Target::Lon => LON,
            Target::LonLat => LONLAT,
            Target::Time(i) => (1 << 3) << i.min(3),
            Target::Stream => STREAM,
            Target::Crs => CRS,
            Target::Device => DEVICE,
        }
    }

    /// Fills `node.mask` over its subtree; returns it.
    pub(super) fn fill(node: &mut super::Node) -> u16 {
        let mut m = node.target.map_or(0, of);
        if let Some(each) = node.each.as_deref_mut() {
            fill(each);
            m |= EVENTS;
        }
        if let Some(one) = node.one.as_deref_mut() {
            fill(one);
            m |= EVENTS;
        }
        for (_, _, child) in &mut node.children {
            m |= fill(child);
        }
        node.mask = m;
        m
    }
}

impl Node {
    fn at(&mut self, pointer: &JsonPointer) -> &mut Node {
        let mut node = self;
        for token in &pointer.tokens {
            let pos = node.children.iter().position(|(t, _, _)| t == token);
            let pos = pos.unwrap_or_else(|| {
                // RFC 6901: array indices have no leading zeros.
                let index = token
                    .parse::<usize>()
                    .ok()
                    .filter(|_| token == "0" || !token.starts_with('0'));
                node.children.push((token.clone(), index, Node::default()));
                node.children.len() - 1
            });
            node = &mut node.children[pos].2;
        }
        node
    }
}

/// Two pointers of one shape overlap: one names a value inside the other's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pointers {0} and {1} overlap: one value would contain the other")]
pub struct OverlappingPointers(String, String);

impl Extractor {
    /// An extractor for `shape`.
    ///
    /// # Errors
    /// [`OverlappingPointers`] when one pointer equals or contains another.
    pub fn new(shape: Shape) -> Result<Self, OverlappingPointers> {
        let mut event_ptrs: Vec<(&JsonPointer, Target)> = Vec::new();
        event_ptrs.extend(shape.lat.iter().map(|p| (p, Target::Lat)));
        event_ptrs.extend(shape.lon.iter().map(|p| (p, Target::Lon)));
        event_ptrs.extend(shape.lonlat.iter().map(|p| (p, Target::LonLat)));
        event_ptrs.extend(
            shape
                .time
                .iter()
                .enumerate()
                .map(|(i, p)| (p, Target::Time(i))),
        );
        event_ptrs.extend(shape.stream.iter().map(|p| (p, Target::Stream)));
        event_ptrs.extend(shape.crs.iter().map(|p| (p, Target::Crs)));
        event_ptrs.extend(shape.device.iter().map(|p| (p, Target::Device)));
        let check = |all: &[&JsonPointer]| {
            for (i, a) in all.iter().enumerate() {
                for b in &all[i + 1..] {
                    if a.is_prefix_of(b) || b.is_prefix_of(a) {
                        return Err(OverlappingPointers(a.text.clone(), b.text.clone()));
                    }
                }
            }
            Ok(())
        };
        let mut all: Vec<&JsonPointer> = event_ptrs.iter().map(|(p, _)| *p).collect();
        check(&all)?;
        let mut event = Node::default();
        for (pointer, target) in &event_ptrs {
            event.at(pointer).target = Some(*target);
        }
        let mut root = if shape.root {
            event.clone()
        } else {
            Node::default()
        };
        if shape.root {
            all.extend(shape.arrays.iter().chain(&shape.singles));
            check(&all)?;
        } else {
            let arrays: Vec<&JsonPointer> = shape.arrays.iter().chain(&shape.singles).collect();
            check(&arrays)?;
        }
        for array in &shape.arrays {
            root.at(array).each = Some(Box::new(event.clone()));
        }
        for single in &shape.singles {
            root.at(single).one = Some(Box::new(event.clone()));
        }
        if shape.root_array {
            root.each = Some(Box::new(event));
        }
        mask::fill(&mut root);
        Ok(Extractor { shape, root })
    }

    /// The plain form: one event at the root with these pointers.
    ///
    /// # Errors
    /// As [`Extractor::new`].
    pub fn pointers(
        lat: JsonPointer,
        lon: JsonPointer,
        time: JsonPointer,
    ) -> Result<Self, OverlappingPointers> {
        Self::new(Shape::plain(lat, lon, time))
    }

    /// The default pointers `/lat`, `/lon`, `/occurred_at`.
    pub fn default_pointers() -> (JsonPointer, JsonPointer, JsonPointer) {
        (
            JsonPointer::parse("/lat").unwrap_or_else(|_| unreachable!()),
            JsonPointer::parse("/lon").unwrap_or_else(|_| unreachable!()),
            JsonPointer::parse("/occurred_at").unwrap_or_else(|_| unreachable!()),
        )
    }

    /// The shape this extractor reads.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Reads a request's events and their facts: from its query string (`query`, without
    /// the `?`) or a form body (`form`: its `Content-Type` is
    /// `application/x-www-form-urlencoded`) when the shape names [`ParamKeys`], else from
    /// the JSON body (see [`Extractor::extract`]). A fact that the query and the form body
    /// both state, differently, is ambiguous, so unreadable.
    pub fn extract_request(&self, query: Option<&str>, form: bool, body: &[u8]) -> BodyFacts {
        if let Some(keys) = &self.shape.params {
            let from = |e: EventFacts| BodyFacts {
                body: BodyState::Params,
                batch: false,
                ambiguous: false,
                events: vec![e],
            };
            let in_query = query.and_then(|q| keys.read(q.as_bytes()));
            let in_form = if form { keys.read(body) } else { None };
            match (in_query, in_form) {
                // Both state the facts: where they differ, the fact is ambiguous.
                (Some(mut q), Some(f)) => {
                    if q.coordinates != f.coordinates {
                        q.coordinates = Coordinates::Invalid;
                        q.ambiguous = true;
                    }
                    if q.time != f.time {
                        q.time = EventTime::Invalid;
                        q.ambiguous = true;
                    }
                    if q.device != f.device {
                        q.device = Some(DeviceText::Ambiguous);
                        q.ambiguous = true;
                    }
                    q.ambiguous |= f.ambiguous;
                    return from(q);
                }
                (Some(e), None) | (None, Some(e)) => return from(e),
                (None, None) if form => return from(EventFacts::MISSING),
                (None, None) => {}
            }
        }
        self.extract(body)
    }

    /// Reads the events and their facts from a JSON `body`. A leading UTF-8 byte order mark
    /// is skipped (RFC 8259 section 8.1 lets a parser ignore it). Never fails: what cannot
    /// be read is reported as such.
    ///
    /// One pass over the bytes (`extract/scan.rs`): 7,767 instructions for the benchmark's 312-byte
    /// body of fourteen keys and four leaves, walk and reading, against 10,230 with the serde
    /// visitor it replaced (callgrind, `scripts/instructions.sh`).
    pub fn extract(&self, body: &[u8]) -> BodyFacts {
        let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
        let mut caps = Captures::new();
        let mut scanner = scan::Scanner::new(body);
        let walked = match &self.root.each {
            Some(each) => scanner.each(each, &mut caps, 0),
            None => scanner.walk(&self.root, 0, &mut caps, 0),
        }
        .and_then(|()| scanner.end());
        caps.facts(walked.is_ok())
    }

    /// Reads a single-event body into [`Facts`] (the first event of a batch).
    pub fn extract_one(&self, body: &[u8]) -> Facts {
        let facts = self.extract(body);
        let first = facts.events.first().cloned().unwrap_or(EventFacts::MISSING);
        Facts {
            body: facts.body,
            coordinates: first.coordinates,
            time: first.time,
            ambiguous: facts.ambiguous || first.ambiguous,
            device: None,
        }
    }
}

impl Default for Extractor {
    fn default() -> Self {
        let (lat, lon, time) = Self::default_pointers();
        Extractor::pointers(lat, lon, time).unwrap_or_else(|_| unreachable!())
    }
}

/// What the extractor found in a body: its events (one, or a batch's elements).
#[derive(Debug, Clone, PartialEq)]
pub struct BodyFacts {
    /// Whether the body parsed as JSON at all.
    pub body: BodyState,
    /// Whether the body was a batch (an events array was found).
    pub batch: bool,
    /// An object key on the way to the events was stated twice: which events the body holds
    /// is ambiguous, and none of its facts is believed.
    pub ambiguous: bool,
    /// The events; a batch may have none.
    pub events: Vec<EventFacts>,
}

/// One event's facts.
#[derive(Debug, Clone, PartialEq)]
pub struct EventFacts {
    /// Its position.
    pub coordinates: Coordinates,
    /// Its time.
    pub time: EventTime,
    /// Its stream as the body names it (before any route mapping), when the shape reads one.
    pub stream: Option<Box<str>>,
    /// The device it names, when the shape reads one and it is there.
    pub device: Option<DeviceText>,
    /// A fact of it was stated twice, differently (a duplicate key): that fact reads as
    /// unreadable (coordinates and time invalid, stream absent).
    pub ambiguous: bool,
}

impl EventFacts {
    /// An event of which nothing could be read.
    pub const MISSING: EventFacts = EventFacts {
        coordinates: Coordinates::Missing,
        time: EventTime::Missing,
        stream: None,
        device: None,
        ambiguous: false,
    };
}

/// A device id as an event states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceText {
    /// One id (a string's content, or a number as written).
    Id(Box<str>),
    /// Stated twice, differently (a key given twice): no id.
    Ambiguous,
}

/// The device a request names, keyed with a per-process secret so that ids a client chooses
/// cannot collide on purpose in the proxy's device table (SipHash-1-3 under std's random
/// keys), and keyed by where it was read (a route's prefix, or a stream's name) so that the
/// same id on two routes is two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(pub u64);

impl DeviceId {
    /// The device `id` read where `scope` says (a route prefix or a stream name).
    pub fn of(scope: &str, id: &str) -> DeviceId {
        use std::hash::{BuildHasher, Hasher};
        static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let mut h = KEYS.get_or_init(Default::default).build_hasher();
        h.write(scope.as_bytes());
        h.write_u8(0xff);
        h.write(id.as_bytes());
        DeviceId(h.finish())
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
    /// A fact the request states twice, differently (a duplicate header or JSON key), was
    /// read as unreadable.
    pub ambiguous: bool,
    /// The one device the request names (`None`: none, or several: docs/decision.md
    /// "Devices").
    pub device: Option<DeviceId>,
}

impl Facts {
    /// Facts of a body that was not read (a `never` stream's body streams through unread).
    pub const UNREAD: Facts = Facts {
        body: BodyState::Unread,
        coordinates: Coordinates::Missing,
        time: EventTime::Missing,
        ambiguous: false,
        device: None,
    };
}

/// Whether a body was read and parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Parsed as JSON.
    Json,
    /// Read as query or form keys ([`ParamKeys`]).
    Params,
    /// Parsed as JSON, but an opaque envelope (an encrypted OwnTracks message, see
    /// [`formats::Format::opaque_values`]): its facts are sealed.
    Opaque,
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

/// Most time candidates a shape may list.
pub const MAX_TIMES: usize = 4;

#[cfg(test)]
mod tests;
