//! The graduated shed curve: shed probability from area rank and pressure (docs/decision.md
//! "Decision rule", step 6).

use std::fmt;

use std::num::NonZeroU8;

use serde::Serialize;

use crate::pressure::Pressure;

/// [`Pressure::SHED_FLOOR`] as a number.
const FLOOR: f64 = Pressure::SHED_FLOOR.get();

/// Area rank: an integer in `1..=100`; lower is more important (shed last). docs/decision.md
/// "Areas".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "u8")]
pub struct Rank(NonZeroU8);

impl Rank {
    /// The default rank of an area nobody configured: 50, mid-range, not lowest (the
    /// geographic seed's `DEFAULT_AREA_RANK`).
    pub const DEFAULT: Rank = Rank(NonZeroU8::new(50).unwrap());

    /// `Some` for `1..=100`.
    pub fn new(rank: u8) -> Option<Self> {
        NonZeroU8::new(rank).filter(|r| r.get() <= 100).map(Rank)
    }

    /// The rank as an integer in `1..=100`.
    pub fn get(self) -> u8 {
        self.0.get()
    }
}

impl From<Rank> for u8 {
    fn from(r: Rank) -> u8 {
        r.get()
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Rank bands a report splits sheds by: priority (1–10), important (11–30), default (31–50),
/// low (51–100).
pub const BANDS: [(u8, u8); 4] = [(1, 10), (11, 30), (31, 50), (51, 100)];

/// [`BANDS`] by name, `lo-hi`, as reports, the access log's replay and the preview's metric
/// label write them (a test checks they match).
pub const BAND_NAMES: [&str; 4] = ["1-10", "11-30", "31-50", "51-100"];

/// The index in [`BANDS`] of the band `rank` falls in.
pub fn band(rank: Rank) -> usize {
    BANDS
        .iter()
        .position(|(lo, hi)| (*lo..=*hi).contains(&rank.get()))
        .unwrap_or(3)
}

/// Shape of the pressure-shedding curve.
///
/// With threshold `t = (1 - p) * 100` (the seed's rule), the probability that a sheddable
/// event of rank `r` is shed at pressure `p` is
///
/// ```text
/// P(r, p) = 0                                   if p <= 0.5
///         = 1                                   if p >= 1
///         = ramp_factor(p) * rank_factor(r, p)  otherwise
/// ramp_factor(p)    = clamp((p - 0.5) / ramp, 0, 1)        (1 for p > 0.5 when ramp = 0)
/// rank_factor(r, p) = clamp((r - t) / min(band, t), 0, 1)  (step r > t when band = 0)
/// ```
///
/// Why each piece (docs/decision.md "Decision rule"): the seed's step rule has two cliffs, and a
/// cliff in a closed loop is an on/off switch that oscillates. `ramp` (pressure units, in
/// `[0, 0.5]`) lets ranks above 50 ramp in just above the floor instead of all becoming
/// sheddable at `p = 0.5`; `band` (ranks, in `[0, 50]`) sheds the ranks just above `t`
/// partially. The band narrows to `t` as `p → 1` so that the probability reaches 1 at
/// `p = 1` continuously. With `band = 0` and `ramp = 0` this is exactly the seed's step rule.
///
/// Properties (each a property test): 0 for `p <= 0.5`; 0 for `r <= t` while `p < 1`; 1 at
/// `p = 1`; non-decreasing in `p` and in `r`; continuous in `p`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Curve {
    band: f64,
    ramp: f64,
}

/// A curve parameter outside its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CurveError {
    /// `band` must be a finite number of ranks in `[0, 50]`.
    #[error("band must be a number of ranks in [0, 50], got {0}")]
    Band(f64),
    /// `ramp` must be a finite pressure interval in `[0, 0.5]`.
    #[error("ramp must be a pressure interval in [0, 0.5], got {0}")]
    Ramp(f64),
}

impl Curve {
    /// Default band: 25 ranks, the widest with which the seed's examples hold (at `p = 0.75`,
    /// rank 50 is always shed and rank 5 never). Wide on purpose: when most traffic sits at
    /// one rank (the default 50), the band is the pressure interval over which its shed share
    /// goes from 0 to 1, i.e. the gain of the closed loop. With 10 ranks the scenario tests
    /// saw goodput near 80% of capacity at 3x (the loop hunts); with 25, 92–93%.
    pub const DEFAULT_BAND: f64 = 25.0;
    /// Default ramp: 0.05 of pressure, so ranks above 50 are fully in play from `p = 0.55`.
    pub const DEFAULT_RAMP: f64 = 0.05;
    /// The seed's step rule (`band = 0`, `ramp = 0`).
    pub const STEP: Curve = Curve {
        band: 0.0,
        ramp: 0.0,
    };

