//! The ramp test of learning at rest and the test of a rise taken back
//! ([`RAMP_TICKS`](super::RAMP_TICKS), [`RAMP_TEST_FALL`](super::RAMP_TEST_FALL)): whether the learned no-load latency has been
//! following a queue filling rather than a slower upstream, and whether shedding lowers it.

use super::TickInput;
use crate::pressure::TICK;
use crate::pressure::tuning::Tuning;

/// Raises, rising or small, after which a run that has not reached [`RAMP_TICKS`](super::RAMP_TICKS) rising
/// ticks ends: four seconds' worth, so that at least half of a run's raises are rising ones
/// and the value a run began at (where a take-back goes, unless where learning last settled
/// is lower) is at most four seconds of raises old. Without it, a slow rise with noise could
/// be followed for many seconds and then taken back far under its latency.
fn run_span(k: &Tuning) -> u32 {
    k.ramp_ticks.saturating_mul(2)
}

/// The ramp test of learning at rest ([`RAMP_TICKS`](super::RAMP_TICKS)): whether the value has been following
/// a queue filling rather than a slower upstream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ramp {
    /// Rising ticks (raises of at least [`RAMP_RISE`](super::RAMP_RISE)) in a run: one that learning at rest
    /// has not settled ([`CALM_TICKS`](crate::pressure::CALM_TICKS) small raises) nor lowered since it began, with the loop at rest
    /// and no silence over [`RAMP_TICKS`](super::RAMP_TICKS) ticks, and of at most [`run_span`] raises.
    rising: u32,
    /// Small raises (under [`RAMP_RISE`](super::RAMP_RISE)) in the run: they pause it.
    paused: u32,
    /// The value before the first of them, seconds.
    base: f64,
    /// The value learning last settled at, seconds (infinite until then): at a tick with
    /// latency at or under the target, after [`CALM_TICKS`](crate::pressure::CALM_TICKS) small raises since the last
    /// rising tick (a slower upstream learned), or verified. A rise taken back goes no higher
    /// than this (a queue that fills slowly also rises in runs broken by dips, each learned in
    /// part).
    anchor: f64,
    /// Small raises since the last rising tick (falls and ticks without a raise do not reset
    /// the count).
    settled: u32,
    /// Ticks without answers in a row: a silence longer than [`RAMP_TICKS`](super::RAMP_TICKS) ends a run.
    silent: u32,
    /// Whether a rise was taken back: the effort may start, until the replica has been at
    /// rest with latency at or under the target for [`RAMP_TICKS`](super::RAMP_TICKS) ticks with answers in a
    /// row (`calm`): the overload has passed. Cleared as soon as latency fell back to the
    /// value, the loop started hard, shed, unwound to rest and could not start again while
    /// the queue refilled (1.05x: p99 median 95 ms, against 78 with this rule).
    pub(super) taken_back: bool,
    /// Ticks at rest with latency at or under the target in a row.
    calm: u32,
    /// The test of a rise taken back, while it runs ([`RAMP_TEST_FALL`](super::RAMP_TEST_FALL)).
    test: Option<RampTest>,
}

/// The test of a rise taken back: does shedding lower latency?
#[derive(Debug, Clone, Copy)]
struct RampTest {
    /// The smoothed latency when the rise was taken back, or when the test started again,
    /// seconds.
    suspect: f64,
    /// Time the loop has shed with an effort since the test (re)started, over ticks with
    /// answers, seconds.
    shed_for: f64,
    /// Whether the test has started again once: it does not again.
    again: bool,
    /// Ticks without an effort since the test (re)started: past [`RAMP_TICKS`](super::RAMP_TICKS) it is dropped,
    /// so that a later shedding, perhaps another overload's, is not read against this
    /// take-back. So is a silence past [`RAMP_TICKS`](super::RAMP_TICKS) (the answers after a hang hold its
    /// backlog).
    waited: u32,
    /// Ticks without an effort in a row once the shedding began: past
    /// one [`LATENCY_TAU`](crate::pressure::LATENCY_TAU) of ticks the effort unwound (latency fell: a queue drained), and the
    /// test is dropped.
    gap: u32,
}

impl RampTest {
    /// A test of a rise taken back at the smoothed latency `suspect` (seconds).
    fn at(suspect: f64) -> Self {
        RampTest {
            suspect,
            shed_for: 0.0,
            again: false,
            waited: 0,
            gap: 0,
        }
    }
}

impl Default for Ramp {
    fn default() -> Self {
        Ramp {
            rising: 0,
            paused: 0,
            base: 0.0,
            anchor: f64::INFINITY,
            settled: 0,
            silent: 0,
            taken_back: false,
            calm: 0,
            test: None,
        }
    }
}

impl Ramp {
    /// A tick without answers.
    pub(super) fn silent(&mut self, k: &Tuning) {
        self.silent = self.silent.saturating_add(1);
        if self.silent > k.ramp_ticks {
            self.rising = 0;
            self.test = None;
        }
    }

