//! The controller: a pure state machine stepped with the time as an argument, its
//! constants, and the windows of samples it is fed.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::ControllerConfig;
use super::noload::{NoLoad, TickInput};

/// Smoothing time constant of the latency. Short, because the integral waits on it at the
/// onset of overload; at 20 samples per tick the mean of a tick is already steady.
pub const LATENCY_TAU: Duration = Duration::from_millis(150);
/// Time constant with which the latency estimate decays while no samples arrive. It keeps the
/// controller from freezing: when everything sheddable is shed and the upstream idles, no
/// sample replaces the last high one (docs/pressure.md "Pressure controllers").
pub const LATENCY_DECAY_TAU: Duration = Duration::from_secs(1);
/// Time constant with which the peak completion rate, the throughput behind the learned
/// concurrency share, falls toward the current one while traffic flows. It holds while no
/// traffic flows (a burst after a quiet night is measured against the day's share). A second
/// peak, for the under-use test ([`super::noload`]), also holds while the loop sheds (what it
/// admits then says nothing about what the upstream could do).
pub const PEAK_TAU: Duration = Duration::from_secs(2);
/// Time constant of the sample rate the confidence weighting reads: a second, so that one
/// tick with a sample after a quiet spell is not read as a sustained rate.
pub const RATE_TAU: Duration = Duration::from_secs(1);
/// Sample rate (per second) at and above which the latency signal gets full weight, or half
/// the safety cap's nominal throughput (`max_inflight / latency_target / 2`) if a cap is set
/// and that is lower. Below it the weight falls linearly: a handful of slow requests is noise,
/// not overload (docs/pressure.md "Pressure": "at very low request volume the estimate is
/// noise"). A standing queue is evidence too: the weight is at least `queue ratio - 1`, so an
/// upstream that stops answering (no samples at all) with requests piling up is believed.
/// Per replica: at 20 per second (this crate's one-replica value) 16 replicas in front of a
/// 400 req/s upstream each saw 10–25, and held latency at twice the target on half weight.
pub const FULL_CONFIDENCE_RATE: f64 = 5.0;
/// Queue ratio the loop holds in steady overload when latency alone would not stop it (a
/// target below what the upstream can do): latency 1.25 times the no-load latency, by Little's
/// law in-flight 1.25 times the upstream's concurrency, a standing queue of a quarter of it, so
/// that a worker that finishes always finds the next request waiting (full use) while the wait
/// stays a fraction of a service time. CoDel (RFC 8289 section 4.2) keeps a small standing
/// queue rather than none for the same reason. Also the reference of the proportional part
/// once the loop is engaged.
pub const SETPOINT: f64 = 1.25;
/// Mean latency, as a share of the target, at which the integral holds an overloaded
/// upstream. Below 1 so that the operator's target sits in the upper part of the latency
/// distribution rather than at its middle: with the mean held at the target, admitted p99 was
/// 1.9–2.1 times the target in the scenario tests (uniform 10–30 ms service); at 0.9, 1.4–1.9;
/// at 0.85 goodput fell to 93% once the upstream had lost half its workers (too short a queue
/// to keep four workers busy). Pressure still reads 0.5 at the target itself below capacity
/// (`base`).
pub const LATENCY_SETPOINT: f64 = 0.9;
/// Confidence-weighted latency ratio, smoothed over [`RATE_TAU`], at or under which a tick is
/// calm. A replica that has not yet seen [`CALM_TICKS`] calm ticks in a row has not seen its
/// upstream without a queue (a new pod joining a fleet that holds one, or a proxy started
/// into an overload): what it learned at rest may be that queue, so its effort may start on
/// latency alone, without the runaway-queue gate that keeps a slower deploy from shedding,
/// and at full confidence its error is the latency error against [`COLD_SETPOINT`] (the
/// queue it would read against that learned latency is its fleet's, which reads as none).
/// Smoothed, because one replica of 16 sees a sample or two a
/// tick, and 20 calm ticks in a row of the raw ratio at 0.8x (0.75 of the target, each tick
/// a coin toss near 0.8) never came: with the latency error alone those replicas shed
/// priority areas at 3x.
pub const CALM: f64 = 0.8;
/// Latency ratio a replica that has not yet seen its upstream calm holds on latency alone,
/// at full confidence ([`FULL_CONFIDENCE_RATE`]): the target itself, above
/// [`LATENCY_SETPOINT`], so that latency at the target without a queue still reads pressure
/// 0.5 and a few slow samples stay noise. In the 2 -> 8 -> 3 count change at 3x
/// (`tests/proxy/replicas.rs`) it took admitted p99 with 8 replicas from 85 to 55 ms and
/// with 3 from 155 to 52 ms; at 1.15 the 8-replica phase went past twice the target, and at
/// [`LATENCY_SETPOINT`] latency at the target without a queue read above 0.5 (the unit test
/// `half_at_target_latency_without_a_queue`).
pub const COLD_SETPOINT: f64 = 1.0;
/// Consecutive calm ticks after which a replica has seen its upstream calm: one second.
pub const CALM_TICKS: u32 = 20;
/// Smallest learned share the proportional part divides by, requests. With many replicas in
/// front of a small upstream a replica's share is below one request (16 replicas, 8 workers:
/// 0.5), and each request in flight would move the load index by two proportional gains;
/// shedding on that noise cost priority areas 11% of their events at 10x.
pub const MIN_SHARE: f64 = 1.0;
/// Proportional gain: load index per unit of in-flight over the learned concurrency share
/// above the proportional part's reference, applied to the in-flight count at each decision
/// (a step to 10x fills a queue in milliseconds, long before a tick). At 4 the learned share,
/// a few requests with several replicas, made pressure jump a rank band per request and shed
/// priority areas at 10x (`tests/proxy/replicas.rs`); the onset of all-priority traffic is
/// held by the cap's steeper term ([`CAP_GAIN`]) where a cap is set.
pub const PROPORTIONAL_GAIN: f64 = 1.0;
/// While no shedding effort has built up, the proportional part acts only above
/// `SETPOINT + REST_MARGIN` (4.25 times the learned share). A deploy that makes the upstream
/// three times slower triples in-flight at once (Little's law) before any sample says why, and
/// must not shed; random arrivals below capacity queue now and then and must not either. The
/// margin fades linearly as the effort grows to [`ENGAGED_EFFORT`].
pub const REST_MARGIN: f64 = 3.0;
/// Predicted latency, as a share of the target, at and under which the share's proportional
/// part is shut: a queue that Little's law says a request clears in a quarter of the target
/// is no reason to shed, however many learned shares deep it is (docs/pressure.md "Pressure":
/// a queue at good latency is not overload). The prediction is in-flight over the rate the
/// upstream completes requests at; the part opens linearly up to [`GATE_OPEN`]. Without it, a
/// replica that had seen only light traffic (a share of one request) shed 5% of a burst to
/// 95% of a fast upstream whose p99 stayed at a third of the target
/// (`tests/proxy/scenarios.rs`, `a_burst_to_a_fast_upstream_sheds_nothing`).
pub(super) const GATE_SHUT: f64 = 0.25;
/// Predicted latency, as a share of the target, at and above which the share's proportional
/// part acts in full: half the target, below the [`LATENCY_SETPOINT`] the integral holds in
/// steady overload, so that in overload the loop is what it was without the gate.
pub(super) const GATE_OPEN: f64 = 0.5;
/// Shortest time over which [`Output::pressure_at`] reads a rate from the samples since the
/// last tick: a tenth of a tick, so that one answer just after a tick is not read as a fast
/// upstream. In `a_burst_to_a_fast_upstream_sheds_nothing` the burst's first tick shed 18
/// requests with them, 90 when they were read as a rate over two ticks (no clock read), 177
/// without them, and 369 without the gate.
pub(super) const MIN_RATE_SPAN: Duration = Duration::from_millis(5);
/// Proportional gain past the safety cap (`--max-inflight`), load index per cap's worth of
/// in-flight over [`SETPOINT`] times the cap, with no rest margin: a cap is the operator's own
/// statement of how much this replica may hold, not a learned share that a slower deploy can
/// fool. Steep, so that an onset with every event in a priority area (shed only past p 0.95)
/// holds a queue of about half the cap, not four caps (the shared harness: admitted p99 over
/// the run 95 ms at gain 1, onset included).
pub const CAP_GAIN: f64 = 4.0;
/// Share of its peak completion rate a replica must still be offered for holding less than
/// its share to count as under-use ([`super::noload`]). The peak is the highest smoothed
/// rate, above the mean by its noise, so not 1; a replica whose arrivals fell to a quarter
/// (scaled out from 2 to 8) is far below.
pub const STILL_OFFERED: f64 = 0.8;
/// Shedding effort at and above which the proportional part's reference is [`SETPOINT`].
pub const ENGAGED_EFFORT: f64 = 0.5;
/// Integral gain, per second: the shedding effort moves by this much per second per unit of
/// error. Tuned in closed loop (`tests/proxy/scenarios.rs`): 2, 4 and 8 all held 3x and 10x at
/// 99–100% goodput; 4 settles a 10x step within a second and unwinds within one after it.
pub const INTEGRAL_GAIN: f64 = 4.0;
/// Integral gain while the error is negative (the effort unwinds), per second. Twice
/// [`INTEGRAL_GAIN`]: once latency is under the target there is nothing to protect, and an
/// effort of 5 (all traffic in one priority area at 10x) must be gone within the 3 s the
/// scenario tests allow; at the winding gain it took 4 s with latency-led errors, which at
/// 0.8x load are only -0.25.
pub const UNWIND_GAIN: f64 = 8.0;
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
    /// How full the upstream is, `0.0..=1.0` (latency over target, queue over the no-load
    /// latency, in-flight over the cap: the largest).
    pub base: f64,
    /// The integral shedding effort, load-index units, `0.0..=MAX_EFFORT`.
    pub effort: f64,
    /// This replica's learned share of the upstream's concurrency, requests: peak completion
    /// rate times no-load latency (Little's law). 0 while unknown.
    pub share: f64,
    /// The safety cap (`--max-inflight`), if set.
    pub cap: Option<NonZeroU32>,
    /// Requests per second the upstream completes for this replica at the last tick (0 while
    /// none completes): with the in-flight count, the latency Little's law predicts.
    pub serving_rate: f64,
    /// The latency target, seconds.
    pub latency_target: f64,
    /// When the tick that made this output ran; `None` before the first.
    pub at: Option<Instant>,
}

