//! The integral's gain schedule where a replica's own in-flight reading is noise (a share of
//! the upstream under [`FEW_SHARE`](super::constants::FEW_SHARE) requests): Kesten's rule.
//!
//! Integrators that read one common signal through their own measurement noise drift apart
//! at a constant gain, as random walks (docs/pressure.md "Differs", the decentralized
//! integral control trade-off). Stochastic approximation's answer is a gain that falls while
//! the error is noise: Kesten (1958, "Accelerated stochastic approximation", Annals of
//! Mathematical Statistics 29(1), 41–59) lowers the step each time the error changes sign, since
//! sign changes are what noise around the root makes and a real change does not. Here the
//! gain is `1 / (1 + flips / SCHEDULE_FLIPS)`, `flips` counting sign changes at ticks with
//! answers, at most [`SCHEDULE_MAX_FLIPS`](super::constants::SCHEDULE_MAX_FLIPS) (so the gain stays at half or more, and an effort
//! built in a 10x overload still unwinds within the 3 s the scenario tests allow once it
//! ends); [`SCHEDULE_RUN`](super::constants::SCHEDULE_RUN) more ticks of the same sign after the one that changed it (a
//! load that moved) halve `flips`.

#[cfg(test)]
use super::constants::{SCHEDULE_FLIPS, SCHEDULE_MAX_FLIPS, SCHEDULE_RUN};
use super::tuning::Tuning;

/// Kesten's rule, per replica: the multiplier of the integral gain, `(0, 1]`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GainSchedule {
    /// Sign changes counted, at most `SCHEDULE_MAX_FLIPS` (halved by a run of one sign).
    flips: f64,
    /// The last counted error's sign: -1, 0 (none yet) or 1.
    sign: f64,
    /// Ticks with answers since the sign last changed or the count was last halved.
    run: u32,
}

impl GainSchedule {
    /// Counts `error`, the integral's error at a tick with answers (ticks without answers
    /// carry no news of the upstream and count nothing), and returns the gain multiplier.
    /// `k`: the tuned values it reads (`SCHEDULE_*`).
    pub fn update(&mut self, error: f64, answered: bool, k: &Tuning) -> f64 {
        if answered && error != 0.0 {
            let sign = error.signum();
            if self.sign != 0.0 && sign != self.sign {
                self.flips = (self.flips + 1.0).min(k.schedule_max_flips);
                self.run = 0;
            } else {
                self.run += 1;
                if self.run >= k.schedule_run {
                    self.flips /= 2.0;
                    self.run = 0;
                }
            }
            self.sign = sign;
        }
        self.multiplier(k)
    }

    /// Forgets what it counted: full gain again.
    pub fn reset(&mut self) {
        *self = GainSchedule::default();
    }

    /// The gain multiplier now: `1 / (1 + flips / SCHEDULE_FLIPS)`.
    pub fn multiplier(&self, k: &Tuning) -> f64 {
        1.0 / (1.0 + self.flips / k.schedule_flips)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_lowers_the_gain_and_a_run_of_one_sign_brings_it_back() {
        let k = &Tuning::DEFAULT;
        let mut s = GainSchedule::default();
        assert_eq!(s.update(0.3, true, k), 1.0);
        // Alternating signs: each change is a flip.
        let mut m = 1.0;
        for i in 0..12 {
            m = s.update(if i % 2 == 0 { -0.2 } else { 0.2 }, true, k);
        }
        let most = 1.0 / (1.0 + SCHEDULE_MAX_FLIPS / SCHEDULE_FLIPS);
        assert!((m - most).abs() < 1e-12, "{m}");
        // Ticks without answers change nothing.
        assert_eq!(s.update(-5.0, false, k), m);
        // A run of one sign halves the count, twice over two runs (the first tick of the run
        // follows a positive error: no flip).
        let mut after = m;
        for _ in 0..(2 * SCHEDULE_RUN) {
            after = s.update(0.2, true, k);
        }
        let halved = 1.0 / (1.0 + SCHEDULE_MAX_FLIPS / 4.0 / SCHEDULE_FLIPS);
        assert!((after - halved).abs() < 1e-12, "{after}");
        s.reset();
        assert_eq!(s.multiplier(k), 1.0);
        // After a reset the first error has no sign to change from.
        assert_eq!(s.update(-0.2, true, k), 1.0);
    }
}
