//! The controller: a pure state machine stepped with the time as an argument (its constants
//! are in `constants.rs`, its output and the windows it is fed in `output.rs`).

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::ControllerConfig;
use super::constants::TICK;
use super::noload::{NoLoad, TickInput};
use super::output::{InflightWindow, LatencyWindow, Output};
use super::probe::{Action, ColdProbe, ProbeInput};
use super::report::{LoadReport, ReportWindow};
use super::schedule::GainSchedule;

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
///          few (no report, held_peak * L0 < FEW_SHARE):
///            qn = min(l / L0, FEW_INFLIGHT_MARGIN + n̄ / (rate * L0)),
///            LATENCY_SETPOINT below reads FEW_LATENCY_SETPOINT,
///            and the gain is times super::schedule's multiplier
/// r      = the upstream's reported utilisation, smoothed over LATENCY_TAU, while one came
///          within REPORT_STALE (super::report; none unless `--load-report` is set)
/// e      = clamp(min(r - SETPOINT, lc - LATENCY_SETPOINT), ±ERROR_CLAMP)    reported
///          clamp(min(qn - SETPOINT, lc - LATENCY_SETPOINT), ±ERROR_CLAMP)   L0 verified
///          clamp(lc - COLD_SETPOINT, ±ERROR_CLAMP)    not yet, not seen calm, full confidence
///          clamp(min(qn - UNVERIFIED_SETPOINT, lc - LATENCY_SETPOINT), ±ERROR_CLAMP)  not yet, otherwise
/// calm   = lc smoothed over RATE_TAU <= CALM at a tick with answers; seen calm after
///          CALM_TICKS such ticks in a row (silent ticks neither count nor break the run)
/// b      = clamp(b + gain * e * min(dt, 2 * TICK), 0, MAX_EFFORT)   (gain: INTEGRAL_GAIN,
///          UNWIND_GAIN when e < 0)
///          held while the cold probe runs (super::probe), lowered by its step as it starts
///          — from rest only when in-flight is past the proportional part's rest reference
///          (4.25 shares; its margin returns over REST_HOLD_TICKS after the loop last shed
///          with an effort a take-back's test did not start, NoLoad::rest_margin_back) or
///          the cap's (1.25 caps: the cap term sheds), a reported
///          utilisation over SETPOINT, in-flight has grown
///          for longer than a step would explain (a queue filling), or the replica has not
///          yet seen its upstream calm
/// base   = min(1, max(lc, (r or q - 1) / (SETPOINT - 1), inflight / cap))
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
    /// `lc` smoothed over [`RATE_TAU`](super::RATE_TAU): what the calm test reads. `None` until a tick has
    /// samples (the first sets it).
    calm_lc: Option<f64>,
    calm_ticks: u32,
    seen_calm: bool,
    probe: ColdProbe,
    report: LoadReport,
    /// The integral's gain schedule while the held share is under [`FEW_SHARE`](super::FEW_SHARE).
    schedule: GainSchedule,
    /// What each stream costs the upstream ([`super::costs`]).
    costs: super::costs::Costs,
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
    /// The upstream's own reported utilisation, smoothed (in-flight over its concurrency,
    /// 1.0 = every worker busy and none waiting); `None` while it reports none
    /// (`--load-report`, docs/pressure.md "Load reports").
    pub reported_utilisation: Option<f64>,
    /// Whether this replica has not yet seen its upstream calm (answering with the latency
    /// ratio at or under `CALM` for `CALM_TICKS` ticks): a cold replica steers on latency
    /// alone and may probe (docs/pressure.md).
    pub cold: bool,
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
            noload: NoLoad::new(config.tuning),
            output: Output {
                cap: config.max_inflight,
                latency_target: config.latency_target.as_secs_f64(),
                tuning: config.tuning,
                ..Output::default()
            },
            last: None,
            last_sample: None,
            last_sample_seen: None,
            calm_lc: None,
            calm_ticks: 0,
            seen_calm: false,
            probe: ColdProbe::default(),
            report: LoadReport::default(),
            schedule: GainSchedule::default(),
            costs: super::costs::Costs::default(),
        }
    }

    /// Folds in the in-flight counts observed since the last update (`inflight` now, used
    /// when no decision observed any) and the latency samples, all of one cost, returning the
    /// new output.
    pub fn update(
        &mut self,
        now: Instant,
        inflight: u32,
        observed: InflightWindow,
        latency: LatencyWindow,
        reports: ReportWindow,
    ) -> Output {
        self.update_slots(now, inflight, observed, &[latency], reports)
    }

    /// [`Controller::update`] with the latency samples per cost slot (`latency[i]` for
    /// [`super::CostSlot`] `i`): normalised by what each stream costs ([`super::costs`]).
    #[expect(clippy::cast_precision_loss, reason = "tick counts and sums < 2^52")]
    pub fn update_slots(
        &mut self,
        now: Instant,
        inflight: u32,
        observed: InflightWindow,
        latency: &[LatencyWindow],
        reports: ReportWindow,
    ) -> Output {
        let dt = match self.last {
            Some(last) => now.saturating_duration_since(last).as_secs_f64(),
            None => TICK.as_secs_f64(),
        };
        self.last = Some(now);
        if dt <= 0.0 {
            return self.output;
        }
        let k = self.config.tuning;
        let alpha = |tau: Duration| super::alpha(dt, tau);
        let target = self.config.latency_target.as_secs_f64().max(1e-6);
        let folded = self.costs.fold(latency, self.noload.value(), dt);
        let (latency, work) = (folded.latency, folded.work);
        let mean_inflight = if observed.count > 0 {
            observed.sum as f64 / observed.count as f64
        } else {
            f64::from(inflight)
        };
        self.mean_u = self.output.utilisation(mean_inflight, k.min_share);
        let reported = self.report.update(now, reports, dt, k.latency_tau);
        let tick_mean =
            (latency.count > 0).then(|| latency.sum_us as f64 / latency.count as f64 / 1e6);
        let last_sample = *self.last_sample.get_or_insert(now);
        if let Some(mean) = tick_mean {
            // After a silence (or at the first sample) it starts again from this mean.
            self.l = super::follow(self.l, mean, dt, k.latency_tau, self.last_sample_seen, now);
            self.last_sample = Some(now);
            self.last_sample_seen = Some(now);
        } else if self.mean_u > k.setpoint {
            let silence = now.saturating_duration_since(last_sample).as_secs_f64();
            self.l = self.l.max(silence);
        } else {
            // No queue: silence is no traffic, not a hang; it starts counting with a queue.
            self.last_sample = Some(now);
            self.l *= (-dt / k.latency_decay_tau.as_secs_f64()).exp();
        }
        if self.peak_rate == 0.0 && latency.count > 0 {
            // The first answers: the rate of this tick, not an average rising from zero that
            // would make the learned share look tiny and every request a queue.
            self.rate = work / dt.max(TICK.as_secs_f64() / 2.0);
        } else {
            self.rate += alpha(k.latency_tau) * (work / dt - self.rate);
        }
        self.slow_rate += alpha(k.rate_tau) * (work / dt - self.slow_rate);
        let flowing = inflight > 0 || latency.count > 0;
        if self.rate >= self.peak_rate {
            self.peak_rate = self.rate;
        } else if flowing {
            self.peak_rate += alpha(k.peak_tau) * (self.rate - self.peak_rate);
        }
        if self.rate >= self.held_peak {
            self.held_peak = self.rate;
        } else if self.output.effort == 0.0 && flowing {
            self.held_peak += alpha(k.peak_tau) * (self.rate - self.held_peak);
        }
        // In-flight over the share at the peak the upstream showed before the shedding
        // began: the under-use test's reading (what is admitted while shedding says nothing
        // about what the upstream could do).
        self.offered += alpha(k.rate_tau) * (observed.count as f64 / dt - self.offered);
        let held_u = match self.noload.value() {
            Some(l0) if self.held_peak > 0.0 => mean_inflight / (self.held_peak * l0).max(1e-9),
            _ => f64::INFINITY,
        };
        // Whether this replica is still offered about the peak it saw served: if its arrivals
        // fell (more replicas, a load balancer's new weights), holding less is its share, not
        // under-use, for a while (`noload::LONG_UNDER_USED_TICKS`).
        let still_offered = self.offered >= k.still_offered * self.held_peak;
        let full_rate = match self.config.max_inflight {
            Some(cap) => k
                .full_confidence_rate
                .min(f64::from(cap.get()) / target / 2.0),
            None => k.full_confidence_rate,
        };
        let confidence = (self.slow_rate / full_rate).max(self.mean_u - 1.0).min(1.0);
        let lc = self.l / target * confidence;
        // Past the cap term's reference the cap sheds: the loop is engaged even with no
        // effort, so neither is this rest for the no-load learner nor may the effort wait.
        let over_cap = self
            .output
            .per_cap(mean_inflight)
            .is_some_and(|u| u > k.setpoint);
        self.noload.update(
            TickInput {
                inflight,
                tick_mean,
                utilisation: held_u,
                still_offered,
                smoothed: self.l,
                target,
                effort: self.output.effort > 0.0,
                over_cap,
                share: self.output.share,
                cold: !self.seen_calm,
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
        // Few: a share of the upstream so small that this replica's own in-flight count is
        // mostly noise (FEW_SHARE); the queue reading is then latency over L0, the same for
        // every replica, unless the upstream reports its own. Answers carry the queue their
        // requests met a latency ago, so it is capped at one more than the in-flight reading
        // (FEW_INFLIGHT_MARGIN): a replica that holds nothing (its shedding drained its part
        // of the queue) reads no queue of its own and stops winding the effort up on answers
        // from before; one whose requests hang reads the latency (its silence) uncapped.
        let few = reported.is_none()
            && self.noload.value().is_some_and(|l0| {
                let held = self.held_peak * l0;
                held > 0.0 && held < k.few_share
            });
        let unverified = self.noload.value().map(|l0| {
            let holds = self.rate * l0;
            let inflight_reading = if holds > 0.0 {
                mean_inflight / holds
            } else if mean_inflight > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            if few {
                (self.l / l0.max(1e-6)).min(k.few_inflight_margin + inflight_reading)
            } else {
                inflight_reading
            }
        });
        let calm_lc = self
            .calm_lc
            .map_or(lc, |c| c + alpha(k.rate_tau) * (lc - c));
        if self.calm_lc.is_some() || tick_mean.is_some() {
            self.calm_lc = Some(calm_lc);
        }
        // Calm is an upstream seen answering without a queue: only ticks with answers count,
        // and silent ones neither count nor break the run, so a replica idle since it
        // started, or silent after one queued answer, has not seen it.
        if tick_mean.is_some() {
            if calm_lc <= k.calm {
                self.calm_ticks = self.calm_ticks.saturating_add(1);
            } else {
                self.calm_ticks = 0;
            }
        }
        self.seen_calm |= self.calm_ticks >= k.calm_ticks;
        // A cold replica settled on latency alone at the target finds out whether that
        // latency is a queue or the upstream's own by admitting a little more (`probe`).
        let action = self.probe.update(
            ProbeInput {
                eligible: !self.seen_calm
                    && reference.is_none()
                    && reported.is_none()
                    && confidence >= 1.0
                    && self.output.effort > 0.0,
                latency_ratio: lc,
                inflight: mean_inflight,
                offered: observed.count as f64 / dt,
            },
            k,
        );
        if let Action::Verified(ratio) = action {
            self.noload.verify(ratio * target);
        }
        let reference = self.noload.reference();
        let over = lc
            - if few {
                k.few_latency_setpoint
            } else {
                k.latency_setpoint
            };
        let error = match (reported, reference, unverified) {
            // The upstream states its queue: the same reading for every replica, cold or not,
            // held at the setpoint's standing queue.
            (Some(r), _, _) => (r - k.setpoint).min(over),
            // Verified: the same in-flight reading, held at the setpoint's standing queue.
            (None, Some(_), Some(q)) => (q - k.setpoint).min(over),
            // Not yet seen calm: what it learned at rest may be its fleet's queue, which
            // reads as no queue; latency alone.
            (None, None, Some(_)) if !self.seen_calm && confidence >= 1.0 => lc - k.cold_setpoint,
            (None, None, Some(q)) => (q - k.unverified_setpoint).min(over),
            _ => over,
        }
        .clamp(-k.error_clamp, k.error_clamp);
        // Re-measured under load: the effort was built against a stale reference (or an
        // unreachable target); it starts again from engaged, where the proportional part
        // already holds in-flight near the setpoint.
        let relearned = self.noload.take_relearned();
        // The schedule counts sign changes around one equilibrium: a replica no longer of a
        // few-request share, or whose reference was learned again, starts it afresh.
        if !few || relearned {
            self.schedule.reset();
        }
        let effort = if relearned {
            self.output.effort.min(k.engaged_effort)
        } else {
            self.output.effort
        };
        let rest = k.setpoint + k.rest_margin * self.noload.rest_margin_back();
        // The gate reads the raw share (not floored at MIN_SHARE): with many replicas a
        // replica's share is a fraction of a request, and a runaway queue is still a
        // multiple of it.
        let current_u = self
            .output
            .utilisation(f64::from(inflight).max(mean_inflight), 0.0);
        let may_start = !self.seen_calm
            || reported.is_some_and(|r| r > k.setpoint)
            || over_cap
            || self.mean_u.max(current_u) > rest
            || self.noload.sustained_growth();
        let step = dt.min(2.0 * TICK.as_secs_f64());
        let effort = if action == Action::Start {
            (effort - k.step).max(0.0)
        } else if action == Action::Hold {
            effort
        } else if effort > 0.0 || may_start || error < 0.0 {
            let gain = if error < 0.0 {
                k.unwind_gain
            } else {
                k.integral_gain
            };
            let schedule = if few {
                self.schedule.update(error, tick_mean.is_some(), k)
            } else {
                1.0
            };
            (effort + schedule * gain * error * step).clamp(0.0, k.max_effort)
        } else {
            effort
        };
        let queue_part = reported
            .or(queue)
            .map_or(0.0, |q| (q - 1.0) / (k.setpoint - 1.0));
        let cap_part = self
            .config
            .max_inflight
            .map_or(0.0, |cap| f64::from(inflight) / f64::from(cap.get()));
        // The rate the upstream completes requests at: the smoothed one, or this tick's if
        // higher (a burst beyond what this replica saw before is served at once, and a
        // smoothed rate still rising would predict a queue that is not there); between
        // bursts, the peak it last showed.
        let serving = if flowing {
            self.rate.max(work / dt)
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
            tuning: k,
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
            reported_utilisation: self.report.current(),
            cold: !self.seen_calm,
            concurrency_share: self.output.share,
            sample_rate: self.rate,
            base: self.output.base,
            effort: self.output.effort,
            max_inflight: self.config.max_inflight.map(NonZeroU32::get),
            latency_target_ms: target * 1e3,
        }
    }
}