    /// A curve with `band` in ranks `[0, 50]` and `ramp` in pressure units `[0, 0.5]`.
    ///
    /// # Errors
    /// [`CurveError`] when a value is out of range or not finite.
    pub fn new(band: f64, ramp: f64) -> Result<Self, CurveError> {
        if !(0.0..=50.0).contains(&band) {
            return Err(CurveError::Band(band));
        }
        if !(0.0..=1.0 - FLOOR).contains(&ramp) {
            return Err(CurveError::Ramp(ramp));
        }
        Ok(Curve { band, ramp })
    }

    /// Band in ranks.
    pub fn band(&self) -> f64 {
        self.band
    }

    /// Ramp in pressure units.
    pub fn ramp(&self) -> f64 {
        self.ramp
    }

    /// The rank threshold `t = (1 - p) * 100`: ranks at or below it are never pressure-shed
    /// while `p < 1`. Returns 100 at or below the floor (`p <= 0.5`: nothing is shed).
    ///
    /// Snapped to 1e-9: in binary floating point `(1 - 0.8) * 100` is 19.999999999999996,
    /// which would shed rank 20 at a pinned 0.8 under the step rule.
    pub fn threshold(pressure: Pressure) -> f64 {
        let p = pressure.get();
        if p <= FLOOR {
            100.0
        } else {
            snapped_threshold(p)
        }
    }

    /// Shed probability in `[0, 1]` of a superseded fix (docs/decision.md "Devices"): the
    /// curve's floor ramp alone, `clamp((p - 0.5) / ramp, 0, 1)`, whatever the rank. 0 at or
    /// under the floor, so backlogs uploaded in order still reach the upstream; continuous in
    /// `p` (a step above the floor with `ramp = 0`, as the seed's rule is); never less than
    /// [`Curve::shed_probability`] of any rank, so a superseded fix is shed before a fresh one.
    pub fn superseded_probability(&self, pressure: Pressure) -> f64 {
        let p = pressure.get();
        if p <= FLOOR {
            0.0
        } else if self.ramp == 0.0 || p >= 1.0 {
            1.0
        } else {
            ((p - FLOOR) / self.ramp).min(1.0)
        }
    }

    /// Shed probability in `[0, 1]` for a sheddable event of `rank` at `pressure`.
    pub fn shed_probability(&self, rank: Rank, pressure: Pressure) -> f64 {
        let p = pressure.get();
        if p <= FLOOR {
            return 0.0;
        }
        if p >= 1.0 {
            return 1.0;
        }
        let ramp_factor = if self.ramp == 0.0 {
            1.0
        } else {
            ((p - FLOOR) / self.ramp).min(1.0)
        };
        let t = snapped_threshold(p);
        let over = f64::from(rank.get()) - t;
        if over <= 0.0 {
            return 0.0;
        }
        let band = self.band.min(t);
        let rank_factor = if band == 0.0 {
            1.0
        } else {
            (over / band).min(1.0)
        };
        ramp_factor * rank_factor
    }
}

fn snapped_threshold(p: f64) -> f64 {
    ((1.0 - p) * 100.0 * 1e9).round() / 1e9
}

impl Default for Curve {
    fn default() -> Self {
        Curve {
            band: Self::DEFAULT_BAND,
            ramp: Self::DEFAULT_RAMP,
        }
    }
}

