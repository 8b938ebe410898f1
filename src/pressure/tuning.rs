//! The controller's tuned values as one overridable set: every named constant of
//! `constants.rs` (the no-load learner's and the cold probe's among them, which `noload.rs` and
//! `probe.rs` re-export), and the numbers that were inlined in the rules, each defaulting to
//! its constant. A [`Controller`](super::Controller) reads them from the
//! [`Tuning`] its [`ControllerConfig`](super::ControllerConfig) names, so a test or a bench can
//! remove a rule or perturb a value without a rebuild (`cargo bench --bench fleet -- --tuning
//! REST_MARGIN=0`, or `SHEDGATE_TUNING=REST_MARGIN=0` for the scenario tests): the ablation in
//! docs/pressure.md "Ablation" was run so. The server always runs [`Tuning::DEFAULT`].
//!
//! Not here: [`TICK`](super::TICK) (the ticker's period, which the app and the simulator
//! schedule by), the cost offsets' and load reports' constants (`costs.rs`, `report.rs`:
//! exercised by their own tests, not by the fleet bench), and sizes (slots, bit widths).

use std::fmt;
use std::time::Duration;

use super::constants;

/// A tuned value's type: how an override's text reads as one, and how it reads back.
trait Value: Sized {
    /// The value `text` states, or `None`. `inf` is the largest value (a rule whose count
    /// or time constant never elapses).
    fn parse(text: &str) -> Option<Self>;
    /// The value as a number, as an override would state it (seconds for durations).
    fn show(&self) -> f64;
}

impl Value for f64 {
    fn parse(text: &str) -> Option<Self> {
        text.parse::<f64>().ok().filter(|v| !v.is_nan())
    }
    fn show(&self) -> f64 {
        *self
    }
}

impl Value for u32 {
    /// Tick counts: a fractional count (a ×0.5 perturbation of 3) rounds to the nearest.
    #[expect(clippy::cast_possible_truncation, reason = "clamped to u32's range")]
    #[expect(clippy::cast_sign_loss, reason = "clamped to 0 or more first")]
    fn parse(text: &str) -> Option<Self> {
        let v = f64::parse(text)?;
        (v >= 0.0).then(|| v.round().min(f64::from(u32::MAX)) as u32)
    }
    fn show(&self) -> f64 {
        f64::from(*self)
    }
}

impl Value for Duration {
    /// Seconds.
    fn parse(text: &str) -> Option<Self> {
        let v = f64::parse(text)?;
        if v == f64::INFINITY {
            return Some(Duration::MAX);
        }
        Duration::try_from_secs_f64(v).ok()
    }
    fn show(&self) -> f64 {
        // `inf` set it (a rule switched off): read back as an override would state it.
        if *self == Duration::MAX {
            f64::INFINITY
        } else {
            self.as_secs_f64()
        }
    }
}

/// Why an override was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TuningError {
    /// No tuned value has this name (the names are [`Tuning::NAMES`]).
    Unknown(String),
    /// The value does not read as the named value's type (a number; seconds for a time
    /// constant; a count at or above 0 for ticks).
    Invalid {
        /// The name.
        name: String,
        /// The text given.
        value: String,
    },
    /// An override without `=`.
    Malformed(String),
}

impl fmt::Display for TuningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TuningError::Unknown(name) => write!(f, "no tuned value is named {name:?}"),
            TuningError::Invalid { name, value } => {
                write!(f, "{name}: {value:?} is not a valid value")
            }
            TuningError::Malformed(text) => write!(f, "{text:?} is not NAME=VALUE"),
        }
    }
}

impl std::error::Error for TuningError {}

