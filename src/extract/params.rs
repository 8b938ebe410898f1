//! Facts from `application/x-www-form-urlencoded` text: a query string or a form body, as
//! the OsmAnd protocol (Traccar Client) and GPSLogger's custom URL send them.
//!
//! Decoding (`+` and percent-escapes) is the `form_urlencoded` crate's (the WHATWG URL
//! standard's `application/x-www-form-urlencoded` parser, from the servo `url` family).

use super::headers::Stated;
use super::time::parse_param_time;
use super::{Coordinates, DeviceText, EventFacts, EventTime};

/// Query or form keys that hold an event's facts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParamKeys {
    /// Latitude key (degrees).
    pub lat: String,
    /// Longitude key (degrees).
    pub lon: String,
    /// Time keys, in order: the first readable one is used. Values are unix seconds or
    /// milliseconds (told apart by magnitude), RFC 3339, or `YYYY-MM-DD HH:MM:SS[.fff]` in
    /// UTC (see [`parse_param_time`]).
    pub time: Vec<String>,
    /// Device id keys: any of them names the device (OsmAnd's `id` or `deviceid`); two that
    /// differ are no id.
    pub device: Vec<String>,
}

impl ParamKeys {
    /// The keys as written, for `GET /policy`.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "lat": self.lat,
            "lon": self.lon,
            "time": self.time,
            "device": self.device,
        })
    }

    /// Reads one event's facts from `text` (`k=v&k=v`, `+` and `%XX` decoded). `None` when
    /// none of the keys appears, so the caller can look elsewhere. A key given twice with
    /// different values is unreadable, never a choice between them.
    pub fn read(&self, text: &[u8]) -> Option<EventFacts> {
        let mut lat = Stated::Absent;
        let mut lon = Stated::Absent;
        let mut times = vec![Stated::Absent; self.time.len()];
        let mut device = Stated::Absent;
        let mut any = false;
        for (key, value) in form_urlencoded::parse(text) {
            let slot = if key == self.lat {
                &mut lat
            } else if key == self.lon {
                &mut lon
            } else if let Some(i) = self.time.iter().position(|t| *t == key) {
                &mut times[i]
            } else if self.device.iter().any(|d| *d == key) {
                // Not a fact of the event's place or time: alone it does not make one.
                device = std::mem::replace(&mut device, Stated::Absent).and(value.into_owned());
                continue;
            } else {
                continue;
            };
            any = true;
            *slot = std::mem::replace(slot, Stated::Absent).and(value.into_owned());
        }
        if !any {
            return None;
        }
        let number = |g: &Stated<String>| match g {
            Stated::One(v) => v.trim().parse::<f64>().ok(),
            _ => None,
        };
        let coordinates = match (&lat, &lon) {
            (Stated::Absent, _) | (_, Stated::Absent) => Coordinates::Missing,
            (a, b) => match (number(a), number(b)) {
                (Some(lat), Some(lon)) => Coordinates::new(lat, lon),
                _ => Coordinates::Invalid,
            },
        };
        let mut time = EventTime::Missing;
        for given in &times {
            match given {
                Stated::Absent => {}
                Stated::One(v) => match parse_param_time(v) {
                    Some(at) => {
                        time = EventTime::At(at);
                        break;
                    }
                    None => time = EventTime::Invalid,
                },
                Stated::Ambiguous => time = EventTime::Invalid,
            }
        }
        let ambiguous = [&lat, &lon, &device]
            .into_iter()
            .chain(&times)
            .any(|g| *g == Stated::Ambiguous);
        let device = match device {
            Stated::Absent => None,
            Stated::One(id) if id.is_empty() => None,
            Stated::One(id) => Some(DeviceText::Id(id.into_boxed_str())),
            Stated::Ambiguous => Some(DeviceText::Ambiguous),
        };
        Some(EventFacts {
            coordinates,
            time,
            stream: None,
            device,
            ambiguous,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::UnixMillis;

    const T: i64 = 1_780_000_000_000; // 2026-05-28T20:26:40Z

    fn osmand() -> ParamKeys {
        ParamKeys {
            lat: "lat".into(),
            lon: "lon".into(),
            time: vec!["timestamp".into()],
            device: vec!["id".into(), "deviceid".into()],
        }
    }

    #[test]
    fn osmand_query_forms() {
        for q in [
            "id=4711&lat=52.52&lon=13.405&timestamp=1780000000",
            "id=4711&lat=52.52&lon=13.405&timestamp=1780000000000",
            "lat=52.52&lon=13.405&timestamp=2026-05-28%2020:26:40",
            "lat=52.52&lon=13.405&timestamp=2026-05-28+20%3A26%3A40.000",
            "lat=52.52&lon=13.405&timestamp=2026-05-28T20:26:40Z&lat=52.52",
        ] {
            let f = osmand().read(q.as_bytes()).unwrap();
            assert_eq!(f.coordinates, Coordinates::new(52.52, 13.405), "{q}");
            assert_eq!(f.time, EventTime::At(UnixMillis(T)), "{q}");
        }
    }

    #[test]
    fn device_ids_from_either_key_and_never_two() {
        let f = osmand().read(b"id=4711&lat=1&lon=2").unwrap();
        assert_eq!(f.device, Some(DeviceText::Id("4711".into())));
        let f = osmand().read(b"deviceid=4711&lat=1&lon=2&id=4711").unwrap();
        assert_eq!(f.device, Some(DeviceText::Id("4711".into())));
        let f = osmand().read(b"id=4711&lat=1&lon=2&id=4712").unwrap();
        assert_eq!(f.device, Some(DeviceText::Ambiguous));
        assert!(f.ambiguous);
        let f = osmand().read(b"id=&lat=1&lon=2").unwrap();
        assert_eq!(f.device, None);
        // A device key alone is no event.
        assert_eq!(osmand().read(b"id=4711"), None);
    }

    #[test]
    fn absent_unreadable_and_ambiguous() {
        assert_eq!(osmand().read(b"id=1&speed=0"), None);
        assert_eq!(osmand().read(b""), None);
        let f = osmand().read(b"lat=52.52").unwrap();
        assert_eq!(f.coordinates, Coordinates::Missing);
        assert_eq!(f.time, EventTime::Missing);
        let f = osmand().read(b"lat=x&lon=13&timestamp=soon").unwrap();
        assert_eq!(f.coordinates, Coordinates::Invalid);
        assert_eq!(f.time, EventTime::Invalid);
        // The same key twice, differently: unreadable, never the first or the last.
        let f = osmand()
            .read(b"lat=52.52&lon=13.405&lat=48.1&timestamp=1780000000&timestamp=1779999400")
            .unwrap();
        assert_eq!(f.coordinates, Coordinates::Invalid);
        assert_eq!(f.time, EventTime::Invalid);
    }
}