impl Output {
    /// Pressure, 0.0–1.0, with `inflight` requests in flight now:
    ///
    /// ```text
    /// u = inflight / max(share, MIN_SHARE)                (0 while the share is unknown)
    /// reference = SETPOINT + REST_MARGIN * max(0, 1 - effort / ENGAGED_EFFORT)
    /// predicted = inflight / serving_rate / latency_target     (infinite while nothing completes)
    /// gate = clamp((predicted - GATE_SHUT) / (GATE_OPEN - GATE_SHUT), 0, 1)
    /// share_part = PROPORTIONAL_GAIN * (u - reference), times gate where positive
    /// proportional = max(share_part, CAP_GAIN * (inflight / cap - SETPOINT))   (the cap term if set)
    /// x = base + max(0, effort + proportional)
    /// p = 1 - 2^(-x)
    /// ```
    ///
    /// `x = 1` gives `p = 0.5`, `x = 2` 0.75, `x = 3` 0.875. Continuous in every state
    /// variable and non-decreasing in `inflight`. The gate opens where the share part is at
    /// most `PROPORTIONAL_GAIN * inflight / share`, over `GATE_OPEN / (GATE_OPEN - GATE_SHUT)`
    /// more requests than where it starts to, so one more request moves the load index by at
    /// most three times `PROPORTIONAL_GAIN / share`.
    pub fn pressure(&self, inflight: u32) -> f64 {
        self.pressure_at(inflight, 0, Duration::ZERO)
    }

