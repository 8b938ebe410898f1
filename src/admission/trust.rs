//! Whether a fix may be decided on its device's history (docs/decision.md "Devices", "What is
//! trusted"): an id that names no device, or a fix its device could not have made, is decided
//! as if it named no device.

use serde::Serialize;

use super::DeviceHistory;
use crate::clock::UnixMillis;
use crate::extract::{Coordinates, EventTime, Facts};
use crate::policy::Policy;

/// Why a request's device id was not trusted: its fix was decided as if it named no device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Untrusted {
    /// The id is a placeholder ([`crate::extract::placeholder::is_placeholder`]): `unknown`,
    /// `null`, `000000000000000`, one the policy lists.
    Placeholder,
    /// The fix is farther from its device's newest delivered fix than the device could have
    /// moved in between ([`plausible`]): another sender uses the same id.
    Implausible,
}

impl Untrusted {
    /// Every reason, in metric-slot order.
    pub const ALL: [Untrusted; 2] = [Untrusted::Placeholder, Untrusted::Implausible];

    /// Stable name, as in the metric's `reason` label and the access log: `placeholder`,
    /// `implausible`.
    pub fn as_str(self) -> &'static str {
        match self {
            Untrusted::Placeholder => "placeholder",
            Untrusted::Implausible => "implausible",
        }
    }

    /// The reason [`Untrusted::as_str`] names `name` (`None`: no reason).
    pub fn parse(name: &str) -> Option<Untrusted> {
        Untrusted::ALL.into_iter().find(|u| u.as_str() == name)
    }

    /// Index into [`Untrusted::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A position as the device table keeps it: latitude and longitude in units of 10⁻⁷ degrees
/// (about 1 cm), 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedPoint {
    /// Latitude, 10⁻⁷ degrees.
    pub lat: i32,
    /// Longitude, 10⁻⁷ degrees.
    pub lon: i32,
}

impl PackedPoint {
    /// 10⁻⁷ degrees per unit.
    const SCALE: f64 = 1e7;

    /// A valid position packed (`None` for coordinates missing or invalid).
    pub fn of(coordinates: Coordinates) -> Option<PackedPoint> {
        let Coordinates::Valid { lat, lon } = coordinates else {
            return None;
        };
        // In range (Coordinates::Valid): at most 1.8e9 units, inside i32.
        #[expect(clippy::cast_possible_truncation, reason = "within ±1.8e9")]
        let pack = |deg: f64| (deg * Self::SCALE).round() as i32;
        Some(PackedPoint {
            lat: pack(lat),
            lon: pack(lon),
        })
    }

    /// Degrees: `(lat, lon)`.
    pub fn degrees(self) -> (f64, f64) {
        (
            f64::from(self.lat) / Self::SCALE,
            f64::from(self.lon) / Self::SCALE,
        )
    }
}

/// Distance allowed on top of `max_speed × time`: GPS error and a phone's jump from a network
/// fix to a satellite one (a few hundred metres), with room.
pub const SLACK_M: f64 = 1000.0;

/// Whether one device could have made both fixes: the great-circle distance between them is
/// at most `max_speed × max(|Δt|, 1 s) + 1 km` (`max_speed` in m/s; `Δt` between the two
/// event times, floored at a second, since the table keeps delivered times to the second).
pub fn plausible(
    max_speed: f64,
    (a, at_a): ((f64, f64), UnixMillis),
    (b, at_b): ((f64, f64), UnixMillis),
) -> bool {
    #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
    let seconds = (at_a.since(at_b).unsigned_abs() as f64 / 1000.0).max(1.0);
    let (Ok(a), Ok(b)) = (h3o::LatLng::new(a.0, a.1), h3o::LatLng::new(b.0, b.1)) else {
        return true;
    };
    a.distance_m(b) <= max_speed * seconds + SLACK_M
}

