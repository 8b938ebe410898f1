//! The no-load learner's unit tests: ticks built by hand, fed to [`NoLoad`] alone.

use super::{NoLoad, TickInput};
use crate::pressure::{LATENCY_DECAY_TAU, TICK};

/// One tick for the no-load learner: 2 requests in flight, a share of 2, latency `latency`
/// (seconds, the tick's mean and the smoothed one alike) against a 50 ms target; `effort`
/// and `over_cap` as the controller passes them.
fn learner_tick(latency: f64, effort: bool, over_cap: bool) -> TickInput {
    TickInput {
        inflight: 2,
        tick_mean: Some(latency),
        utilisation: 1.0,
        still_offered: true,
        smoothed: latency,
        target: 0.05,
        effort,
        over_cap,
        share: 2.0,
        cold: false,
    }
}

/// Feeds `ticks` ticks of `latency` (seconds) to a no-load learner, `effort` and `over_cap`
/// as the controller passes them.
fn feed(n: &mut NoLoad, ticks: u32, latency: f64, effort: bool, over_cap: bool) {
    for _ in 0..ticks {
        n.update(learner_tick(latency, effort, over_cap), TICK.as_secs_f64());
    }
}

/// Feeds a latency rising from `from` by `per_tick` each tick (seconds) for `ticks` ticks,
/// at rest.
fn ramp_up(n: &mut NoLoad, from: f64, per_tick: f64, ticks: u32) {
    for k in 1..=ticks {
        feed(n, 1, from + per_tick * f64::from(k), false, false);
    }
}

/// A learner that learned 20 ms at rest over two seconds.
fn rested() -> NoLoad {
    let mut n = NoLoad::default();
    feed(&mut n, 40, 0.02, false, false);
    n
}

/// A learner that learned 20 ms at rest, then followed a latency rising by `per_tick`
/// seconds a tick for two seconds (40 ticks), and took that rise back.
fn taken_back(per_tick: f64) -> NoLoad {
    let mut n = rested();
    ramp_up(&mut n, 0.02, per_tick, 40);
    n
}

#[test]
fn learning_at_rest_waits_after_the_loop_was_engaged() {
    let mut n = rested();
    assert_eq!(n.value(), Some(0.02));
    // Shedding while the fleet's queue holds 45 ms, then back at rest with it still there:
    // the queue is not learned as the no-load latency within the hold. 1.9 s at rest (the
    // hold is two seconds; LEARN_TAU would learn it in about one).
    feed(&mut n, 20, 0.045, true, false);
    feed(&mut n, 38, 0.045, false, false);
    assert_eq!(n.value(), Some(0.02));
    // It still falls at once, and after the hold it rises again: a slower upstream is
    // learned, two seconds late.
    feed(&mut n, 1, 0.015, false, false);
    assert_eq!(n.value(), Some(0.015));
    feed(&mut n, 40, 0.045, false, false);
    assert!(n.value().is_some_and(|v| v > 0.04), "{:?}", n.value());
}

#[test]
fn a_safety_cap_flickering_does_not_hold_learning_at_rest() {
    // In-flight around the cap's reference: the cap term sheds one tick in five, with no
    // effort. A slower upstream (20 -> 45 ms) is still learned at rest in between.
    let mut n = rested();
    for _ in 0..12 {
        feed(&mut n, 1, 0.045, false, true);
        feed(&mut n, 4, 0.045, false, false);
    }
    assert!(n.value().is_some_and(|v| v > 0.04), "{:?}", n.value());
}

#[test]
fn a_latency_that_keeps_rising_at_rest_is_a_queue_not_the_upstream() {
    // 20 ms, then rising 1 ms a tick (20 ms a second; a queue filling at 20 requests a second
    // in front of a 400 req/s upstream adds 50), past the 50 ms target. Learning at rest
    // follows for two seconds (40 rising ticks), then takes the rise back and lets the effort
    // start.
    let mut n = rested();
    ramp_up(&mut n, 0.02, 0.001, 39);
    assert!(n.value().is_some_and(|v| v > 0.05), "{:?}", n.value());
    assert!(!n.sustained_growth());
    feed(&mut n, 1, 0.06, false, false);
    assert_eq!(n.value(), Some(0.02));
    assert!(n.sustained_growth());
    // Until the replica has been at rest at or under the target for two seconds: the
    // overload has passed.
    feed(&mut n, 39, 0.02, false, false);
    assert!(n.sustained_growth());
    feed(&mut n, 1, 0.02, false, false);
    assert!(!n.sustained_growth());
}

