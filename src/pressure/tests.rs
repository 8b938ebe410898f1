//! The controller's unit tests: the pure state machine stepped on paused time, with windows
//! of samples built by hand.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::ControllerConfig;
use super::constants::{ERROR_CLAMP, FEW_SHARE, INTEGRAL_GAIN, PROPORTIONAL_GAIN, SETPOINT, TICK};
use super::controller::Controller;
use super::gauge::{LATENCY_SUM_BITS, unpack};
use super::output::{InflightWindow, LatencyWindow, Output};
use super::report::ReportWindow;

fn controller() -> Controller {
    Controller::new(ControllerConfig {
        max_inflight: None,
        latency_target: Duration::from_millis(50),
        tuning: &super::Tuning::DEFAULT,
    })
}

fn samples(per_tick: u64, ms: u64) -> LatencyWindow {
    LatencyWindow {
        count: per_tick,
        sum_us: per_tick * ms * 1000,
    }
}

/// Runs `secs` of ticks with `inflight` in flight throughout, the wall clock still; returns
/// the end time and the pressure a decision would see then.
fn run(
    c: &mut Controller,
    start: Instant,
    secs: f64,
    inflight: u32,
    latency: LatencyWindow,
) -> (Instant, f64) {
    let mut now = start;
    #[expect(clippy::cast_sign_loss, reason = "secs is not negative")]
    #[expect(clippy::cast_possible_truncation, reason = "saturates at u32::MAX")]
    let ticks = (secs / TICK.as_secs_f64()) as u32;
    let observed = InflightWindow {
        count: 1,
        sum: u64::from(inflight),
    };
    for _ in 0..ticks {
        now += TICK;
        c.update(now, inflight, observed, latency, ReportWindow::default());
    }
    (now, c.output().pressure(inflight))
}

/// A controller that has learned a 25 ms no-load latency from 100 answers a second with 2.5
/// in flight (Little's law), half the 50 ms target: a share of 2.5, not yet verified.
fn learned() -> (Controller, Instant) {
    let mut c = controller();
    let start = Instant::now();
    let (now, p) = run(&mut c, start, 3.0, 3, samples(5, 25));
    assert!(p < 0.5, "{p}");
    let state = c.state(3);
    assert!(!state.noload_verified, "only probes verify: {state:?}");
    assert!(
        (state.noload_latency_ms.unwrap() - 25.0).abs() < 0.5,
        "{state:?}"
    );
    (c, now)
}

#[tokio::test(start_paused = true)]
async fn half_at_target_latency_without_a_queue() {
    let mut c = controller();
    // 100 samples/s at exactly the 50 ms target, 5 in flight: no queue, latency at target.
    let (_, p) = run(&mut c, Instant::now(), 5.0, 5, samples(5, 50));
    assert!((p - 0.5).abs() < 0.01, "{p} {:?}", c.state(5));
}

#[tokio::test(start_paused = true)]
async fn a_standing_queue_over_target_builds_effort_until_it_is_gone() {
    let (mut c, now) = learned();
    // 8x the no-load latency and 4x the target, in-flight grown to match: overload.
    let (now, p) = run(&mut c, now, 1.0, 20, samples(5, 200));
    assert!(p > 0.9, "{p}");
    assert!(c.output().effort > 2.0, "{:?}", c.state(20));
    // Held at the target, queue ratio 2 (over the setpoint): once the smoothed latency is
    // there, latency is the binding term, its error is 0, and the effort stays put.
    let (now, _) = run(&mut c, now, 1.0, 5, samples(5, 50));
    let effort = c.output().effort;
    let (now, p) = run(&mut c, now, 2.0, 5, samples(5, 50));
    assert!(
        (c.output().effort - effort).abs() < 1e-3,
        "{effort} {:?}",
        c.state(5)
    );
    assert!(p > 0.75, "{p}");
    // The queue goes (answered at the no-load latency): so does the effort.
    let (_, p) = run(&mut c, now, 4.0, 3, samples(5, 25));
    assert!(c.output().effort.abs() < f64::EPSILON, "{:?}", c.output());
    assert!(p < 0.5, "{p}");
}

#[tokio::test(start_paused = true)]
async fn decays_when_samples_stop() {
    let (mut c, now) = learned();
    let (now, p) = run(&mut c, now, 3.0, 40, samples(5, 400));
    assert!(p > 0.95, "{p}");
    // Everything shed: nothing in flight, no samples. Below 0.5 within 3 s.
    let (_, p) = run(&mut c, now, 3.0, 0, LatencyWindow::default());
    assert!(p < 0.5, "{p}");
}