macro_rules! tuning {
    ($( $(#[$doc:meta])* $name:ident => $field:ident : $ty:ty = $default:expr ; )*) => {
        /// The controller's tuned values (module docs). Field names are the constants'
        /// names in lower case; units are the constants'.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct Tuning {
            $( $(#[$doc])* pub $field: $ty, )*
        }

        impl Tuning {
            /// The values the constants give: what the server runs.
            pub const DEFAULT: Tuning = Tuning { $( $field: $default, )* };

            /// Every tuned value's name, as [`Tuning::set`] reads it.
            pub const NAMES: &'static [&'static str] = &[$( stringify!($name) ),*];

            /// Overrides the value named `name` (a constant's name) with `value` (a number;
            /// seconds for time constants; `inf` for the largest).
            ///
            /// # Errors
            /// [`TuningError::Unknown`] for a name not in [`Tuning::NAMES`],
            /// [`TuningError::Invalid`] for a value that does not read as its type.
            pub fn set(&mut self, name: &str, value: &str) -> Result<(), TuningError> {
                let invalid = || TuningError::Invalid {
                    name: name.to_owned(),
                    value: value.to_owned(),
                };
                match name {
                    $( stringify!($name) => {
                        self.$field = <$ty as Value>::parse(value).ok_or_else(invalid)?;
                    } )*
                    _ => return Err(TuningError::Unknown(name.to_owned())),
                }
                Ok(())
            }

            /// The value named `name`, as an override would state it (seconds for time
            /// constants); `None` for an unknown name.
            pub fn get(&self, name: &str) -> Option<f64> {
                match name {
                    $( stringify!($name) => Some(Value::show(&self.$field)), )*
                    _ => None,
                }
            }
        }
    };
}

tuning! {
    /// [`constants::LATENCY_TAU`], seconds.
    LATENCY_TAU => latency_tau: Duration = constants::LATENCY_TAU;
    /// [`constants::LATENCY_DECAY_TAU`], seconds.
    LATENCY_DECAY_TAU => latency_decay_tau: Duration = constants::LATENCY_DECAY_TAU;
    /// [`constants::PEAK_TAU`], seconds.
    PEAK_TAU => peak_tau: Duration = constants::PEAK_TAU;
    /// [`constants::RATE_TAU`], seconds.
    RATE_TAU => rate_tau: Duration = constants::RATE_TAU;
    /// [`constants::FULL_CONFIDENCE_RATE`].
    FULL_CONFIDENCE_RATE => full_confidence_rate: f64 = constants::FULL_CONFIDENCE_RATE;
    /// [`constants::SETPOINT`].
    SETPOINT => setpoint: f64 = constants::SETPOINT;
    /// [`constants::LATENCY_SETPOINT`].
    LATENCY_SETPOINT => latency_setpoint: f64 = constants::LATENCY_SETPOINT;
    /// [`constants::CALM`].
    CALM => calm: f64 = constants::CALM;
    /// [`constants::COLD_SETPOINT`].
    COLD_SETPOINT => cold_setpoint: f64 = constants::COLD_SETPOINT;
    /// [`constants::CALM_TICKS`].
    CALM_TICKS => calm_ticks: u32 = constants::CALM_TICKS;
    /// [`constants::MIN_SHARE`].
    MIN_SHARE => min_share: f64 = constants::MIN_SHARE;
    /// [`constants::PROPORTIONAL_GAIN`].
    PROPORTIONAL_GAIN => proportional_gain: f64 = constants::PROPORTIONAL_GAIN;
    /// [`constants::REST_MARGIN`].
    REST_MARGIN => rest_margin: f64 = constants::REST_MARGIN;
    /// `GATE_OPEN` in `src/pressure/constants.rs`.
    GATE_OPEN => gate_open: f64 = constants::GATE_OPEN;
    /// `MIN_RATE_SPAN` in `src/pressure/constants.rs`, seconds.
    MIN_RATE_SPAN => min_rate_span: Duration = constants::MIN_RATE_SPAN;
    /// [`constants::CAP_GAIN`].
    CAP_GAIN => cap_gain: f64 = constants::CAP_GAIN;
    /// [`constants::STILL_OFFERED`].
    STILL_OFFERED => still_offered: f64 = constants::STILL_OFFERED;
    /// [`constants::ENGAGED_EFFORT`].
    ENGAGED_EFFORT => engaged_effort: f64 = constants::ENGAGED_EFFORT;
    /// [`constants::INTEGRAL_GAIN`], per second.
    INTEGRAL_GAIN => integral_gain: f64 = constants::INTEGRAL_GAIN;
    /// [`constants::UNWIND_GAIN`], per second.
    UNWIND_GAIN => unwind_gain: f64 = constants::UNWIND_GAIN;
    /// [`constants::MAX_EFFORT`].
    MAX_EFFORT => max_effort: f64 = constants::MAX_EFFORT;
    /// [`constants::ERROR_CLAMP`].
    ERROR_CLAMP => error_clamp: f64 = constants::ERROR_CLAMP;
    /// [`constants::FEW_SHARE`].
    FEW_SHARE => few_share: f64 = constants::FEW_SHARE;
    /// [`constants::FEW_LATENCY_SETPOINT`].
    FEW_LATENCY_SETPOINT => few_latency_setpoint: f64 = constants::FEW_LATENCY_SETPOINT;
    /// [`constants::FEW_INFLIGHT_MARGIN`].
    FEW_INFLIGHT_MARGIN => few_inflight_margin: f64 = constants::FEW_INFLIGHT_MARGIN;
    /// [`constants::SCHEDULE_FLIPS`].
    SCHEDULE_FLIPS => schedule_flips: f64 = constants::SCHEDULE_FLIPS;
    /// [`constants::SCHEDULE_MAX_FLIPS`].
    SCHEDULE_MAX_FLIPS => schedule_max_flips: f64 = constants::SCHEDULE_MAX_FLIPS;
    /// [`constants::SCHEDULE_RUN`].
    SCHEDULE_RUN => schedule_run: u32 = constants::SCHEDULE_RUN;
    /// `UNVERIFIED_SETPOINT` in `src/pressure/constants.rs`.
    UNVERIFIED_SETPOINT => unverified_setpoint: f64 = constants::UNVERIFIED_SETPOINT;
    /// [`constants::LEARN_TAU`], seconds.
    LEARN_TAU => learn_tau: Duration = constants::LEARN_TAU;
    /// [`constants::GROWTH_TICKS`], at most
    /// [`MAX_GROWTH_TICKS`](super::noload::MAX_GROWTH_TICKS).
    GROWTH_TICKS => growth_ticks: u32 = constants::GROWTH_TICKS;
    /// [`constants::GROWTH_MIN`], requests.
    GROWTH_MIN => growth_min: f64 = constants::GROWTH_MIN;
    /// [`constants::GROWTH_SHARE`], shares.
    GROWTH_SHARE => growth_share: f64 = constants::GROWTH_SHARE;
    /// [`constants::SUSTAINED_TICKS`].
    SUSTAINED_TICKS => sustained_ticks: u32 = constants::SUSTAINED_TICKS;
    /// [`constants::RAMP_RISE`].
    RAMP_RISE => ramp_rise: f64 = constants::RAMP_RISE;
    /// [`constants::RAMP_TICKS`].
    RAMP_TICKS => ramp_ticks: u32 = constants::RAMP_TICKS;
    /// [`constants::RAMP_TEST_FALL`].
    RAMP_TEST_FALL => ramp_test_fall: f64 = constants::RAMP_TEST_FALL;
    /// [`constants::RAMP_TEST_MIN_RISE`].
    RAMP_TEST_MIN_RISE => ramp_test_min_rise: f64 = constants::RAMP_TEST_MIN_RISE;
    /// [`constants::RAMP_TEST_LATENCIES`].
    RAMP_TEST_LATENCIES => ramp_test_latencies: f64 = constants::RAMP_TEST_LATENCIES;
    /// [`constants::RAMP_TEST_TAUS`].
    RAMP_TEST_TAUS => ramp_test_taus: f64 = constants::RAMP_TEST_TAUS;
    /// [`constants::REST_HOLD_TICKS`].
    REST_HOLD_TICKS => rest_hold_ticks: u32 = constants::REST_HOLD_TICKS;
    /// [`constants::UNDER_USED`].
    UNDER_USED => under_used: f64 = constants::UNDER_USED;
    /// [`constants::UNDER_USED_TICKS`].
    UNDER_USED_TICKS => under_used_ticks: u32 = constants::UNDER_USED_TICKS;
    /// [`constants::OVER_TARGET`].
    OVER_TARGET => over_target: f64 = constants::OVER_TARGET;
    /// [`constants::COLD_UNDER_USED_TICKS`].
    COLD_UNDER_USED_TICKS => cold_under_used_ticks: u32 = constants::COLD_UNDER_USED_TICKS;
    /// [`constants::LONG_UNDER_USED_TICKS`].
    LONG_UNDER_USED_TICKS => long_under_used_ticks: u32 = constants::LONG_UNDER_USED_TICKS;
    /// [`constants::COLD_AT_TARGET`].
    COLD_AT_TARGET => cold_at_target: f64 = constants::COLD_AT_TARGET;
    /// [`constants::SETTLE_TICKS`].
    SETTLE_TICKS => settle_ticks: u32 = constants::SETTLE_TICKS;
    /// [`constants::SETTLED`].
    SETTLED => settled: f64 = constants::SETTLED;
    /// [`constants::STEP`].
    STEP => step: f64 = constants::STEP;
    /// [`constants::PROBE_TICKS`].
    PROBE_TICKS => probe_ticks: u32 = constants::PROBE_TICKS;
    /// [`constants::MORE`].
    MORE => more: f64 = constants::MORE;
    /// [`constants::RISE`].
    RISE => rise: f64 = constants::RISE;
    /// [`constants::MIN_INFLIGHT`].
    MIN_INFLIGHT => min_inflight: f64 = constants::MIN_INFLIGHT;
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning::DEFAULT
    }
}

impl Tuning {
    /// [`Tuning::DEFAULT`] with `overrides` applied: `NAME=VALUE` pairs separated by commas
    /// or white space (an empty text changes nothing), later ones winning.
    ///
    /// # Errors
    /// The first override that is malformed, unknown or invalid ([`TuningError`]).
    pub fn with_overrides(overrides: &str) -> Result<Tuning, TuningError> {
        let mut tuning = Tuning::DEFAULT;
        for pair in overrides
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| TuningError::Malformed(pair.to_owned()))?;
            tuning.set(name.trim(), value.trim())?;
        }
        Ok(tuning)
    }

    /// A tuning that lives as long as the process, for a [`ControllerConfig`](super::ControllerConfig)
    /// (tests and benches: one per run, so the leak is bounded by the runs).
    pub fn leak(self) -> &'static Tuning {
        Box::leak(Box::new(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_its_default() {
        assert_eq!(Tuning::NAMES.len(), 54);
        for name in Tuning::NAMES {
            let value = Tuning::DEFAULT.get(name).expect("a named value");
            let mut t = Tuning::DEFAULT;
            t.set(name, &value.to_string())
                .expect("its own value reads");
            assert_eq!(t, Tuning::DEFAULT, "{name}");
        }
    }

    #[test]
    fn overrides_apply_and_bad_ones_are_named() {
        let t =
            Tuning::with_overrides("REST_MARGIN=0, LATENCY_TAU=0.3 RAMP_TICKS=inf").expect("valid");
        assert_eq!(t.rest_margin, 0.0);
        assert_eq!(t.latency_tau, Duration::from_millis(300));
        assert_eq!(t.ramp_ticks, u32::MAX);
        assert_eq!(Tuning::with_overrides(""), Ok(Tuning::DEFAULT));
        assert_eq!(
            Tuning::with_overrides("NOPE=1"),
            Err(TuningError::Unknown("NOPE".into()))
        );
        assert!(matches!(
            Tuning::with_overrides("CALM_TICKS=-1"),
            Err(TuningError::Invalid { .. })
        ));
        assert!(matches!(
            Tuning::with_overrides("CALM"),
            Err(TuningError::Malformed(_))
        ));
        let t = Tuning::with_overrides("CALM_TICKS=1.5").expect("valid");
        assert_eq!(t.calm_ticks, 2);
    }
}