#[test]
fn a_rise_is_taken_back_no_lower_than_a_slower_upstream_learned_before_it() {
    // The upstream gets three times slower (20 -> 60 ms, over the 50 ms target) and that is
    // learned; then a queue fills (3 ms a tick). The rise is taken back to 60 ms, not to the
    // 20 ms of before the slower upstream.
    let mut n = rested();
    feed(&mut n, 60, 0.06, false, false);
    ramp_up(&mut n, 0.06, 0.003, 40);
    assert!(n.sustained_growth());
    assert!(
        n.value().is_some_and(|v| (0.059..0.0601).contains(&v)),
        "{:?}",
        n.value()
    );
}

#[test]
fn a_rise_that_shedding_does_not_lower_is_the_upstream_getting_slower() {
    // The upstream gets five times slower over two seconds (20 -> 100 ms, 2 ms a tick): a
    // rise like a queue filling, taken back. The loop then sheds for twice the latency at
    // the take-back plus 1.5 LATENCY_TAU (200 + 225 ms: nine ticks), and latency stays: the
    // upstream's own, verified, and the effort no longer may start.
    let mut n = taken_back(0.002);
    assert_eq!(n.value(), Some(0.02));
    assert!(n.sustained_growth());
    feed(&mut n, 8, 0.1, true, false);
    assert_eq!(n.reference(), None);
    feed(&mut n, 1, 0.1, true, false);
    assert_eq!(n.reference(), Some(0.1));
    assert!(!n.sustained_growth());
}

#[test]
fn a_rise_that_shedding_lowers_is_a_queue() {
    // A rise to 80 ms taken back; shedding lowers latency to 60 ms, more than half the way
    // down to where the loop steers it (0.9 times the 50 ms target, over the 20 ms learned:
    // 45 ms), though not to 70% of 80 ms: nothing is verified, and the effort may still
    // start. The test ran for 160 + 225 ms: eight ticks.
    let mut n = taken_back(0.0015);
    feed(&mut n, 8, 0.06, true, false);
    assert_eq!(n.reference(), None);
    assert_eq!(n.value(), Some(0.02));
    assert!(n.sustained_growth());
    // The test ran once: more shedding at the take-back's latency verifies nothing.
    feed(&mut n, 10, 0.1, true, false);
    assert_eq!(n.reference(), None);
}

#[test]
fn a_take_back_test_is_dropped_when_its_effort_unwinds_and_counts_at_most_two_ticks_at_once() {
    // Shedding for five ticks, then four ticks without an effort (it unwound: latency fell),
    // then shedding again at the take-back's latency: the second shedding is not read
    // against the first take-back.
    let mut n = taken_back(0.002);
    feed(&mut n, 5, 0.1, true, false);
    feed(&mut n, 4, 0.1, false, true);
    feed(&mut n, 10, 0.1, true, false);
    assert_eq!(n.reference(), None);
    // One tick a second long (a stalled ticker) counts as two ticks, not as the whole test.
    let mut n = taken_back(0.002);
    n.update(learner_tick(0.1, true, false), 1.0);
    assert_eq!(n.reference(), None);
}

#[test]
fn a_rise_too_close_to_the_loops_setpoint_stays_a_queue() {
    // Taken back at 60 ms, under 1.5 times the 45 ms the loop steers to: a queue drained
    // there would not fall far enough to tell, so latency that stays is not verified.
    let mut n = taken_back(0.001);
    assert!(n.sustained_growth());
    feed(&mut n, 20, 0.06, true, false);
    assert_eq!(n.reference(), None);
    assert!(n.sustained_growth());
}

#[test]
fn a_take_back_test_counts_only_ticks_with_answers_and_ends_without_shedding() {
    // Silent ticks while shedding (a hang) do not count toward the test ...
    let mut n = taken_back(0.002);
    let silent = TickInput {
        tick_mean: None,
        ..learner_tick(0.5, true, false)
    };
    for _ in 0..20 {
        n.update(silent, TICK.as_secs_f64());
    }
    assert_eq!(n.reference(), None);
    // ... and a test whose effort never starts within two seconds is dropped: a later
    // overload's shedding is not read against it.
    let mut n = taken_back(0.002);
    feed(&mut n, 41, 0.1, false, true);
    feed(&mut n, 10, 0.1, true, false);
    assert_eq!(n.reference(), None);
}

#[test]
fn a_slower_upstream_is_a_step_and_still_learned_at_rest() {
    // 20 -> 60 ms at once (three times slower), held: learned within about a second, never
    // taken back, no effort started.
    let mut n = rested();
    for _ in 0..100 {
        feed(&mut n, 1, 0.06, false, false);
        assert!(!n.sustained_growth(), "{:?}", n.value());
    }
    assert!(n.value().is_some_and(|v| v > 0.059), "{:?}", n.value());
}

