//! The controller: a pure state machine stepped with the time as an argument, its
//! constants, and the windows of samples it is fed.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::ControllerConfig;

/// Smoothing time constant of the utilisation shown below capacity (`base`). It only shapes
/// the pressure reported while nothing needs shedding; the loop itself does not go through it.
pub const UTILISATION_TAU: Duration = Duration::from_millis(400);
/// Smoothing time constant of the latency ratio. Short, because the integral waits on it at
/// the onset of overload; at 20 samples per tick the mean of a tick is already steady.
pub const LATENCY_TAU: Duration = Duration::from_millis(150);
/// Time constant with which the latency estimate decays while no samples arrive. It keeps the
/// controller from freezing: when everything sheddable is shed and the upstream idles, no
/// sample replaces the last high one (docs/pressure.md "Pressure controllers").
pub const LATENCY_DECAY_TAU: Duration = Duration::from_secs(1);
/// Sample rate (per second) at and above which the latency signal gets full weight, or half
/// the upstream's nominal throughput (`max_inflight / latency_target / 2`) if that is lower,
/// so that a small upstream can reach full weight at all. Below it the weight falls
/// linearly: a handful of slow requests is noise, not overload (docs/pressure.md "Pressure": "at
/// very low request volume the estimate is noise"). A standing queue is evidence too: the
/// weight is at least `mean in-flight / max_inflight - 1`, so an upstream that stops
/// answering (no samples at all) with requests piling up is believed.
pub const FULL_CONFIDENCE_RATE: f64 = 20.0;
/// In-flight the loop holds in steady overload, as a multiple of `max_inflight`: a standing
/// queue of a quarter of the upstream's concurrency, so that a worker that finishes always
/// finds the next request waiting (full use) while the wait stays a fraction of a service
/// time (latency near the target). CoDel (RFC 8289 section 4.2) keeps a small standing
/// queue rather than none for the same reason; it counts it in delay, this counts it in
/// requests, because in-flight is exact at the proxy while delay is known only a service
/// time later. Also the reference of the proportional part once the loop is engaged.
pub const SETPOINT: f64 = 1.25;
/// Proportional gain: load index per unit of utilisation above the proportional part's
/// reference, applied to the in-flight count at each decision. At 1, a queue one
/// `max_inflight` deeper than the reference moves pressure from 0.75 to 0.875. Not capped:
/// when every event is in a priority area (the shared loopback harness sends one Berlin
/// position), shedding any of it needs p > 0.95 at once, and a cap at +1 let the queue run
/// to 1,700 requests at 10x before the integral caught up (p99 990 ms in the scenario test,
/// 127 ms uncapped).
pub const PROPORTIONAL_GAIN: f64 = 1.0;
/// While no shedding effort has built up, the proportional part acts only above
/// `SETPOINT + REST_MARGIN` (2.25x `max_inflight`: a queue deeper than the upstream's own
/// concurrency). Below capacity, random arrivals queue a few requests now and then, and that
/// queue drains by itself; shedding on it cost 1.9% of the traffic at 0.8x offered load with
/// the reference at the setpoint, 0.2% at 2x, 0.04–0.3% at 2.25x (the scenario tests, over
/// five seeds). The
/// margin fades linearly as the effort grows to [`ENGAGED_EFFORT`], so the reference moves
/// continuously to [`SETPOINT`] once the loop is engaged.
pub const REST_MARGIN: f64 = 1.0;
/// Shedding effort at and above which the proportional part's reference is [`SETPOINT`].
pub const ENGAGED_EFFORT: f64 = 0.5;
/// Integral gain, per second: the shedding effort moves by this much per second per unit of
/// error (utilisation over the setpoint, or latency ratio over 1, whichever is smaller).
/// Tuned in closed loop (`tests/proxy/scenarios.rs`): 2, 4 and 8 all hold 3x and 10x at
/// 99–100% goodput with a CV near 1%; 4 settles a 10x step within a second and unwinds
/// within one after it (three when all traffic is rank 5 and the effort reached about 5; at
/// 2 that takes four, over the 3 s target). The loop is otherwise not sensitive to it
/// because the proportional part answers first.
pub const INTEGRAL_GAIN: f64 = 4.0;
/// Largest shedding effort: `p = 1 - 2^-(1 + 6) ≈ 0.992`, where every rank above 1 is shed
/// and rank 1 in part (with the default band). Anti-windup: an overload that shedding cannot
/// fix (never-shed traffic alone over capacity) does not build an effort that would take
/// seconds to unwind.
pub const MAX_EFFORT: f64 = 6.0;
/// The error fed to the integral is clamped to `±ERROR_CLAMP`, and the time step to
/// `2 * TICK` (a stalled ticker is not a long overload), so one tick of a huge queue (a 10x
/// step) moves the effort by at most `INTEGRAL_GAIN * ERROR_CLAMP * 2 * TICK` = 0.8.
pub const ERROR_CLAMP: f64 = 2.0;
/// How often [`PressureGauge::tick`](super::PressureGauge::tick) should run.
pub const TICK: Duration = Duration::from_millis(50);

