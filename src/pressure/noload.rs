//! The learned no-load latency: what the upstream's latency is without a queue, the reference
//! that says whether latency over the target comes from queueing (shed) or from a slower
//! upstream (do not).
//!
//! Two ways to learn it, and two more to verify it (docs/pressure.md "Pressure controllers"):
//!
//! - **At rest** (no shedding effort, and in-flight short of where a safety cap's term sheds),
//!   from ordinary traffic, like Netflix Gradient2's long window: it follows the smoothed
//!   latency down at once, and up with [`LEARN_TAU`] while the in-flight count is not
//!   growing. A queue that stands without growing (arrivals at exactly the capacity) is
//!   learned too: at rest nothing tells it from a slower upstream (docs/benchmark-history.md, the
//!   1x row). A growing in-flight count is a queue filling (admissions
//!   over completions); a deploy that makes the upstream slower grows it only once, by as much
//!   as Little's law says the slower service holds, and the learning resumes. A slower
//!   upstream is also a step, learned within about a second; a rise that goes on for
//!   [`RAMP_TICKS`] is a queue filling, and is taken back, unless the shedding that follows
//!   does not lower latency ([`RAMP_TEST_FALL`]). For
//!   [`REST_HOLD_TICKS`] after the loop last shed with an effort it does not rise: a replica
//!   just back at rest may be one whose fleet still holds a queue.
//! - **Under load**, when the loop sheds while this replica holds less than [`UNDER_USED`] of
//!   its concurrency share for a whole second of ticks with answers ([`UNDER_USED_TICKS`]):
//!   the queue is gone, so the latency it measures is the upstream's own. This is Envoy
//!   `adaptive_concurrency`'s minRTT window (concurrency pinned low, latency measured) without
//!   a window of its own: shedding too much already pinned it. Envoy starts its windows on a
//!   jittered timer, one host at a time; a replica that drained alone would measure the queue
//!   its fleet keeps and call it no-load latency.
//!   An over-shedding loop is over-shedding on every replica (they read the same latency), so
//!   the fleet measures together without talking to each other. The latency must be over
//!   [`OVER_TARGET`] times the target, on average over that second and at its end, or, for a
//!   replica that has not yet seen its upstream calm, at least [`COLD_AT_TARGET`] times it
//!   for [`COLD_UNDER_USED_TICKS`]. A replica offered less than it saw served (its arrivals
//!   fell) is left out for a moment, since a replica whose fleet still holds a queue looks
//!   the same, but not for ever ([`LONG_UNDER_USED_TICKS`]): an upstream left slow after its
//!   overload looks so for good.
//!
//! A third way, the cold probe (`super::probe`), verifies a replica that has not seen its
//! upstream calm and has settled at the target: it admits a little more, and if latency does
//! not rise, the latency it held is the upstream's own ([`NoLoad::verify`]). The test of a
//! rise taken back ([`RAMP_TEST_FALL`]) verifies the other way round: it sheds, and if
//! latency does not fall, the latency is the upstream's own.
//!
//! Only the second and third ways and that test verify the reference: a replica that starts
//! while its fleet holds a queue learns that queue at rest. Until then its loop reads the
//! queue as in-flight over what its completion rate holds at the learned latency (Little's
//! law), with no margin.

mod ramp;
#[cfg(test)]
mod tests;

use super::tuning::Tuning;
use ramp::Ramp;

// The learner's tuned values are defined with the controller's other constants
// (`constants.rs`), so that `tuning.rs` defaults to them without naming this module (which
// reads a `Tuning`); their paths stay here.
pub use super::constants::{
    COLD_AT_TARGET, COLD_UNDER_USED_TICKS, GROWTH_MIN, GROWTH_SHARE, GROWTH_TICKS, LEARN_TAU,
    LONG_UNDER_USED_TICKS, OVER_TARGET, RAMP_RISE, RAMP_TEST_FALL, RAMP_TEST_LATENCIES,
    RAMP_TEST_MIN_RISE, RAMP_TEST_TAUS, RAMP_TICKS, REST_HOLD_TICKS, SUSTAINED_TICKS, UNDER_USED,
    UNDER_USED_TICKS,
};

/// Most ticks of history a [`Tuning`] may give the growth test.
pub const MAX_GROWTH_TICKS: usize = 64;