#[test]
fn a_rise_too_close_to_tell_that_goes_on_rising_under_shedding_is_tested_again() {
    // Taken back at 60 ms, too close to the 45 ms the loop steers to for the test to
    // conclude; the test reads latency after 2 x 60 + 225 ms of shedding (seven ticks), and
    // it has risen to 70 ms, as a slowdown still building up does. The test starts again
    // from 70 ms (2 x 70 + 225 ms: eight ticks), which shedding does not lower either: the
    // upstream's own, verified.
    let mut n = taken_back(0.001);
    feed(&mut n, 7, 0.07, true, false);
    assert_eq!(n.reference(), None);
    feed(&mut n, 7, 0.07, true, false);
    assert_eq!(n.reference(), None);
    feed(&mut n, 1, 0.07, true, false);
    assert_eq!(n.reference(), Some(0.07));
}

#[test]
fn a_queue_that_fills_is_taken_back_though_noise_brings_its_raises_under_ramp_rise() {
    // 20 ms, then rising 2 ms a tick, but every tenth tick latency dips to just over the
    // learned value (noise), so that tick's raise is under RAMP_RISE. Such ticks neither
    // count nor break the run: the rise is taken back after 40 rising ticks.
    let mut n = rested();
    let taken = tick_taken_back(&mut n, 60, |k, v| {
        if k % 10 == 0 {
            v * 1.001
        } else {
            0.02 + 0.002 * f64::from(k)
        }
    });
    assert_eq!(taken, Some(44), "{:?}", n.value());
    assert_eq!(n.value(), Some(0.02));
}

#[test]
fn a_take_back_test_starts_again_only_once() {
    // Taken back at 60 ms (too close to the 45 ms the loop steers to), latency 65 ms when
    // the test reads it (2 x 60 + 225 ms: seven ticks): it starts again from 65 ms. Still
    // too close, and latency rose again (70 ms, eight ticks later): a queue growing under a
    // shedding too weak to drain it yet looks the same, so the test does not start a third
    // time, and 70 ms is never verified.
    let mut n = taken_back(0.001);
    feed(&mut n, 7, 0.065, true, false);
    feed(&mut n, 8, 0.07, true, false);
    feed(&mut n, 20, 0.07, true, false);
    assert_eq!(n.reference(), None);
    assert!(n.sustained_growth());
}

/// Feeds a learner at rest `ticks` ticks at most, tick `k` (from 1) at `latency(k, v)`
/// seconds, `v` the value learned before it; returns the tick at which a rise was taken back
/// ([`NoLoad::sustained_growth`]), if one was.
fn tick_taken_back(
    n: &mut NoLoad,
    ticks: u32,
    mut latency: impl FnMut(u32, f64) -> f64,
) -> Option<u32> {
    for k in 1..=ticks {
        let v = n.value().unwrap_or(0.0);
        feed(n, 1, latency(k, v), false, false);
        if n.sustained_growth() {
            return Some(k);
        }
    }
    None
}

/// Feeds rises from 20 ms at rest in a repeating pattern: one raise of 3% of the learned
/// value (a rising tick), then `small` raises of 0.015% (under RAMP_RISE), for `ticks` ticks;
/// returns the tick at which the rise was taken back, if it was.
fn rises_with_small_ones_between(small: u32, ticks: u32) -> Option<u32> {
    // Learning at rest moves the value 15.4% of the way to the latency a tick.
    tick_taken_back(&mut rested(), ticks, |k, v| {
        if (k - 1) % (small + 1) == 0 {
            v * 1.2
        } else {
            v * 1.001
        }
    })
}

#[test]
fn a_run_of_rises_spans_at_most_twice_ramp_ticks_raises() {
    // One small raise after each rising tick: the 40th rising tick is the 79th raise, and
    // the rise is taken back there. Two after each: 40 rising ticks would span 118 raises,
    // over the 80 a run may; runs end and start again, and none is taken back.
    assert_eq!(rises_with_small_ones_between(1, 200), Some(79));
    assert_eq!(rises_with_small_ones_between(2, 200), None);
}

/// Feeds `ticks` ticks of shedding with the upstream under-used (in-flight at a fifth of
/// the share over the tick, none at its end, still offered its peak) at `latency` (seconds,
/// against the 50 ms target).
fn shed_under_used(n: &mut NoLoad, ticks: u32, latency: f64) {
    for _ in 0..ticks {
        let t = TickInput {
            inflight: 0,
            utilisation: 0.2,
            ..learner_tick(latency, true, false)
        };
        n.update(t, TICK.as_secs_f64());
    }
}