/// Latency samples gathered between two ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencyWindow {
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples, microseconds.
    pub sum_us: u64,
}

/// In-flight counts seen by admission decisions between two ticks. Arrivals of a Poisson
/// stream see the time average (PASTA), so their mean is the window's mean in-flight,
/// without a clock read per request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InflightWindow {
    /// Number of observations.
    pub count: u64,
    /// Sum of the in-flight counts observed.
    pub sum: u64,
}

/// The controller's output after a tick, read by every decision until the next one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Output {
    /// How full the upstream is, `0.0..=1.0` (utilisation or latency ratio, the larger).
    pub base: f64,
    /// The integral shedding effort, load-index units, `0.0..=MAX_EFFORT`.
    pub effort: f64,
}

impl Output {
    /// Pressure, 0.0–1.0, with `inflight` requests in flight now:
    ///
    /// ```text
    /// reference = SETPOINT + REST_MARGIN * max(0, 1 - effort / ENGAGED_EFFORT)
    /// proportional = PROPORTIONAL_GAIN * (inflight / max_inflight - reference)
    /// x = base + max(0, effort + proportional)
    /// p = 1 - 2^(-x)
    /// ```
    ///
    /// `x = 1` gives `p = 0.5`, `x = 2` 0.75, `x = 3` 0.875. Continuous in every state
    /// variable and non-decreasing in `inflight`; in-flight is a whole number, so one more
    /// request moves `x` by at most `PROPORTIONAL_GAIN / max_inflight`.
    pub fn pressure(&self, inflight: u32, max_inflight: NonZeroU32) -> f64 {
        let u = f64::from(inflight) / f64::from(max_inflight.get());
        let reference = SETPOINT + REST_MARGIN * (1.0 - self.effort / ENGAGED_EFFORT).max(0.0);
        let proportional = PROPORTIONAL_GAIN * (u - reference);
        let x = self.base + (self.effort + proportional).max(0.0);
        1.0 - (-x).exp2()
    }
}

/// The pure controller.
///
/// State: `u`, smoothed utilisation; `l`, smoothed latency ratio; `rate`, smoothed latency
/// sample rate; `b`, the shedding effort; when silence began (below). On each
/// update at time `now`, `dt` seconds after the previous one, with `a(τ) = 1 - exp(-dt/τ)`,
/// `ū` the window's mean in-flight over `max_inflight`, `T` the latency target:
///
/// ```text
/// u    += a(UTILISATION_TAU) * (ū - u)
/// l    += a(LATENCY_TAU) * (mean_latency / T - l)       if samples arrived
/// l     = max(l, silence / T)                           if none, and ū > SETPOINT
/// l    *= exp(-dt / LATENCY_DECAY_TAU)                  if none, otherwise
/// rate += a(LATENCY_TAU) * (count / dt - rate)
/// full  = min(FULL_CONFIDENCE_RATE, max_inflight / T / 2)
/// lc    = l * min(1, max(rate / full, ū - 1))            confidence-weighted
/// e     = clamp(min(ū - SETPOINT, lc - 1), -ERROR_CLAMP, ERROR_CLAMP)
/// b     = clamp(b + INTEGRAL_GAIN * e * min(dt, 2 * TICK), 0, MAX_EFFORT)
/// base  = min(1, max(u, lc))
/// ```
///
/// `silence` is the time since the last latency sample or the last tick without a queue,
/// whichever is later: requests queued that long with no answer are at least that old, so
/// with a standing queue and no answers (an upstream that hung) the latency is at least
/// that long. Without a queue, silence is just no traffic, and the estimate decays.
///
/// The error is the smaller of the two because shedding is only the answer when both agree:
/// a standing queue with latency under target means `max_inflight` is set low and the
/// upstream copes; latency over target without a standing queue means the upstream is slow,
/// not loaded (shedding would not make it faster). Timeouts arrive as samples as slow as the
/// timeout (overload, not a fast sample); the proxy's own answers (sheds, 502s) and the
/// upstream's 5xx are not samples at all.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ControllerConfig,
    u: f64,
    l: f64,
    rate: f64,
    mean_inflight: f64,
    output: Output,
    last: Option<Instant>,
    last_sample: Option<Instant>,
}