    /// [`Output::pressure`], with `completed` latency samples in the `since` that passed
    /// since the tick that made this output: `completed / max(since, MIN_RATE_SPAN)` per
    /// second is a rate the upstream serves at now, so a burst beyond anything this replica
    /// saw before is known to be served within milliseconds, not at the next tick. Only the
    /// gate's prediction reads it.
    #[expect(
        clippy::cast_precision_loss,
        reason = "a sample count of one tick, far below 2^52"
    )]
    pub fn pressure_at(&self, inflight: u32, completed: u64, since: Duration) -> f64 {
        let n = f64::from(inflight);
        let reference = SETPOINT + REST_MARGIN * (1.0 - self.effort / ENGAGED_EFFORT).max(0.0);
        let mut proportional = PROPORTIONAL_GAIN * (self.per_share(n, MIN_SHARE) - reference);
        if proportional > 0.0 {
            let serving = self
                .serving_rate
                .max(completed as f64 / since.max(MIN_RATE_SPAN).as_secs_f64());
            // n > 0 here; a rate or target of 0 predicts an infinite latency: the gate is open.
            let predicted = n / (serving * self.latency_target);
            proportional *= ((predicted - GATE_SHUT) / (GATE_OPEN - GATE_SHUT)).clamp(0.0, 1.0);
        }
        if let Some(per_cap) = self.per_cap(n) {
            proportional = proportional.max(CAP_GAIN * (per_cap - SETPOINT));
        }
        let x = self.base + (self.effort + proportional).max(0.0);
        1.0 - (-x).exp2()
    }

    /// `inflight` as a multiple of the learned share, the share floored at `floor`
    /// requests; 0 while the share is unknown.
    fn per_share(&self, inflight: f64, floor: f64) -> f64 {
        if self.share > 0.0 {
            inflight / self.share.max(floor)
        } else {
            0.0
        }
    }

    /// `inflight` as a multiple of the safety cap, if one is set.
    fn per_cap(&self, inflight: f64) -> Option<f64> {
        self.cap.map(|cap| inflight / f64::from(cap.get()))
    }

    /// The in-flight load the loop reads: a multiple of the share floored at `floor`, or of
    /// the cap, the larger; 0 while neither is known.
    fn utilisation(&self, inflight: f64, floor: f64) -> f64 {
        self.per_share(inflight, floor)
            .max(self.per_cap(inflight).unwrap_or(0.0))
    }

    /// The in-flight count class budgets share: the cap if set, else the in-flight the loop
    /// holds at full use (the share times [`SETPOINT`], rounded up); `u32::MAX` while
    /// neither is known.
    pub fn capacity(&self) -> u32 {
        if let Some(cap) = self.cap {
            return cap.get();
        }
        let full = (self.share * SETPOINT).ceil();
        if full < 1.0 {
            return u32::MAX;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a positive request count, saturating at u32::MAX"
        )]
        let full = full as u32;
        full
    }
}

