//! The walk: a serde visitor that descends only along a shape's pointers, captures each
//! leaf as raw JSON text, and reads it into coordinates, a time or a stream name.
//!
//! The small readers below are `#[inline]`: they are called once per captured field from the
//! visitors, which are instantiated in the caller's codegen unit. Without it, splitting the
//! walk into this module cost 10% of extraction (`cargo bench --bench decision`,
//! `part/extract-3-fields`: 0.78 µs against 0.70 µs before the split; 0.69 µs with it).

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::crs::Crs;
use super::time::{parse_time_text, parse_unix_number};
use super::{Coordinates, DeviceText, EventFacts, EventTime, MAX_TIMES, Node, Target, mask};
use crate::clock::UnixMillis;

#[derive(Default)]
pub(super) struct EventCaps<'de> {
    lat: Option<&'de RawValue>,
    lon: Option<&'de RawValue>,
    lonlat: Option<&'de RawValue>,
    time: [Option<&'de RawValue>; MAX_TIMES],
    stream: Option<&'de RawValue>,
    /// `crs` members, the event's and its geometry's (at most two are kept).
    crs: [Option<&'de RawValue>; 2],
    device: Option<&'de RawValue>,
    /// Targets stated twice, differently (bits of [`mask`]): unreadable.
    conflicts: u16,
}

impl<'de> EventCaps<'de> {
    /// Nothing was captured.
    fn is_empty(&self) -> bool {
        self.lat.is_none()
            && self.lon.is_none()
            && self.lonlat.is_none()
            && self.time.iter().all(Option::is_none)
            && self.stream.is_none()
            && self.device.is_none()
    }

    #[inline]
    fn set(&mut self, target: Target, raw: &'de RawValue) {
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
            Some(prev) if prev.get() == raw.get() => {}
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
                .any(|raw| Crs::of_raw(raw) != Crs::LonLat)
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

/// A GeoJSON position: `[lon, lat]` or `[lon, lat, alt]`, numbers or numeric strings.
#[inline]
fn read_lonlat(raw: &RawValue) -> Coordinates {
    match serde_json::from_str::<Vec<&RawValue>>(raw.get()) {
        Ok(items) if items.len() >= 2 => match (read_number(items[0]), read_number(items[1])) {
            (Some(lon), Some(lat)) => Coordinates::new(lat, lon),
            _ => Coordinates::Invalid,
        },
        _ => Coordinates::Invalid,
    }
}

/// A device id: a string's content, or a number as written (Traccar's numeric ids); an empty
/// string or another value is none.
#[inline]
fn read_device(raw: &RawValue) -> Option<DeviceText> {
    let text = raw.get();
    let first = *text.as_bytes().first()?;
    let id = if first == b'-' || first.is_ascii_digit() {
        std::borrow::Cow::Borrowed(text)
    } else {
        string_content(raw)?
    };
    (!id.is_empty()).then(|| DeviceText::Id(id.into_owned().into_boxed_str()))
}

/// The text of a JSON string without its quotes, unescaped only when it has escapes.
#[inline]
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
#[inline]
fn read_number(raw: &RawValue) -> Option<f64> {
    let text = raw.get();
    let first = *text.as_bytes().first()?;
    if first == b'-' || first.is_ascii_digit() {
        return text.parse::<f64>().ok();
    }
    string_content(raw)?.trim().parse::<f64>().ok()
}

#[inline]
fn read_time(raw: &RawValue) -> Option<UnixMillis> {
    let text = raw.get();
    let first = *text.as_bytes().first()?;
    if first == b'-' || first.is_ascii_digit() {
        return parse_unix_number(text.parse::<f64>().ok()?);
    }
    parse_time_text(&string_content(raw)?)
}

macro_rules! ignore_scalars {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<(), E> { Ok(()) })*
    };
}
/// Descends along the pointer tree; everything else is skipped. Captures go to event `at`.
pub(super) struct Walk<'a, 'de> {
    pub(super) node: &'a Node,
    pub(super) at: usize,
    pub(super) caps: &'a mut Captures<'de>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// The value under one matched key or index: a leaf to capture, an events array, or a node
/// to walk.
struct Step<'a, 'de> {
    node: &'a Node,
    at: usize,
    caps: &'a mut Captures<'de>,
}

impl<'de> DeserializeSeed<'de> for Step<'_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if let Some(target) = self.node.target {
            let raw = <&'de RawValue as de::Deserialize<'de>>::deserialize(deserializer)?;
            self.caps.events[self.at].set(target, raw);
            return Ok(());
        }
        if let Some(each) = &self.node.each {
            return Each {
                node: each,
                caps: self.caps,
            }
            .deserialize(deserializer);
        }
        if let Some(one) = &self.node.one {
            // One more event of the batch; dropped again when nothing of it was found
            // (`null`, a scalar, an empty object), so it never counts as an untimed event.
            self.caps.batch = true;
            self.caps.events.push(EventCaps::default());
            let at = self.caps.events.len() - 1;
            Walk {
                node: one,
                at,
                caps: &mut *self.caps,
            }
            .deserialize(deserializer)?;
            if self.caps.events[at].is_empty() {
                self.caps.events.pop();
            }
            return Ok(());
        }
        Walk {
            node: self.node,
            at: self.at,
            caps: self.caps,
        }
        .deserialize(deserializer)
    }
}

/// An array of events: each element becomes a new event, walked with `node`.
pub(super) struct Each<'a, 'de> {
    pub(super) node: &'a Node,
    pub(super) caps: &'a mut Captures<'de>,
}

impl<'de> DeserializeSeed<'de> for Each<'_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Each<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of events")
    }

    // Not an array: no events here.
    ignore_scalars!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.caps.batch = true;
        loop {
            self.caps.events.push(EventCaps::default());
            let at = self.caps.events.len() - 1;
            let walk = Walk {
                node: self.node,
                at,
                caps: &mut *self.caps,
            };
            if seq.next_element_seed(walk)?.is_none() {
                self.caps.events.pop();
                return Ok(());
            }
        }
    }
}

/// Matches an object key against a node's children without allocating: the child's index
/// and node.
struct KeySeed<'a>(&'a Node);

impl<'de, 'a> DeserializeSeed<'de> for KeySeed<'a> {
    type Value = Option<(usize, &'a Node)>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 'a> Visitor<'de> for KeySeed<'a> {
    type Value = Option<(usize, &'a Node)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self
            .0
            .children
            .iter()
            .enumerate()
            .find(|(_, (t, _, _))| t == key)
            .map(|(i, (_, _, n))| (i, n)))
    }
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
        // Children met so far (a shape's nodes have a handful; past 64 none is tracked).
        let mut seen = 0u64;
        while let Some(child) = map.next_key_seed(KeySeed(self.node))? {
            match child {
                Some((i, child)) => {
                    let bit = 1u64.checked_shl(u32::try_from(i).unwrap_or(u32::MAX));
                    let again = bit.is_some_and(|b| seen & b != 0);
                    seen |= bit.unwrap_or(0);
                    if again && child.target.is_none() {
                        // A key on the way to facts stated twice: merging the two objects
                        // would be a reading no other parser makes. Everything under it is
                        // ambiguous.
                        self.caps.events[self.at].conflicts |= child.mask;
                        if child.mask & mask::EVENTS != 0 {
                            self.caps.ambiguous = true;
                        }
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        map.next_value_seed(Step {
                            node: child,
                            at: self.at,
                            caps: &mut *self.caps,
                        })?;
                    }
                }
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
                        at: self.at,
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