/// The controller's view, for `GET /pressure`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ControllerState {
    /// Pressure at the last tick, 0.0–1.0, with the in-flight count of that moment.
    pub computed: f64,
    /// Mean in-flight over the last tick, as a share of max_inflight.
    pub mean_utilisation: f64,
    /// Smoothed in-flight utilisation (in-flight / max_inflight).
    pub utilisation: f64,
    /// Smoothed latency ratio (latency / target), before confidence weighting.
    pub latency_ratio: f64,
    /// Smoothed latency samples per second.
    pub sample_rate: f64,
    /// How full the upstream is below capacity, 0.0–1.0.
    pub base: f64,
    /// The integral shedding effort, load-index units.
    pub effort: f64,
    /// Configured max in-flight.
    pub max_inflight: u32,
    /// Configured latency target, milliseconds.
    pub latency_target_ms: f64,
}

impl Controller {
    /// A controller at rest (pressure 0).
    pub fn new(config: ControllerConfig) -> Self {
        Controller {
            config,
            u: 0.0,
            l: 0.0,
            rate: 0.0,
            mean_inflight: 0.0,
            output: Output::default(),
            last: None,
            last_sample: None,
        }
    }

    /// Folds in the in-flight counts observed since the last update (`inflight` now, used
    /// when no decision observed any) and the latency samples, returning the new output.
    #[expect(
        clippy::cast_precision_loss,
        reason = "sample counts and microsecond sums per tick stay far below 2^52"
    )]
    pub fn update(
        &mut self,
        now: Instant,
        inflight: u32,
        observed: InflightWindow,
        latency: LatencyWindow,
    ) -> Output {
        let dt = match self.last {
            Some(last) => now.saturating_duration_since(last).as_secs_f64(),
            None => TICK.as_secs_f64(),
        };
        self.last = Some(now);
        if dt <= 0.0 {
            return self.output;
        }
        let alpha = |tau: Duration| 1.0 - (-dt / tau.as_secs_f64()).exp();
        let max = f64::from(self.config.max_inflight.get());
        let mean = if observed.count > 0 {
            observed.sum as f64 / observed.count as f64
        } else {
            f64::from(inflight)
        };
        self.mean_inflight = mean / max;
        self.u += alpha(UTILISATION_TAU) * (self.mean_inflight - self.u);
        let target = self.config.latency_target.as_secs_f64().max(1e-6);
        let last_sample = *self.last_sample.get_or_insert(now);
        if latency.count > 0 {
            self.last_sample = Some(now);
            let mean = latency.sum_us as f64 / latency.count as f64 / 1e6;
            self.l += alpha(LATENCY_TAU) * (mean / target - self.l);
        } else if self.mean_inflight > SETPOINT {
            let silence = now.saturating_duration_since(last_sample).as_secs_f64();
            self.l = self.l.max(silence / target);
        } else {
            // No queue: silence is no traffic, not a hang; it starts counting with a queue.
            self.last_sample = Some(now);
            self.l *= (-dt / LATENCY_DECAY_TAU.as_secs_f64()).exp();
        }
        self.rate += alpha(LATENCY_TAU) * (latency.count as f64 / dt - self.rate);
        let full_rate = FULL_CONFIDENCE_RATE.min(max / target / 2.0);
        let confidence = (self.rate / full_rate)
            .max(self.mean_inflight - 1.0)
            .min(1.0);
        let lc = self.l * confidence;
        let error = (self.mean_inflight - SETPOINT)
            .min(lc - 1.0)
            .clamp(-ERROR_CLAMP, ERROR_CLAMP);
        let step = dt.min(2.0 * TICK.as_secs_f64());
        self.output = Output {
            base: self.u.max(lc).clamp(0.0, 1.0),
            effort: (self.output.effort + INTEGRAL_GAIN * error * step).clamp(0.0, MAX_EFFORT),
        };
        self.output
    }

    /// The last output.
    pub fn output(&self) -> Output {
        self.output
    }

    /// The controller's state, with `inflight` requests in flight now.
    pub fn state(&self, inflight: u32) -> ControllerState {
        ControllerState {
            computed: self.output.pressure(inflight, self.config.max_inflight),
            mean_utilisation: self.mean_inflight,
            utilisation: self.u,
            latency_ratio: self.l,
            sample_rate: self.rate,
            base: self.output.base,
            effort: self.output.effort,
            max_inflight: self.config.max_inflight.get(),
            latency_target_ms: self.config.latency_target.as_secs_f64() * 1e3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pressure::gauge::{LATENCY_SUM_BITS, unpack};

    const MAX: u32 = 8;

    fn controller() -> Controller {
        Controller::new(ControllerConfig {
            max_inflight: NonZeroU32::new(MAX).unwrap(),
            latency_target: Duration::from_millis(50),
        })
    }

    fn samples(per_tick: u64, ms: u64) -> LatencyWindow {
        LatencyWindow {
            count: per_tick,
            sum_us: per_tick * ms * 1000,
        }
    }

    /// Runs `secs` of ticks with `inflight` in flight throughout; returns the end time and
    /// the pressure a decision would see then.
    fn run(
        c: &mut Controller,
        start: Instant,
        secs: f64,
        inflight: u32,
        latency: LatencyWindow,
    ) -> (Instant, f64) {
        let mut now = start;
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a non-negative number of ticks, saturating at u32::MAX"
        )]
        let ticks = (secs / TICK.as_secs_f64()) as u32;
        let observed = InflightWindow {
            count: 1,
            sum: u64::from(inflight),
        };
        for _ in 0..ticks {
            now += TICK;
            c.update(now, inflight, observed, latency);
        }
        let max = NonZeroU32::new(MAX).unwrap();
        (now, c.output().pressure(inflight, max))
    }

    #[tokio::test(start_paused = true)]
    async fn half_at_full_use_and_target_latency() {
        let mut c = controller();
        // 8 in flight of 8; 100 samples/s at exactly the 50 ms target.
        let (_, p) = run(&mut c, Instant::now(), 5.0, MAX, samples(5, 50));
        assert!((p - 0.5).abs() < 0.01, "{p}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standing_queue_over_target_builds_effort_until_it_is_gone() {
        let mut c = controller();
        // 16 in flight of 8, latency 4x the target: overload.
        let (now, p) = run(&mut c, Instant::now(), 1.0, 2 * MAX, samples(5, 200));
        assert!(p > 0.9, "{p}");
        let effort = c.output().effort;
        assert!(effort > 2.0, "{effort}");
        // Held at the setpoint with latency at target: the effort stays where it is.
        let at_setpoint = MAX * 5 / 4;
        let (now, p) = run(&mut c, now, 2.0, at_setpoint, samples(5, 50));
        assert!(
            (c.output().effort - effort).abs() < 1e-9,
            "{:?}",
            c.output()
        );
        assert!(p > 0.75, "{p}");
        // The queue goes (half full, answered at half the target): so does the effort.
        let (_, p) = run(&mut c, now, 2.0, MAX / 2, samples(5, 25));
        assert!(c.output().effort.abs() < f64::EPSILON, "{:?}", c.output());
        assert!(p < 0.5, "{p}");
    }

    #[tokio::test(start_paused = true)]
    async fn decays_when_samples_stop() {
        let mut c = controller();
        let (now, p) = run(&mut c, Instant::now(), 3.0, 2 * MAX, samples(5, 400));
        assert!(p > 0.95, "{p}");
        // Everything shed: nothing in flight, no samples. Below 0.5 within 3 s.
        let (_, p) = run(&mut c, now, 3.0, 0, LatencyWindow::default());
        assert!(p < 0.5, "{p}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_upstream_at_light_load_is_not_shed() {
        // After a deploy the upstream takes 3x the target, but only 2 of 8 are in flight.
        let mut c = controller();
        let (_, p) = run(&mut c, Instant::now(), 30.0, 2, samples(5, 150));
        assert!(p <= 0.5, "{p}");
        assert!(c.output().effort.abs() < f64::EPSILON, "{:?}", c.output());
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_with_latency_under_target_builds_no_effort() {
        // max_inflight set low: 24 of 8 in flight, yet answered in 20 ms (target 50).
        let mut c = controller();
        let (_, p) = run(&mut c, Instant::now(), 30.0, 3 * MAX, samples(5, 20));
        assert!(c.output().effort.abs() < f64::EPSILON, "{:?}", c.output());
        // Only the proportional part, on a queue three times max_inflight: x = 1 + 0.75.
        assert!((p - (1.0 - (-1.75f64).exp2())).abs() < 1e-9, "{p}");
        // Up to the proportional part's reference at rest (2.25x max_inflight), nothing.
        let max = NonZeroU32::new(MAX).unwrap();
        assert!(c.output().pressure(MAX * 9 / 4, max) <= 0.5);
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_that_stops_answering_is_overload() {
        // Answered at the target, then nothing: no samples while requests pile up.
        let mut c = controller();
        let (now, _) = run(&mut c, Instant::now(), 2.0, MAX, samples(5, 50));
        let (_, p) = run(&mut c, now, 3.0, 3 * MAX, LatencyWindow::default());
        assert!(p > 0.95, "{p} {:?}", c.state(3 * MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_after_a_quiet_night_is_not_a_hang() {
        // Ten minutes of no traffic, then a queue whose first answers are not back yet.
        let mut c = controller();
        let (now, _) = run(&mut c, Instant::now(), 600.0, 0, LatencyWindow::default());
        let (_, p) = run(&mut c, now, 0.05, 3 * MAX, LatencyWindow::default());
        assert!(
            c.output().effort.abs() < f64::EPSILON,
            "{:?}",
            c.state(3 * MAX)
        );
        assert!(
            c.state(3 * MAX).latency_ratio <= 1.0,
            "{:?}",
            c.state(3 * MAX)
        );
        // The proportional part answers the queue itself: x = 1 + 0.75, no more.
        assert!(p <= 1.0 - (-1.75f64).exp2() + 1e-9, "{p}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_ticker_is_not_a_long_overload() {
        let mut c = controller();
        let (now, _) = run(&mut c, Instant::now(), 1.0, MAX, samples(5, 50));
        let before = c.output().effort;
        // The next tick comes 5 s late, with a deep queue answered slowly.
        c.update(
            now + Duration::from_secs(5),
            4 * MAX,
            InflightWindow {
                count: 1,
                sum: u64::from(4 * MAX),
            },
            samples(5, 500),
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
        let max = NonZeroU32::new(MAX).unwrap();
        for _ in 0..10 {
            (now, _) = run(&mut c, now, 0.95, 0, LatencyWindow::default());
            now += TICK;
            c.update(now, 1, InflightWindow::default(), samples(1, 500));
            let p = c.output().pressure(1, max);
            assert!(p <= 0.5, "{p}");
        }
    }

    proptest::proptest! {
        /// Pressure is non-decreasing in the in-flight count and has no cliff: one more
        /// request in flight moves the load index by at most PROPORTIONAL_GAIN / max_inflight.
        #[test]
        fn continuous_and_monotone_in_inflight(
            base in 0.0f64..=1.0,
            effort in 0.0f64..=MAX_EFFORT,
            max in 1u32..64,
            inflight in 0u32..400,
        ) {
            let max = NonZeroU32::new(max).unwrap();
            let out = Output { base, effort };
            let (a, b) = (out.pressure(inflight, max), out.pressure(inflight + 1, max));
            proptest::prop_assert!((0.0..=1.0).contains(&a));
            proptest::prop_assert!(b >= a);
            // dp/dx = ln 2 * 2^-x <= ln 2.
            let step = std::f64::consts::LN_2 * PROPORTIONAL_GAIN / f64::from(max.get());
            proptest::prop_assert!(b - a <= step + 1e-12);
        }

        /// A packed window gives back the count and sum that went in.
        #[test]
        fn packed_windows_round_trip(count in 0u64..(1 << 20), sum in 0u64..(1 << 44)) {
            let word = (count << LATENCY_SUM_BITS) | sum;
            proptest::prop_assert_eq!(unpack(word, LATENCY_SUM_BITS), (count, sum));
        }
    }
}