/// The no-load latency learner.
#[derive(Debug, Clone)]
pub struct NoLoad {
    value: Option<f64>,
    /// Whether `value` was measured under load: an under-used upstream, or the cold probe's
    /// room (learning at rest may have moved it since).
    verified: bool,
    /// In-flight at the last ticks, newest last; the growth test reads the last
    /// [`GROWTH_TICKS`] (the tuning's).
    history: [u32; MAX_GROWTH_TICKS],
    filled: usize,
    /// Consecutive ticks the in-flight count has been growing.
    growing: u32,
    /// Shedding with the upstream under-used while still offered its peak.
    under_used: Streak,
    /// The same, whatever the replica is offered ([`LONG_UNDER_USED_TICKS`]).
    long_under_used: Streak,
    /// Set when the reference was re-measured under load (read once).
    relearned: bool,
    /// Ticks since the loop last shed with an effort (`u32::MAX`: never), for
    /// [`REST_HOLD_TICKS`].
    since_effort: u32,
    /// The ramp test of learning at rest ([`RAMP_TICKS`]).
    ramp: Ramp,
    /// Ticks since the loop last shed with an effort that did not start while a take-back
    /// was tested (`u32::MAX`: never), for [`NoLoad::rest_margin_back`].
    since_overload: u32,
    /// Whether the effort now running started while a take-back was tested.
    tested_effort: bool,
    /// The tuned values it reads.
    tuning: &'static Tuning,
}

impl Default for NoLoad {
    fn default() -> Self {
        NoLoad::new(&Tuning::DEFAULT)
    }
}

impl NoLoad {
    /// A learner with nothing learned, reading `tuning`.
    pub fn new(tuning: &'static Tuning) -> Self {
        NoLoad {
            value: None,
            verified: false,
            history: [0; MAX_GROWTH_TICKS],
            filled: 0,
            growing: 0,
            under_used: Streak::default(),
            long_under_used: Streak::default(),
            relearned: false,
            since_effort: u32::MAX,
            ramp: Ramp::default(),
            since_overload: u32::MAX,
            tested_effort: false,
            tuning,
        }
    }
}

/// Consecutive ticks of a condition, and the sum of the smoothed latency over them (seconds).
#[derive(Debug, Clone, Copy, Default)]
struct Streak {
    ticks: u32,
    latency_sum: f64,
}

impl Streak {
    /// Extends the streak by a tick at `latency` (seconds) while `holds`, else ends it.
    fn step(&mut self, holds: bool, latency: f64) {
        if holds {
            self.ticks = self.ticks.saturating_add(1);
            self.latency_sum += latency;
        } else {
            *self = Streak::default();
        }
    }

    /// The mean latency over the streak, seconds (0 before its first tick).
    fn mean(&self) -> f64 {
        self.latency_sum / f64::from(self.ticks.max(1))
    }
}

/// What the learner sees at a tick.
#[derive(Debug, Clone, Copy)]
pub struct TickInput {
    /// Requests in flight now.
    pub inflight: u32,
    /// Mean latency of the tick's samples, seconds (`None`: no samples).
    pub tick_mean: Option<f64>,
    /// Mean in-flight over the tick as a multiple of the share at the peak completion rate
    /// held since shedding began; infinite while unknown.
    pub utilisation: f64,
    /// Whether the replica is still offered [`STILL_OFFERED`](super::STILL_OFFERED) of that
    /// peak: if not, holding little is under-use only after [`LONG_UNDER_USED_TICKS`].
    pub still_offered: bool,
    /// The smoothed latency, seconds.
    pub smoothed: f64,
    /// The latency target, seconds.
    pub target: f64,
    /// Whether a shedding effort was built before this tick: learning at rest waits
    /// [`REST_HOLD_TICKS`] after the last such tick.
    pub effort: bool,
    /// Whether the mean in-flight is past the safety cap's reference (`SETPOINT` times
    /// `--max-inflight`), where the cap term sheds with no effort. With an effort, the loop is
    /// engaged (sheds): not rest either way; the cap alone does not start the wait.
    pub over_cap: bool,
    /// The learned concurrency share, requests (0: unknown).
    pub share: f64,
    /// Whether the replica has not yet seen its upstream calm (it steers on latency alone).
    pub cold: bool,
}

