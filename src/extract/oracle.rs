//! The walk as a serde visitor over serde_json's deserializer, as it was before
//! [`super::scan`]: the oracle the scanner is compared with on bodies made and mangled at
//! random (`tests.rs`), so that both read every body alike.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::walk::{Captures, EventCaps};
use super::{BodyFacts, Extractor, Node, mask};

/// [`Extractor::extract`] through the serde visitor.
pub(super) fn extract(ex: &Extractor, body: &[u8]) -> BodyFacts {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let mut caps = Captures::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let walked = match &ex.root.each {
        Some(each) => Each {
            node: each,
            caps: &mut caps,
        }
        .deserialize(&mut de),
        None => Walk {
            node: &ex.root,
            at: 0,
            caps: &mut caps,
        }
        .deserialize(&mut de),
    }
    .and_then(|()| de.end());
    caps.facts(walked.is_ok())
}

macro_rules! ignore_scalars {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<(), E> { Ok(()) })*
    };
}
/// Descends along the pointer tree; everything else is skipped. Captures go to event `at`.
struct Walk<'a, 'de> {
    node: &'a Node,
    at: usize,
    caps: &'a mut Captures<'de>,
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
            self.caps.events[self.at].set(target, raw.get());
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
struct Each<'a, 'de> {
    node: &'a Node,
    caps: &'a mut Captures<'de>,
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
