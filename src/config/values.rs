//! Setting values parsed where they enter: durations written as humantime text.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A positive duration written as humantime text (`50ms`, `10s`, `1h`), parsed where it enters:
/// by clap for a flag, by serde for a file key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() => Ok(HumanDuration(d)),
            Ok(_) => Err(format!("{text:?} must be positive")),
            Err(e) => Err(format!(
                "invalid duration {text:?}: {e} (write e.g. 50ms, 10s)"
            )),
        }
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        HumanDuration(d)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A value read from text the way its `FromStr` reads a flag, so a file key and a flag are
/// refused with the same message.
fn from_text<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr<Err = String>,
{
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

/// A duration that may be zero, written as humantime text (`0` disables what it delays, `5s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDelay(pub Duration);

impl FromStr for HumanDelay {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        humantime::parse_duration(text)
            .map(HumanDelay)
            .map_err(|e| format!("invalid duration {text:?}: {e} (write e.g. 0, 5s)"))
    }
}

impl fmt::Display for HumanDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

impl<'de> Deserialize<'de> for HumanDelay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

impl Serialize for HumanDelay {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
