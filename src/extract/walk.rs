//! What the walk ([`super::scan`]) captures of each event, as raw JSON text, and its reading
//! into coordinates, a time, a stream name and a device.
//!
//! The small readers below are `#[inline]`: they are called once per captured field from the
//! walk. Without it, splitting the walk into its own module cost 10% of extraction (`cargo
//! bench --bench decision`, `part/extract-3-fields`: 0.78 µs against 0.70 µs before the split;
//! 0.69 µs with it).

use super::crs::Crs;
use super::time::{parse_time_text, parse_unix_number};
use super::{
    BodyFacts, BodyState, Coordinates, DeviceText, EventFacts, EventTime, MAX_TIMES, Target, mask,
};
use crate::clock::UnixMillis;

#[derive(Default)]
pub(super) struct EventCaps<'de> {
    lat: Option<&'de str>,
    lon: Option<&'de str>,
    lonlat: Option<&'de str>,
    time: [Option<&'de str>; MAX_TIMES],
    stream: Option<&'de str>,
    /// `crs` members, the event's and its geometry's (at most two are kept).
    crs: [Option<&'de str>; 2],
    device: Option<&'de str>,
    /// Targets stated twice, differently (bits of [`mask`]): unreadable.
    pub(super) conflicts: u16,
}

impl<'de> EventCaps<'de> {
    /// Nothing was captured.
    pub(super) fn is_empty(&self) -> bool {
        self.lat.is_none()
            && self.lon.is_none()
            && self.lonlat.is_none()
            && self.time.iter().all(Option::is_none)
            && self.stream.is_none()
            && self.device.is_none()
    }

    #[inline]
    pub(super) fn set(&mut self, target: Target, raw: &'de str) {
        // A duplicate key with another value is ambiguous (readers disagree on which wins):
        // the fact becomes unreadable, never the first or the last.
        let slot = match target {
            Target::Lat => &mut self.lat,
            Target::Lon => &mut self.lon,
            Target::LonLat => &mut self.lonlat,
            Target::Time(i) => match self.time.get_mut(i) {
                Some(slot) => slot,
                None => return,
            },
            Target::Stream => &mut self.stream,
            Target::Device => &mut self.device,
            Target::Crs => match self.crs.iter_mut().find(|c| c.is_none()) {
                Some(slot) => slot,
                None => &mut self.crs[1],
            },
        };
        match slot {
            None => *slot = Some(raw),
            Some(prev) if *prev == raw => {}
            Some(_) => self.conflicts |= mask::of(target),
        }
    }

    /// A `crs` member other than CRS84 ([`crate::extract::crs`]): its positions may be
    /// `[lat, lon]`, so they are not read either way.
    pub(super) fn foreign_crs(&self) -> bool {
        self.conflicts & mask::CRS != 0
            || self
                .crs
                .iter()
                .flatten()
                .any(|raw| Crs::of_text(raw) != Crs::LonLat)
    }

    #[inline]
    pub(super) fn read(&self) -> EventFacts {
        let c = self.conflicts;
        let coordinates = match (self.lat, self.lon, self.lonlat) {
            _ if c & (mask::LAT | mask::LON | mask::LONLAT) != 0 => Coordinates::Invalid,
            _ if self.crs.iter().any(Option::is_some) && self.foreign_crs() => Coordinates::Invalid,
            (Some(lat), Some(lon), _) => match (read_number(lat), read_number(lon)) {
                (Some(lat), Some(lon)) => Coordinates::new(lat, lon),
                _ => Coordinates::Invalid,
            },
            (_, _, Some(pair)) => read_lonlat(pair),
            (Some(_), None, None) | (None, Some(_), None) => Coordinates::Missing,
            (None, None, None) => Coordinates::Missing,
        };
        let mut time = EventTime::Missing;
        for raw in self
            .time
            .iter()
            .flatten()
            .take_while(|_| c & mask::TIMES == 0)
        {
            match read_time(raw) {
                Some(at) => {
                    time = EventTime::At(at);
                    break;
                }
                None => time = EventTime::Invalid,
            }
        }
        if c & mask::TIMES != 0 {
            time = EventTime::Invalid;
        }
        EventFacts {
            coordinates,
            time,
            stream: self
                .stream
                .filter(|_| c & mask::STREAM == 0)
                .and_then(string_content)
                .map(|s| s.into_owned().into_boxed_str()),
            device: if c & mask::DEVICE != 0 {
                Some(DeviceText::Ambiguous)
            } else {
                self.device.and_then(read_device)
            },
            ambiguous: c != 0,
        }
    }
}

pub(super) struct Captures<'de> {
    /// Index 0: the root event; a batch's elements follow.
    pub(super) events: Vec<EventCaps<'de>>,
    pub(super) batch: bool,
    /// An object key on the way to the events (an events array, `current`) was stated
    /// twice: which events the body holds is ambiguous.
    pub(super) ambiguous: bool,
}