impl NoLoad {
    /// The no-load latency, seconds; `None` until learned.
    pub fn value(&self) -> Option<f64> {
        self.value
    }

    /// The no-load latency once measured under load, seconds: the reference of the
    /// standing-queue test.
    pub fn reference(&self) -> Option<f64> {
        self.value.filter(|_| self.verified)
    }

    /// Takes `latency` (seconds) as the verified no-load latency: measured under load on an
    /// under-used upstream, where the cold probe (`super::probe`) saw the upstream answer
    /// with room to spare, or where shedding did not lower a rise taken back
    /// ([`RAMP_TEST_FALL`]). Sets the re-measured flag ([`NoLoad::take_relearned`]) and ends
    /// the under-use streaks; a latency of 0 or less is ignored.
    pub fn verify(&mut self, latency: f64) {
        if latency > 0.0 {
            self.value = Some(latency);
            self.verified = true;
            self.relearned = true;
            self.under_used = Streak::default();
            self.long_under_used = Streak::default();
            self.ramp.verified(latency);
        }
    }

    /// Whether a queue is filling: the in-flight count has grown for longer than a step would
    /// explain ([`SUSTAINED_TICKS`]), or learning at rest followed a rising latency for longer
    /// ([`RAMP_TICKS`]) and was taken back.
    pub fn sustained_growth(&self) -> bool {
        self.growing >= self.tuning.sustained_ticks || self.ramp.taken_back
    }

    /// The share of the rest margin (`REST_MARGIN`) that the gate letting the effort start from
    /// rest reads, 0.0–1.0: none at the tick the loop last shed with an effort, all of it
    /// [`REST_HOLD_TICKS`] ticks later, linearly in between. A replica whose effort unwound in the
    /// dip that replicas joining an overload make (they over-shed) is at rest when its fleet's
    /// queue comes back, and its in-flight count, a fraction of the fleet's, reads 1.5–2.5 of its
    /// learned share: short of the 4.25 of the full margin, so it admitted everything it was
    /// offered at twice the target while the others shed their priority areas. In the simulator
    /// (`cargo bench --bench fleet`, seeds 1-40), the count change 2 -> 8 -> 3 at 3x: the 3-replica
    /// phase's p99 median 60 -> 55 ms, worst 291 -> 160 (399 -> 300 in turn); one replica offered
    /// 1.05x, its first seconds' median 109 -> 75 ms; the 8-replica phase's worst 115 -> 140 ms,
    /// and no case met at fewer seeds. The price, by the formula rather than measured: a deploy
    /// that makes the upstream slower within those ticks sheds if its in-flight count passes the
    /// reference returned so far (three times slower at half the capacity holds 1.5 shares, past
    /// the 1.4 returned 0.1 s after an overload), until the under-use test re-measures it. An
    /// effort that started while a take-back was tested ([`RAMP_TEST_FALL`]) does not count: such
    /// shedding tests a slowdown as likely as a queue, and counted, the upstream getting 3x slower
    /// over 2 and 4 s was met (at most 1% shed) at 23 and 32 seeds instead of 26 and 36, up to
    /// 10.9% shed. Letting any positive error start the effort within those ticks instead shed a
    /// slower upstream 0.1–1 s after an overload by 62–70% (median) until its arrivals had been
    /// lower for ten seconds ([`LONG_UNDER_USED_TICKS`]).
    pub fn rest_margin_back(&self) -> f64 {
        (f64::from(self.since_overload) / f64::from(self.tuning.rest_hold_ticks)).min(1.0)
    }

    /// Whether the reference was just re-measured under load: the effort was built against a
    /// wrong reference (or an unreachable target) and should start again. True once.
    pub fn take_relearned(&mut self) -> bool {
        std::mem::take(&mut self.relearned)
    }

    /// The growth test's history length, ticks: the tuning's, within the history kept.
    fn growth_ticks(&self) -> usize {
        usize::try_from(self.tuning.growth_ticks)
            .map_or(MAX_GROWTH_TICKS, |n| n.min(MAX_GROWTH_TICKS))
    }