impl fmt::Display for Curve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "band {} ranks, ramp {}", self.band, self.ramp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rank(r: u8) -> Rank {
        Rank::new(r).unwrap()
    }

    #[test]
    fn band_names_are_the_bands() {
        for ((lo, hi), name) in BANDS.iter().zip(BAND_NAMES) {
            assert_eq!(format!("{lo}-{hi}"), name);
        }
    }

    fn curves() -> impl Strategy<Value = Curve> {
        (0.0f64..=50.0, 0.0f64..=0.5).prop_map(|(b, r)| Curve::new(b, r).unwrap())
    }

    fn pressures() -> impl Strategy<Value = f64> {
        prop_oneof![0.0f64..=1.0, Just(0.5), Just(1.0), Just(0.0)]
    }

    #[test]
    fn seed_examples_hold_with_defaults() {
        let c = Curve::default();
        let p = Pressure::new(0.75).unwrap();
        assert_eq!(c.shed_probability(rank(5), p), 0.0);
        assert_eq!(c.shed_probability(rank(50), p), 1.0);
        let p = Pressure::new(0.4).unwrap();
        assert_eq!(c.shed_probability(rank(100), p), 0.0);
        // "At pressure 0.7, areas ranked above thirty are dropped": they begin to be (the band
        // sheds 31..55 partly), and ranks at or below 30 are kept.
        let p = Pressure::new(0.7).unwrap();
        assert_eq!(c.shed_probability(rank(30), p), 0.0);
        assert!(c.shed_probability(rank(31), p) > 0.0);
        assert_eq!(c.shed_probability(rank(56), p), 1.0);
    }

    #[test]
    fn zero_band_and_ramp_is_the_seed_step_rule() {
        for r in 1..=100u8 {
            for i in 0..=1000 {
                let p = f64::from(i) / 1000.0;
                // The seed's rule in exact decimal arithmetic: rank > (1 - p) * 100.
                let seed = i > 500 && u32::from(r) * 1000 > (1000 - i) * 100;
                let got = Curve::STEP.shed_probability(rank(r), Pressure::new(p).unwrap());
                assert_eq!(got, if seed { 1.0 } else { 0.0 }, "rank {r} pressure {p}");
            }
        }
    }

    /// Pressures written with three decimals, where binary rounding bites: a rank equal to
    /// the threshold is never shed, under the step rule and the default curve.
    #[test]
    fn ranks_at_the_threshold_are_kept_at_decimal_pressures() {
        for k in 501..1000u32 {
            let p = f64::from(k) / 1000.0;
            let pr = Pressure::new(p).unwrap();
            for r in 1..=100u8 {
                if f64::from(r) * 1000.0 <= f64::from(1000 - k) * 100.0 {
                    assert_eq!(
                        Curve::STEP.shed_probability(rank(r), pr),
                        0.0,
                        "rank {r} at {p}"
                    );
                    assert_eq!(
                        Curve::default().shed_probability(rank(r), pr),
                        0.0,
                        "rank {r} at {p}"
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn zero_at_or_below_floor(c in curves(), r in 1u8..=100, p in 0.0f64..=0.5) {
            prop_assert_eq!(c.shed_probability(rank(r), Pressure::new(p).unwrap()), 0.0);
        }

        #[test]
        fn zero_at_or_below_threshold(c in curves(), p in 0.0f64..1.0, r in 1u8..=100) {
            let pr = Pressure::new(p).unwrap();
            prop_assume!(f64::from(r) <= (1.0 - p) * 100.0);
            prop_assert_eq!(c.shed_probability(rank(r), pr), 0.0);
        }

        #[test]
        fn one_at_full_pressure(c in curves(), r in 1u8..=100) {
            prop_assert_eq!(c.shed_probability(rank(r), Pressure::FULL), 1.0);
        }

        #[test]
        fn bounded(c in curves(), r in 1u8..=100, p in pressures()) {
            let v = c.shed_probability(rank(r), Pressure::new(p).unwrap());
            prop_assert!((0.0..=1.0).contains(&v));
        }

        #[test]
        fn monotone_in_pressure(c in curves(), r in 1u8..=100, a in pressures(), b in pressures()) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let vlo = c.shed_probability(rank(r), Pressure::new(lo).unwrap());
            let vhi = c.shed_probability(rank(r), Pressure::new(hi).unwrap());
            prop_assert!(vlo <= vhi, "{vlo} at {lo} > {vhi} at {hi}");
        }

        #[test]
        fn monotone_in_rank(c in curves(), a in 1u8..=100, b in 1u8..=100, p in pressures()) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let pr = Pressure::new(p).unwrap();
            prop_assert!(c.shed_probability(rank(lo), pr) <= c.shed_probability(rank(hi), pr));
        }

        /// Continuity in pressure: a tiny step in pressure moves the probability a little.
        /// The bound is the curve's steepest slope (1/ramp from the ramp, 100/min(band, t) from
        /// the band) times the step, so curves with a positive band and ramp are tested.
        #[test]
        fn continuous_in_pressure(
            band in 1.0f64..=50.0,
            ramp in 0.01f64..=0.5,
            r in 1u8..=100,
            p in 0.0f64..=1.0,
        ) {
            let c = Curve::new(band, ramp).unwrap();
            let h = 1e-9;
            let q = (p + h).min(1.0);
            let a = c.shed_probability(rank(r), Pressure::new(p).unwrap());
            let b = c.shed_probability(rank(r), Pressure::new(q).unwrap());
            // Near p = 1 the band shrinks to t, so the slope grows like r/t²: allow for it.
            let t = ((1.0 - q) * 100.0).max(1e-3);
            let slope = 1.0 / ramp + 100.0 / band.min(t) + 100.0 * f64::from(r) / (t * t);
            // The threshold is snapped to 1e-9, which can move it by that much.
            prop_assert!((b - a).abs() <= slope * (h + 1e-9), "jump {} at p={p}", b - a);
        }

        #[test]
        fn continuous_at_full_pressure(c in curves(), r in 1u8..=100) {
            prop_assume!(c.band() > 0.0);
            // Approaching p = 1 from below, the probability approaches 1.
            let near = c.shed_probability(rank(r), Pressure::new(1.0 - 1e-9).unwrap());
            prop_assert!(near > 1.0 - 1e-6, "{near}");
        }
    }
}