impl Captures<'_> {
    /// Nothing captured yet: the root event alone.
    pub(super) fn new() -> Self {
        Captures {
            events: vec![EventCaps::default()],
            batch: false,
            ambiguous: false,
        }
    }

    /// The events' facts, after a walk that `walked` the whole body (else it is not JSON).
    pub(super) fn facts(&self, walked: bool) -> BodyFacts {
        if !walked {
            return BodyFacts {
                body: BodyState::NotJson,
                batch: false,
                ambiguous: false,
                events: vec![EventFacts::MISSING],
            };
        }
        let mut events: Vec<EventFacts> = if self.batch {
            self.events[1..].iter().map(EventCaps::read).collect()
        } else {
            vec![self.events[0].read()]
        };
        // A batch's root `crs` (a FeatureCollection's) is every event's.
        if self.batch && self.events[0].foreign_crs() {
            for e in &mut events {
                e.coordinates = Coordinates::Invalid;
            }
        }
        BodyFacts {
            body: BodyState::Json,
            batch: self.batch,
            ambiguous: self.ambiguous,
            events,
        }
    }
}

/// A GeoJSON position: `[lon, lat]` or `[lon, lat, alt]`, numbers or numeric strings.
#[inline]
fn read_lonlat(text: &str) -> Coordinates {
    match serde_json::from_str::<Vec<&serde_json::value::RawValue>>(text) {
        Ok(items) if items.len() >= 2 => {
            match (read_number(items[0].get()), read_number(items[1].get())) {
                (Some(lon), Some(lat)) => Coordinates::new(lat, lon),
                _ => Coordinates::Invalid,
            }
        }
        _ => Coordinates::Invalid,
    }
}

/// A device id: a string's content, or a number as written (Traccar's numeric ids); an empty
/// string or another value is none.
#[inline]
fn read_device(text: &str) -> Option<DeviceText> {
    let first = *text.as_bytes().first()?;
    let id = if first == b'-' || first.is_ascii_digit() {
        std::borrow::Cow::Borrowed(text)
    } else {
        string_content(text)?
    };
    (!id.is_empty()).then(|| DeviceText::Id(id.into_owned().into_boxed_str()))
}

/// The text of a JSON string without its quotes, unescaped only when it has escapes.
#[inline]
fn string_content(text: &str) -> Option<std::borrow::Cow<'_, str>> {
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
#[inline]
fn read_number(text: &str) -> Option<f64> {
    let first = *text.as_bytes().first()?;
    if first == b'-' || first.is_ascii_digit() {
        return text.parse::<f64>().ok();
    }
    string_content(text)?.trim().parse::<f64>().ok()
}

#[inline]
fn read_time(text: &str) -> Option<UnixMillis> {
    let first = *text.as_bytes().first()?;
    if first == b'-' || first.is_ascii_digit() {
        return parse_unix_number(text.parse::<f64>().ok()?);
    }
    parse_time_text(&string_content(text)?)
}