    /// The in-flight growth over the history: mean of the newer half minus mean of the
    /// older half, requests (0 until the history is full).
    #[expect(clippy::cast_precision_loss, reason = "in-flight counts < 2^52")]
    fn growth(&self) -> f64 {
        let ticks = self.growth_ticks();
        if self.filled < ticks || ticks < 2 {
            return 0.0;
        }
        let recent = &self.history[MAX_GROWTH_TICKS - ticks..];
        let half = ticks / 2;
        let sum = |s: &[u32]| s.iter().map(|&n| f64::from(n)).sum::<f64>() / s.len() as f64;
        sum(&recent[ticks - half..]) - sum(&recent[..half])
    }

    /// Folds in one tick; `dt` is the time since the previous one, seconds.
    pub fn update(&mut self, t: TickInput, dt: f64) {
        if t.effort && self.since_effort != 0 {
            // A take-back's test runs only while `taken_back` is set.
            self.tested_effort = self.ramp.taken_back;
        }
        self.since_overload = if t.effort && !self.tested_effort {
            0
        } else {
            self.since_overload.saturating_add(1)
        };
        self.since_effort = if t.effort {
            0
        } else {
            self.since_effort.saturating_add(1)
        };
        self.history.rotate_left(1);
        self.history[MAX_GROWTH_TICKS - 1] = t.inflight;
        self.filled = (self.filled + 1).min(MAX_GROWTH_TICKS);
        let k = self.tuning;
        let growing = self.growth() > k.growth_min + k.growth_share * t.share;
        self.growing = if growing {
            self.growing.saturating_add(1)
        } else {
            0
        };
        let engaged = t.effort || t.over_cap;
        let shedding = engaged && t.share > 0.0;
        let under_used = shedding && t.utilisation < k.under_used;
        // The one-second streak (and its cold form) counts only ticks with answers, and
        // verifies only at one (UNDER_USED_TICKS); a silent tick still breaks it when the
        // replica no longer sheds under-used. The ten-second one counts every tick.
        let silent = t.tick_mean.is_none();
        let still_under_used = under_used && t.still_offered;
        if !(silent && still_under_used) {
            self.under_used.step(still_under_used, t.smoothed);
        }
        self.long_under_used.step(under_used, t.smoothed);
        // Over the target on average over the streak and still at its end.
        let over = |streak: &Streak, ticks| {
            streak.ticks >= ticks
                && streak.mean() > k.over_target * t.target
                && t.smoothed > k.over_target * t.target
        };
        let over_target = (!silent && over(&self.under_used, k.under_used_ticks))
            || over(&self.long_under_used, k.long_under_used_ticks);
        let cold_at_target = !silent
            && t.cold
            && self.under_used.ticks >= k.cold_under_used_ticks
            && self.under_used.mean() > k.cold_at_target * t.target;
        if (over_target || cold_at_target) && t.smoothed > 0.0 {
            self.verify(t.smoothed);
            return;
        }
        // Where the loop steers latency: a replica not yet seen calm on latency alone, at
        // COLD_SETPOINT times the target; otherwise where both errors are 0 (the controller's
        // error is their minimum). With confidence under 1 the latency error is scaled down
        // and the loop holds latency higher: the test may then take a drained queue for the
        // upstream at a low sample rate.
        let (value, verified) = (self.value, self.verified);
        let steered = || {
            value.map_or(0.0, |v| {
                if t.cold && !verified {
                    return k.cold_setpoint * t.target;
                }
                let reference = if verified { k.setpoint * v } else { v };
                reference.max(k.latency_setpoint * t.target)
            })
        };
        if let Some(latency) = self.ramp.shed(&t, dt, steered, k) {
            self.verify(latency);
            return;
        }
        let Some(sample) = t.tick_mean else {
            self.ramp.silent(k);
            return;
        };
        let Some(value) = self.value else {
            // First samples: a value to start from.
            self.value = Some(sample);
            return;
        };
        self.ramp.answered(value, t.smoothed, t.target, engaged, k);
        // Under load it moves only when the upstream is seen under-used (above).
        if engaged {
            return;
        }
        if t.smoothed > 0.0 && t.smoothed < value {
            self.value = Some(t.smoothed);
            self.ramp.fell();
        } else if !growing && self.since_effort >= k.rest_hold_ticks {
            let a = super::alpha(dt, k.learn_tau);
            let next = value + a * (t.smoothed - value);
            self.value = Some(self.ramp.raise(value, next, t.smoothed, k));
        }
    }
}