    /// A tick with answers, before learning: the learned `value`, the `smoothed` latency and
    /// the `target` (seconds), and whether the loop is engaged.
    pub(super) fn answered(
        &mut self,
        value: f64,
        smoothed: f64,
        target: f64,
        engaged: bool,
        k: &Tuning,
    ) {
        self.silent = 0;
        if smoothed <= target {
            self.anchor = value;
        }
        self.calm = if !engaged && smoothed <= target {
            self.calm.saturating_add(1)
        } else {
            0
        };
        if self.calm >= k.ramp_ticks {
            self.taken_back = false;
            self.test = None;
        }
        if engaged {
            self.rising = 0;
        }
    }

    /// Learning at rest lowered the value (latency fell under it): a run of rises ends.
    pub(super) fn fell(&mut self) {
        self.rising = 0;
    }

    /// The value was verified at `latency` (seconds): measured under load, or found by the
    /// take-back test.
    pub(super) fn verified(&mut self, latency: f64) {
        *self = Ramp {
            anchor: latency,
            ..Ramp::default()
        };
    }

    /// A tick `dt` seconds long while a take-back's test may run, with `steered` where the
    /// loop steers latency (seconds, [`RAMP_TEST_FALL`](super::RAMP_TEST_FALL); read only when the test concludes):
    /// `Some(latency)` (seconds) when the test has found the rise to be the upstream's own
    /// latency (shedding did not lower it).
    pub(super) fn shed(
        &mut self,
        t: &TickInput,
        dt: f64,
        steered: impl FnOnce() -> f64,
        k: &Tuning,
    ) -> Option<f64> {
        let test = self.test.as_mut()?;
        if !t.effort {
            test.waited += 1;
            test.gap += 1;
            // Unwound for one LATENCY_TAU of ticks in a row (3): the effort ended because
            // latency fell, and a later shedding must not add to this one's time (it would read
            // latency it has not yet had time to lower); an effort touching 0 for a tick does
            // not end the test. It was a constant of its own; at half and twice the value the
            // ablation's scenarios and fleet report did not change (docs/pressure.md).
            let gap_ticks = (k.latency_tau.as_secs_f64() / TICK.as_secs_f64()).round();
            let unwound = test.shed_for > 0.0 && f64::from(test.gap) > gap_ticks;
            if unwound || test.waited > k.ramp_ticks {
                self.test = None;
            }
            return None;
        }
        test.gap = 0;
        // Silent ticks neither count nor are read (a hang's backlog would read as no fall).
        t.tick_mean?;
        test.shed_for += dt.min(2.0 * TICK.as_secs_f64());
        let span =
            k.ramp_test_latencies * test.suspect + k.ramp_test_taus * k.latency_tau.as_secs_f64();
        if test.shed_for < span {
            return None;
        }
        let (suspect, again) = (test.suspect, test.again);
        self.test = None;
        let steered = steered();
        let conclusive = suspect >= k.ramp_test_min_rise * steered;
        if !conclusive && !again && t.smoothed > suspect {
            // Latency rose under the shedding: a slowdown still building up, tested again,
            // once, from where it has got to.
            self.test = Some(RampTest {
                again: true,
                ..RampTest::at(t.smoothed)
            });
            return None;
        }
        let fell = t.smoothed < steered + k.ramp_test_fall * (suspect - steered);
        (conclusive && !fell && t.smoothed > 0.0).then_some(t.smoothed)
    }

    /// Learning at rest raising the value from `value` to `next` (seconds), at the
    /// `smoothed` latency: what it becomes.
    pub(super) fn raise(&mut self, value: f64, next: f64, smoothed: f64, k: &Tuning) -> f64 {
        if next < value * (1.0 + k.ramp_rise) {
            // A small raise neither counts nor breaks the run; a settled value ends it, and
            // so does a run that has spanned run_span(k) raises.
            self.settled = self.settled.saturating_add(1);
            // Settled after as many small raises as make a replica calm (one second): a slower
            // upstream learned, the value a later rise may be taken back to. It was a constant
            // of its own (20); at half and twice the value the ablation's scenarios and fleet
            // report did not change (docs/pressure.md).
            if self.settled >= k.calm_ticks {
                self.anchor = next;
                self.rising = 0;
            }
            if self.rising > 0 {
                self.paused += 1;
                if self.rising + self.paused >= run_span(k) {
                    self.rising = 0;
                }
            }
            return next;
        }
        self.settled = 0;
        if self.rising == 0 {
            self.base = value;
            self.paused = 0;
        }
        self.rising += 1;
        if self.rising < k.ramp_ticks {
            return next;
        }
        self.rising = 0;
        self.taken_back = true;
        self.test = Some(RampTest::at(smoothed));
        self.base.min(self.anchor)
    }
}