/// The pure controller.
///
/// State: `l`, smoothed latency (seconds); `rate`, smoothed completion (latency sample) rate,
/// its peak, and a slower rate for confidence; the offered (decision) rate; the no-load
/// latency `L0` ([`super::noload`]); `b`, the shedding effort; when silence began; whether
/// the replica has seen its upstream calm. On each update at time `now`, `dt` seconds after
/// the previous one, with `a(τ) = 1 - exp(-dt/τ)`, `T` the target:
///
/// ```text
/// l     += a(LATENCY_TAU) * (mean_latency - l)         if samples arrived
/// l      = max(l, silence)                             if none, and a queue stands
/// l     *= exp(-dt / LATENCY_DECAY_TAU)                if none, otherwise
/// share  = peak_rate * L0                              Little's law, requests
/// ū      = mean in-flight / max(share, MIN_SHARE)      (or / cap, the larger)
/// q      = l / L0                                      queue ratio, 1 = no queue
/// lc     = l / T * min(1, max(slow_rate / full, ū - 1))  confidence-weighted latency ratio
/// qn     = n̄ / (rate * L0)                             in-flight over what completions hold
/// e      = clamp(min(qn - SETPOINT, lc - LATENCY_SETPOINT), ±ERROR_CLAMP)   L0 verified
///          clamp(min(qn - 1, lc - LATENCY_SETPOINT), ±ERROR_CLAMP)          not yet
/// b      = clamp(b + gain * e * min(dt, 2 * TICK), 0, MAX_EFFORT)   (gain: INTEGRAL_GAIN,
///          UNWIND_GAIN when e < 0)
///          — from rest only when in-flight is past the proportional part's rest reference
///          (4.25 shares), in-flight has grown for longer than a step would explain (a queue
///          filling), or the replica has not yet seen its upstream calm
/// base   = min(1, max(lc, (q - 1) / (SETPOINT - 1), inflight / cap))
/// ```
///
/// Every term but the share is the same for every replica in front of one upstream: latency
/// is shared, and `q` is, by Little's law, the upstream's total in-flight over its
/// concurrency whatever the number of replicas (docs/pressure.md "Scale"). No number of
/// replicas and no concurrency of the upstream enters: `--max-inflight`, if set, is a safety
/// cap with its own term. The share is this replica's part of the upstream's concurrency,
/// learned from its own completions, so the proportional part reads a queue's onset in this
/// replica's own in-flight count.
///
/// The error is the smaller of the two because shedding is only the answer when both agree:
/// latency over target without a standing queue means the upstream is slow, not loaded
/// (shedding would not make it faster); a standing queue at good latency is fine. Timeouts
/// arrive as samples as slow as the timeout (overload, not a fast sample); the proxy's own
/// answers (sheds, 502s) and the upstream's 5xx are not samples at all.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ControllerConfig,
    l: f64,
    rate: f64,
    slow_rate: f64,
    peak_rate: f64,
    held_peak: f64,
    /// Smoothed decisions per second (RATE_TAU): the arrivals this replica is offered.
    offered: f64,
    mean_u: f64,
    noload: NoLoad,
    output: Output,
    last: Option<Instant>,
    last_sample: Option<Instant>,
    last_sample_seen: Option<Instant>,
    /// `lc` smoothed over [`RATE_TAU`]: what the calm test reads. `None` until a tick has
    /// samples (the first sets it).
    calm_lc: Option<f64>,
    calm_ticks: u32,
    seen_calm: bool,
}