/// The history a fix of a device is decided on: `Ok(history)`, or `Err` when the fix is one
/// its device could not have made ([`plausible`] against its newest delivered fix, under the
/// policy's `max_speed`). The fix's time is its event time, else `now` (a fix without one is
/// taken as made on arrival); a fix without a position, or a device without a delivered one,
/// gives no evidence and is trusted. A batch is judged by its deciding point and its newest
/// time, as it is decided.
pub fn judge(
    policy: &Policy,
    facts: &Facts,
    now: UnixMillis,
    history: DeviceHistory,
) -> Result<DeviceHistory, Untrusted> {
    let (Some(point), Some(delivered), Coordinates::Valid { lat, lon }) = (
        history.newest_position,
        history.newest_delivered,
        facts.coordinates,
    ) else {
        return Ok(history);
    };
    let at = match facts.time {
        EventTime::At(at) => at,
        EventTime::Missing | EventTime::Invalid => now,
    };
    let max_speed = policy.device_trust().max_speed;
    if plausible(max_speed, ((lat, lon), at), (point.degrees(), delivered)) {
        Ok(history)
    } else {
        Err(Untrusted::Implausible)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BERLIN: (f64, f64) = (52.52, 13.405);
    const MUNICH: (f64, f64) = (48.1372, 11.5756);

    fn km(a: (f64, f64), b: (f64, f64)) -> f64 {
        h3o::LatLng::new(a.0, a.1)
            .unwrap()
            .distance_m(h3o::LatLng::new(b.0, b.1).unwrap())
            / 1000.0
    }

    #[test]
    fn the_bound_is_speed_times_time_plus_a_kilometre() {
        // Berlin to Munich is about 504 km.
        let d = km(BERLIN, MUNICH);
        assert!((500.0..510.0).contains(&d), "{d}");
        let t0 = UnixMillis(1_780_000_000_000);
        let after = |s: f64| {
            #[expect(clippy::cast_possible_truncation, reason = "test seconds")]
            UnixMillis(t0.0 + (s * 1000.0) as i64)
        };
        // 10 s at 300 m/s is 3 km (+1): no.
        assert!(!plausible(300.0, (BERLIN, t0), (MUNICH, after(10.0))));
        // An hour by plane: yes, in either order of the two fixes.
        assert!(plausible(300.0, (BERLIN, t0), (MUNICH, after(3600.0))));
        assert!(plausible(300.0, (MUNICH, after(3600.0)), (BERLIN, t0)));
        assert!(plausible(300.0, (BERLIN, after(3600.0)), (MUNICH, t0)));
        // Exactly at the bound: (d − 1 km) / 300 m/s seconds apart is plausible; a tenth of a
        // second less is not.
        let exact = (d * 1000.0 - SLACK_M) / 300.0;
        assert!(plausible(
            300.0,
            (BERLIN, t0),
            (MUNICH, after(exact + 0.001))
        ));
        assert!(!plausible(
            300.0,
            (BERLIN, t0),
            (MUNICH, after(exact - 0.1))
        ));
        // The policy's speed: a car at 60 m/s needs 2.3 hours.
        assert!(!plausible(60.0, (BERLIN, t0), (MUNICH, after(3600.0))));
    }

    #[test]
    fn under_a_second_counts_as_one() {
        let t0 = UnixMillis(1_780_000_000_000);
        // 1.2 km north of Berlin's point: within 300 m/s × 1 s + 1 km = 1.3 km, at Δt 0 or
        // 0.5 s; 1.4 km is not.
        let north = |m: f64| (BERLIN.0 + m / 111_195.0, BERLIN.1);
        assert!(plausible(300.0, (BERLIN, t0), (north(1200.0), t0)));
        assert!(plausible(
            300.0,
            (BERLIN, t0),
            (north(1200.0), UnixMillis(t0.0 - 500))
        ));
        assert!(!plausible(300.0, (BERLIN, t0), (north(1400.0), t0)));
        // The same place is always plausible.
        assert!(plausible(0.001, (BERLIN, t0), (BERLIN, t0)));
    }

    /// `judge` with a policy: its `max_speed`; no evidence (no position on either side) is
    /// trust; a fix without a time is taken as made at `now`.
    #[test]
    fn judged_against_the_newest_delivered_fix() {
        let files = crate::policy::PolicyFiles::from_texts(
            "[defaults]\nmax_speed = 50\n[streams.a]\nsupersession = \"self-superseding\"\n",
            None,
        );
        let policy = crate::policy::compile(&files).unwrap().policy;
        let now = UnixMillis(1_780_000_000_000);
        let facts = |(lat, lon): (f64, f64), time| Facts {
            body: crate::extract::BodyState::Json,
            coordinates: Coordinates::new(lat, lon),
            time,
            ambiguous: false,
            device: None,
        };
        let delivered = DeviceHistory {
            newest_delivered: Some(UnixMillis(now.0 - 3_600_000)),
            newest_position: PackedPoint::of(Coordinates::new(BERLIN.0, BERLIN.1)),
            ..DeviceHistory::new(0.5)
        };
        // An hour at 50 m/s is 180 km: Munich, 504 km away, is not the same device's.
        let munich = facts(MUNICH, EventTime::At(now));
        assert_eq!(
            judge(&policy, &munich, now, delivered),
            Err(Untrusted::Implausible)
        );
        // Without a time: at `now`, the same.
        let untimed = facts(MUNICH, EventTime::Missing);
        assert_eq!(
            judge(&policy, &untimed, now, delivered),
            Err(Untrusted::Implausible)
        );
        // Ten hours later it could be.
        let later = UnixMillis(now.0 + 9 * 3_600_000);
        let munich_later = facts(MUNICH, EventTime::At(later));
        assert_eq!(
            judge(&policy, &munich_later, later, delivered),
            Ok(delivered)
        );
        // No position on either side: no evidence.
        let nowhere = Facts {
            coordinates: Coordinates::Missing,
            ..munich
        };
        assert_eq!(judge(&policy, &nowhere, now, delivered), Ok(delivered));
        let unplaced = DeviceHistory {
            newest_position: None,
            ..delivered
        };
        assert_eq!(judge(&policy, &munich, now, unplaced), Ok(unplaced));
        assert_eq!(
            judge(&policy, &munich, now, DeviceHistory::new(0.5)),
            Ok(DeviceHistory::new(0.5))
        );
    }

    #[test]
    fn a_point_packs_to_a_centimetre() {
        for (lat, lon) in [BERLIN, MUNICH, (-90.0, -180.0), (90.0, 180.0), (0.0, 0.0)] {
            let p = PackedPoint::of(Coordinates::new(lat, lon)).unwrap();
            let (a, b) = p.degrees();
            assert!((a - lat).abs() < 1e-7 && (b - lon).abs() < 1e-7);
        }
        assert_eq!(PackedPoint::of(Coordinates::Missing), None);
        assert_eq!(PackedPoint::of(Coordinates::Invalid), None);
    }
}