#[test]
fn an_under_used_second_is_re_measured_only_while_its_latency_is_still_over_the_target() {
    // A second of shedding with the upstream under-used, its mean latency over 1.15 times
    // the target (75 ms for 15 ticks, then 20 ms: 61 ms against 57.5), but back under the
    // target at its end: a queue that drained, not a slower upstream. Nothing is verified
    // (the 20 ms of that moment used to become the reference).
    let mut drained = rested();
    shed_under_used(&mut drained, 15, 0.075);
    shed_under_used(&mut drained, 5, 0.02);
    assert_eq!(drained.reference(), None);
    // The same second with latency still over the threshold at its end is the upstream's own.
    let mut slow = rested();
    shed_under_used(&mut slow, 15, 0.075);
    shed_under_used(&mut slow, 5, 0.06);
    assert_eq!(slow.reference(), Some(0.06));
}

/// Asserts that the learner reads `share` of the rest margin back (0.0–1.0).
fn assert_margin_back(n: &NoLoad, share: f64) {
    let back = n.rest_margin_back();
    assert!(
        (back - share).abs() < 1e-12,
        "{back} of the margin back, not {share}"
    );
}

#[test]
fn the_rest_margin_returns_over_the_hold_after_an_overloads_effort_but_not_a_tests() {
    // Never shed: the whole margin.
    let mut n = rested();
    assert_margin_back(&n, 1.0);
    // Shedding, then at rest: none of it at the last tick with an effort, half a hold
    // (one second) later half, all of it after the hold.
    feed(&mut n, 10, 0.045, true, false);
    assert_margin_back(&n, 0.0);
    feed(&mut n, 20, 0.045, false, false);
    assert_margin_back(&n, 0.5);
    feed(&mut n, 20, 0.045, false, false);
    assert_margin_back(&n, 1.0);
    // An effort that starts while a take-back is tested is a test, as likely of a slowdown
    // as of a queue: the margin stays whole, for the whole of that effort.
    let mut n = taken_back(0.0015);
    feed(&mut n, 8, 0.06, true, false);
    assert!(n.sustained_growth());
    feed(&mut n, 10, 0.1, true, false);
    assert_margin_back(&n, 1.0);
    // Once the overload has passed (two seconds at rest at the target: the take-back is
    // cleared), the next effort is an overload's again, read afresh at its start.
    feed(&mut n, 40, 0.02, false, false);
    assert!(!n.sustained_growth());
    feed(&mut n, 1, 0.06, true, false);
    assert_margin_back(&n, 0.0);
}

/// Feeds `ticks` silent ticks of shedding with the upstream under-used, the smoothed latency
/// decaying from `from` (seconds) over `LATENCY_DECAY_TAU` as the controller's does without
/// answers: what it is at the end.
fn shed_under_used_silent(n: &mut NoLoad, ticks: u32, from: f64) -> f64 {
    let mut smoothed = from;
    for _ in 0..ticks {
        smoothed *= (-TICK.as_secs_f64() / LATENCY_DECAY_TAU.as_secs_f64()).exp();
        let t = TickInput {
            inflight: 0,
            utilisation: 0.2,
            tick_mean: None,
            smoothed,
            ..learner_tick(smoothed, true, false)
        };
        n.update(t, TICK.as_secs_f64());
    }
    smoothed
}

#[test]
fn an_under_used_second_counts_and_is_read_only_at_ticks_with_answers() {
    // A second of shedding with the upstream under-used and no answers at all: the smoothed
    // latency only decays from a 200 ms spike, over 1.15 times the 50 ms target throughout
    // (74 ms after the second). No answer carried it: nothing is verified.
    let mut n = rested();
    let end = shed_under_used_silent(&mut n, 20, 0.2);
    assert!(end > 0.0575, "{end}");
    assert_eq!(n.reference(), None);
    // Answered ticks count, and silent ones between them neither count nor break the
    // streak: ten answered at 70 ms, five silent, nine answered, and the twentieth answered
    // tick takes 70 ms as the upstream's own latency.
    shed_under_used(&mut n, 10, 0.07);
    shed_under_used_silent(&mut n, 5, 0.07);
    shed_under_used(&mut n, 9, 0.07);
    assert_eq!(n.reference(), None);
    shed_under_used(&mut n, 1, 0.07);
    assert_eq!(n.reference(), Some(0.07));
}