#[tokio::test(start_paused = true)]
async fn a_slower_deploy_at_light_load_is_learned_not_shed() {
    // After a deploy the upstream takes 3x as long (75 ms, over the 50 ms target); the same
    // 100 answers a second now hold three times as many in flight (Little's law).
    let (mut c, now) = learned();
    let (_, p) = run(&mut c, now, 3.0, 8, samples(5, 75));
    assert!(p <= 0.5, "{p} {:?}", c.state(8));
    assert!(c.output().effort.abs() < f64::EPSILON, "{:?}", c.output());
    let state = c.state(8);
    assert!(
        (state.noload_latency_ms.unwrap() - 75.0).abs() < 5.0,
        "{state:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queue_with_latency_under_target_builds_no_effort() {
    // Three times the no-load latency but under the target: the upstream copes.
    let (mut c, now) = learned();
    run(&mut c, now, 30.0, 7, samples(5, 40));
    assert!(c.output().effort.abs() < f64::EPSILON, "{:?}", c.output());
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_stops_answering_is_overload() {
    // Answered as learned, then nothing: no samples while requests pile up.
    let (mut c, now) = learned();
    let (_, p) = run(&mut c, now, 3.0, 24, LatencyWindow::default());
    assert!(p > 0.95, "{p} {:?}", c.state(24));
}

/// A replica of a few-request share ([`FEW_SHARE`]): 20 answers a second at 20 ms with
/// nothing standing in flight, against a 50 ms target, a share of 0.4 and seen calm; then
/// overloaded for half a second, 8 in flight and answers at 200 ms, its effort built.
fn few_share_overloaded() -> (Controller, Instant) {
    let mut c = controller();
    let (now, _) = run(&mut c, Instant::now(), 3.0, 0, samples(1, 20));
    let state = c.state(0);
    assert!(
        !state.cold && state.concurrency_share < FEW_SHARE,
        "{state:?}"
    );
    let (now, _) = run(&mut c, now, 0.5, 8, samples(1, 200));
    assert!(c.output().effort > 0.0, "{:?}", c.state(8));
    (c, now)
}

#[tokio::test(start_paused = true)]
async fn a_few_share_replica_that_holds_nothing_does_not_wind_up_on_old_answers() {
    // Its shedding emptied its part of the queue: nothing in flight, while the answers still
    // arriving waited in it (200 ms, ten no-load latencies). Read from latency alone, the
    // effort went on winding up; capped by the in-flight reading (FEW_INFLIGHT_MARGIN), it
    // holds.
    let (mut c, now) = few_share_overloaded();
    let built = c.output().effort;
    run(&mut c, now, 0.5, 0, samples(1, 200));
    assert!(c.output().effort <= built, "{built} -> {:?}", c.state(0));
}

#[tokio::test(start_paused = true)]
async fn a_few_share_replica_whose_requests_hang_still_reads_overload() {
    let (mut c, now) = few_share_overloaded();
    let (_, p) = run(&mut c, now, 3.0, 8, LatencyWindow::default());
    assert!(p > 0.95, "{p} {:?}", c.state(8));
}

#[tokio::test(start_paused = true)]
async fn a_queue_that_clears_in_a_fraction_of_the_target_is_not_shed() {
    // Learned at 100 answers a second (a share of 2.5). Then 20 in flight, eight shares,
    // answered 2,000 a second: Little's law says a request waits 10 ms, a fifth of the
    // target. The proportional part stays shut, before the tick that sees the rate (the
    // answers since the last tick say it) and after.
    let (mut c, now) = learned();
    let before = c.output();
    assert!(before.pressure(20) > 0.9, "{before:?}");
    let since = Duration::from_millis(20);
    assert!(before.pressure_at(20, 40, since) < 0.5, "{before:?}");
    let (_, p) = run(&mut c, now, 0.05, 20, samples(100, 10));
    assert!(p < 0.5, "{p} {:?}", c.state(20));
    // One answer 10 µs after the tick is not a rate of 100,000 a second (the rate is read
    // over at least MIN_RATE_SPAN): still overload.
    assert!(
        before.pressure_at(20, 1, Duration::from_micros(10)) > 0.9,
        "{before:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_burst_after_a_quiet_night_is_not_a_hang() {
    // A day's traffic, ten minutes of none, then twice the day's in-flight whose first
    // answers are not back yet.
    let (mut c, now) = learned();
    let (now, _) = run(&mut c, now, 600.0, 0, LatencyWindow::default());
    let (_, p) = run(&mut c, now, 0.05, 6, LatencyWindow::default());
    let state = c.state(6);
    assert!(c.output().effort.abs() < f64::EPSILON, "{state:?}");
    assert!(state.latency_ratio <= 1.0, "{state:?}");
    assert!(p <= 0.5, "{p} {state:?}");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_ticker_is_not_a_long_overload() {
    let (mut c, now) = learned();
    let before = c.output().effort;
    // The next tick comes 5 s late, with a deep queue answered slowly.
    c.update(
        now + Duration::from_secs(5),
        40,
        InflightWindow { count: 1, sum: 40 },
        samples(5, 500),
        ReportWindow::default(),
    );
    let moved = c.output().effort - before;
    assert!(
        moved <= INTEGRAL_GAIN * ERROR_CLAMP * 2.0 * TICK.as_secs_f64() + 1e-9,
        "{moved}"
    );
}

#[tokio::test(start_paused = true)]
async fn few_slow_samples_are_noise() {
    let mut c = controller();
    // One very slow request per second, nothing else in flight.
    let mut now = Instant::now();
    for _ in 0..10 {
        (now, _) = run(&mut c, now, 0.95, 0, LatencyWindow::default());
        now += TICK;
        c.update(
            now,
            1,
            InflightWindow::default(),
            samples(1, 500),
            ReportWindow::default(),
        );
        let p = c.output().pressure(1);
        assert!(p <= 0.5, "{p} {:?}", c.state(1));
    }
}

/// From [`learned`]: half a second of overload at 120 ms with 20 in flight, then three
/// seconds with one request in flight answered at 60 ms 20 times a second, while
/// `decisions_per_tick` arrivals are offered each tick. Returns the state at the end.
fn shed_to_one_in_flight(decisions_per_tick: u64) -> super::ControllerState {
    shed_to_one_in_flight_for(decisions_per_tick, 60).0
}

/// [`shed_to_one_in_flight`] for `ticks` ticks instead of three seconds' 60; also returns the
/// pressure at the end.
fn shed_to_one_in_flight_for(decisions_per_tick: u64, ticks: u32) -> (super::ControllerState, f64) {
    let (mut c, mut now) = learned();
    let (n, _) = run(&mut c, now, 0.5, 20, samples(5, 120));
    now = n;
    assert!(c.output().effort > 0.0, "{:?}", c.state(20));
    let offered = InflightWindow {
        count: decisions_per_tick,
        sum: decisions_per_tick,
    };
    for _ in 0..ticks {
        now += TICK;
        c.update(now, 1, offered, samples(1, 60), ReportWindow::default());
    }
    (c.state(1), c.output().pressure(1))
}

#[tokio::test(start_paused = true)]
async fn shedding_an_under_used_upstream_re_measures_the_no_load_latency() {
    // Learned at 25 ms (100 answers a second, 2.5 in flight); then the upstream gets slower
    // (60 ms, over the 50 ms target) and overloaded: the effort builds on latency and sheds
    // until one request is in flight, answered 20 times a second, while 200 a second are
    // still offered. Shedding has left the upstream under-used for a second with latency
    // flat over the target: that latency is the upstream's own. It becomes the verified
    // reference, and the queue ratio reads no queue.
    let state = shed_to_one_in_flight(10);
    assert!(state.noload_verified, "{state:?}");
    assert!(
        (state.noload_latency_ms.unwrap() - 60.0).abs() < 6.0,
        "{state:?}"
    );
    assert!(state.queue_ratio.unwrap() < SETPOINT, "{state:?}");
}

#[tokio::test(start_paused = true)]
async fn fewer_arrivals_for_this_replica_are_not_under_use() {
    // The same, except that the replica is now offered less than it saw served (more
    // replicas share the arrivals): holding little is its share, and nothing is re-measured
    // short of LONG_UNDER_USED_TICKS (ten seconds; this runs nine).
    let (state, _) = shed_to_one_in_flight_for(1, 180);
    assert!(!state.noload_verified, "{state:?}");
}

#[tokio::test(start_paused = true)]
async fn an_upstream_left_slow_after_its_overload_is_re_measured_in_the_end() {
    // The same, held longer: the overload is over (the replica is offered a fifth of what it
    // saw served, all of it answered), but the upstream stays slower than the target. The
    // effort cannot lower that latency; shedding for good would be shedding from slowness
    // without a queue. After LONG_UNDER_USED_TICKS the latency is the upstream's own, and
    // the pressure falls to what it says: 0.5 or less once the effort has unwound. (Before,
    // the effort stayed at its maximum and pressure at 0.99 for as long as the upstream
    // stayed slow.)
    let (state, p) = shed_to_one_in_flight_for(1, 280);
    assert!(state.noload_verified, "{state:?}");
    assert!(
        (state.noload_latency_ms.unwrap() - 60.0).abs() < 6.0,
        "{state:?}"
    );
    assert!(p <= 0.5 + 1e-9, "{p} {state:?}");
}

#[tokio::test(start_paused = true)]
async fn idling_before_the_first_answer_is_not_calm() {
    // A replica started before its traffic has no answer for two seconds: no latency, but
    // nothing seen of its upstream either. Sent straight into an overload, it must start it
    // as a replica started into the overload does, cold, with its effort built on latency
    // alone: what it learns from the first answers is the queue. (Idle ticks used to count
    // as calm, and such a replica took that queue for the upstream's own latency.)
    let start = Instant::now();
    let mut direct = controller();
    run(&mut direct, start, 2.0, 20, samples(5, 120));
    let mut idle = controller();
    let (now, _) = run(&mut idle, start, 2.0, 0, samples(0, 0));
    run(&mut idle, now, 2.0, 20, samples(5, 120));
    let (d, i) = (direct.state(20), idle.state(20));
    assert!(d.effort > 0.0, "{d:?}");
    assert!((i.effort - d.effort).abs() < 1e-9, "{i:?} against {d:?}");
}

#[tokio::test(start_paused = true)]
async fn one_queued_answer_and_silence_are_not_calm() {
    // One answer at 120 ms (2.4 times the target, with 20 in flight: a queue), then ten
    // silent seconds: the smoothed latency fades to nothing, but nothing was seen of the
    // upstream without a queue, so the replica is still cold.
    let mut c = controller();
    let start = Instant::now();
    let (now, _) = run(&mut c, start, TICK.as_secs_f64(), 20, samples(1, 120));
    run(&mut c, now, 10.0, 0, samples(0, 0));
    let state = c.state(0);
    assert!(state.latency_ratio < 0.1, "{state:?}");
    assert!(state.cold, "{state:?}");
}

#[tokio::test(start_paused = true)]
async fn a_second_of_calm_answers_is_calm() {
    // The other side: answers at 10 ms, a fifth of the target, for a second.
    let mut c = controller();
    let start = Instant::now();
    run(&mut c, start, 1.5, 1, samples(5, 10));
    assert!(!c.state(1).cold, "{:?}", c.state(1));
}

proptest::proptest! {
    /// Pressure is non-decreasing in the in-flight count and has no cliff: one more request
    /// in flight moves the load index by at most three times PROPORTIONAL_GAIN / share (the
    /// gate on predicted latency opening, `Output::pressure`).
    #[test]
    fn continuous_and_monotone_in_inflight(
        base in 0.0f64..=1.0,
        effort in 0.0f64..=super::MAX_EFFORT,
        share in 1.0f64..64.0,
        inflight in 0u32..400,
        serving_rate in 0.0f64..1000.0,
        latency_target in 0.001f64..1.0,
    ) {
        let out = Output { base, effort, share, cap: None, serving_rate, latency_target, at: None, tuning: &super::Tuning::DEFAULT };
        let (a, b) = (out.pressure(inflight), out.pressure(inflight + 1));
        proptest::prop_assert!((0.0..=1.0).contains(&a));
        proptest::prop_assert!(b >= a);
        // dp/dx = ln 2 * 2^-x <= ln 2.
        let step = 3.0 * std::f64::consts::LN_2 * PROPORTIONAL_GAIN / share;
        proptest::prop_assert!(b - a <= step + 1e-12);
    }

    /// A cap adds a term and never lowers pressure.
    #[test]
    fn a_cap_never_lowers_pressure(
        base in 0.0f64..=1.0,
        effort in 0.0f64..=super::MAX_EFFORT,
        share in 0.0f64..64.0,
        cap in 1u32..64,
        inflight in 0u32..400,
        serving_rate in 0.0f64..1000.0,
        latency_target in 0.001f64..1.0,
    ) {
        let free = Output { base, effort, share, cap: None, serving_rate, latency_target, at: None, tuning: &super::Tuning::DEFAULT };
        let capped = Output { cap: NonZeroU32::new(cap), ..free };
        proptest::prop_assert!(capped.pressure(inflight) >= free.pressure(inflight));
    }

    /// A packed window gives back the count and sum that went in.
    #[test]
    fn packed_windows_round_trip(count in 0u64..(1 << 20), sum in 0u64..(1 << 44)) {
        let word = (count << LATENCY_SUM_BITS) | sum;
        proptest::prop_assert_eq!(unpack(word, LATENCY_SUM_BITS), (count, sum));
    }
}