/// The controller's view, for `GET /pressure`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ControllerState {
    /// Pressure at the last tick, 0.0–1.0, with the in-flight count of that moment.
    pub computed: f64,
    /// Mean in-flight over the last tick, as a multiple of the learned share (or the cap).
    pub mean_utilisation: f64,
    /// Smoothed latency over the target (before confidence weighting).
    pub latency_ratio: f64,
    /// Smoothed latency over the no-load latency (1 = no queue); `None` until verified.
    pub queue_ratio: Option<f64>,
    /// The learned no-load latency, milliseconds; `None` until learned.
    pub noload_latency_ms: Option<f64>,
    /// Whether the no-load latency was measured under load (an under-used upstream).
    pub noload_verified: bool,
    /// This replica's learned share of the upstream's concurrency, requests.
    pub concurrency_share: f64,
    /// Smoothed latency samples per second.
    pub sample_rate: f64,
    /// How full the upstream is below capacity, 0.0–1.0.
    pub base: f64,
    /// The integral shedding effort, load-index units.
    pub effort: f64,
    /// The safety cap, if set.
    pub max_inflight: Option<u32>,
    /// Configured latency target, milliseconds.
    pub latency_target_ms: f64,
}

impl Controller {
    /// A controller at rest (pressure 0).
    pub fn new(config: ControllerConfig) -> Self {
        Controller {
            config,
            l: 0.0,
            rate: 0.0,
            slow_rate: 0.0,
            peak_rate: 0.0,
            held_peak: 0.0,
            offered: 0.0,
            mean_u: 0.0,
            noload: NoLoad::default(),
            output: Output {
                cap: config.max_inflight,
                latency_target: config.latency_target.as_secs_f64(),
                ..Output::default()
            },
            last: None,
            last_sample: None,
            last_sample_seen: None,
            calm_lc: None,
            calm_ticks: 0,
            seen_calm: false,
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
        let target = self.config.latency_target.as_secs_f64().max(1e-6);
        let mean_inflight = if observed.count > 0 {
            observed.sum as f64 / observed.count as f64
        } else {
            f64::from(inflight)
        };
        self.mean_u = self.output.utilisation(mean_inflight, MIN_SHARE);
        let tick_mean =
            (latency.count > 0).then(|| latency.sum_us as f64 / latency.count as f64 / 1e6);
        let last_sample = *self.last_sample.get_or_insert(now);
        if let Some(mean) = tick_mean {
            // After a silence (or at the first sample) the decayed estimate says nothing
            // about the upstream: start again from what it answers now.
            let fresh = self
                .last_sample_seen
                .is_none_or(|seen| now.saturating_duration_since(seen) >= LATENCY_TAU);
            self.last_sample = Some(now);
            self.last_sample_seen = Some(now);
            if fresh {
                self.l = mean;
            } else {
                self.l += alpha(LATENCY_TAU) * (mean - self.l);
            }
        } else if self.mean_u > SETPOINT {
            let silence = now.saturating_duration_since(last_sample).as_secs_f64();
            self.l = self.l.max(silence);
        } else {
            // No queue: silence is no traffic, not a hang; it starts counting with a queue.
            self.last_sample = Some(now);
            self.l *= (-dt / LATENCY_DECAY_TAU.as_secs_f64()).exp();
        }
        if self.peak_rate == 0.0 && latency.count > 0 {
            // The first answers: the rate of this tick, not an average rising from zero that
            // would make the learned share look tiny and every request a queue.
            self.rate = latency.count as f64 / dt.max(TICK.as_secs_f64() / 2.0);
        } else {
            self.rate += alpha(LATENCY_TAU) * (latency.count as f64 / dt - self.rate);
        }
        self.slow_rate += alpha(RATE_TAU) * (latency.count as f64 / dt - self.slow_rate);
        let flowing = inflight > 0 || latency.count > 0;
        if self.rate >= self.peak_rate {
            self.peak_rate = self.rate;
        } else if flowing {
            self.peak_rate += alpha(PEAK_TAU) * (self.rate - self.peak_rate);
        }
        if self.rate >= self.held_peak {
            self.held_peak = self.rate;
        } else if self.output.effort == 0.0 && flowing {
            self.held_peak += alpha(PEAK_TAU) * (self.rate - self.held_peak);
        }
        // In-flight over the share at the peak the upstream showed before the shedding
        // began: the under-use test's reading (what is admitted while shedding says nothing
        // about what the upstream could do).
        self.offered += alpha(RATE_TAU) * (observed.count as f64 / dt - self.offered);
        // Only while this replica is still offered about the peak it saw served: if its
        // arrivals fell (more replicas, a load balancer's new weights), holding less is its
        // share, not under-use.
        let held_u = match self.noload.value() {
            Some(l0) if self.held_peak > 0.0 && self.offered >= STILL_OFFERED * self.held_peak => {
                mean_inflight / (self.held_peak * l0).max(1e-9)
            }
            _ => f64::INFINITY,
        };
        let full_rate = match self.config.max_inflight {
            Some(cap) => FULL_CONFIDENCE_RATE.min(f64::from(cap.get()) / target / 2.0),
            None => FULL_CONFIDENCE_RATE,
        };
        let confidence = (self.slow_rate / full_rate).max(self.mean_u - 1.0).min(1.0);
        let lc = self.l / target * confidence;
        self.noload.update(
            TickInput {
                inflight,
                tick_mean,
                utilisation: held_u,
                smoothed: self.l,
                target,
                effort: self.output.effort,
                share: self.output.share,
            },
            dt,
        );
        let reference = self.noload.reference();
        let queue = self.queue_ratio();
        // Without a verified reference, the queue evidence is the tick's mean in-flight over
        // what the current completion rate holds at the no-load latency learned at rest
        // (Little's law), with no margin: 0 as soon as nothing is in flight, unbounded when
        // nothing completes. A new replica learns its no-load latency from queued answers,
        // so this reads 1 where its fleet holds a queue, and more as the queue grows.
        let unverified = self.noload.value().map(|l0| {
            let holds = self.rate * l0;
            if holds > 0.0 {
                mean_inflight / holds
            } else if mean_inflight > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        });
        let calm_lc = self.calm_lc.map_or(lc, |c| c + alpha(RATE_TAU) * (lc - c));
        if self.calm_lc.is_some() || tick_mean.is_some() {
            self.calm_lc = Some(calm_lc);
        }
        if calm_lc <= CALM {
            self.calm_ticks = self.calm_ticks.saturating_add(1);
        } else {
            self.calm_ticks = 0;
        }
        self.seen_calm |= self.calm_ticks >= CALM_TICKS;
        let over = lc - LATENCY_SETPOINT;
        let error = match (reference, unverified) {
            // Verified: the same in-flight reading, held at the setpoint's standing queue.
            (Some(_), Some(q)) => (q - SETPOINT).min(over),
            // Not yet seen calm: what it learned at rest may be its fleet's queue, which
            // reads as no queue; latency alone.
            (None, Some(_)) if !self.seen_calm && confidence >= 1.0 => lc - COLD_SETPOINT,
            (None, Some(q)) => (q - 1.0).min(over),
            _ => over,
        }
        .clamp(-ERROR_CLAMP, ERROR_CLAMP);
        // Re-measured under load: the effort was built against a stale reference (or an
        // unreachable target); it starts again from engaged, where the proportional part
        // already holds in-flight near the setpoint.
        let relearned = self.noload.take_relearned();
        let effort = if relearned {
            self.output.effort.min(ENGAGED_EFFORT)
        } else {
            self.output.effort
        };
        let rest = SETPOINT + REST_MARGIN;
        // The gate reads the raw share (not floored at MIN_SHARE): with many replicas a
        // replica's share is a fraction of a request, and a runaway queue is still a
        // multiple of it.
        let current_u = self
            .output
            .utilisation(f64::from(inflight).max(mean_inflight), 0.0);
        let may_start =
            !self.seen_calm || self.mean_u.max(current_u) > rest || self.noload.sustained_growth();
        let step = dt.min(2.0 * TICK.as_secs_f64());
        let effort = if effort > 0.0 || may_start || error < 0.0 {
            let gain = if error < 0.0 {
                UNWIND_GAIN
            } else {
                INTEGRAL_GAIN
            };
            (effort + gain * error * step).clamp(0.0, MAX_EFFORT)
        } else {
            effort
        };
        let queue_part = queue.map_or(0.0, |q| (q - 1.0) / (SETPOINT - 1.0));
        let cap_part = self
            .config
            .max_inflight
            .map_or(0.0, |cap| f64::from(inflight) / f64::from(cap.get()));
        // The rate the upstream completes requests at: the smoothed one, or this tick's if
        // higher (a burst beyond what this replica saw before is served at once, and a
        // smoothed rate still rising would predict a queue that is not there); between
        // bursts, the peak it last showed.
        let serving = if flowing {
            self.rate.max(latency.count as f64 / dt)
        } else {
            self.peak_rate
        };
        self.output = Output {
            base: lc.max(queue_part).max(cap_part).clamp(0.0, 1.0),
            effort,
            share: self.noload.value().map_or(0.0, |l0| self.peak_rate * l0),
            cap: self.config.max_inflight,
            serving_rate: serving,
            latency_target: target,
            at: Some(now),
        };
        self.output
    }

    /// Smoothed latency over the verified no-load latency (1 = no queue); `None` until
    /// verified.
    fn queue_ratio(&self) -> Option<f64> {
        self.noload.reference().map(|l0| self.l / l0.max(1e-6))
    }

    /// The last output.
    pub fn output(&self) -> Output {
        self.output
    }

    /// The controller's state, with `inflight` requests in flight now.
    pub fn state(&self, inflight: u32) -> ControllerState {
        let target = self.config.latency_target.as_secs_f64().max(1e-6);
        ControllerState {
            computed: self.output.pressure(inflight),
            mean_utilisation: self.mean_u,
            latency_ratio: self.l / target,
            queue_ratio: self.queue_ratio(),
            noload_latency_ms: self.noload.value().map(|l0| l0 * 1e3),
            noload_verified: self.noload.reference().is_some(),
            concurrency_share: self.output.share,
            sample_rate: self.rate,
            base: self.output.base,
            effort: self.output.effort,
            max_inflight: self.config.max_inflight.map(NonZeroU32::get),
            latency_target_ms: target * 1e3,
        }
    }
}
