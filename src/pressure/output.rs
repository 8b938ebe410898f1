//! The controller's output: what every admission decision reads between two ticks (the
//! pressure at its in-flight count), and the windows of samples a tick folds in.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::tuning::Tuning;

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
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// Requests per second the upstream completes for this replica at the last tick: the
    /// smoothed completion rate, or the tick's own if higher; while nothing is in flight and
    /// nothing completes, the peak it last showed; decaying toward 0 while requests are in
    /// flight and none completes (a hang). With the in-flight count, the latency Little's law
    /// predicts.
    pub serving_rate: f64,
    /// The latency target, seconds.
    pub latency_target: f64,
    /// When the tick that made this output ran; `None` before the first.
    pub at: Option<Instant>,
    /// The tuned values the formula reads (those named below).
    pub tuning: &'static Tuning,
}

impl Default for Output {
    /// Nothing known: pressure 0 at any in-flight count, [`Tuning::DEFAULT`].
    fn default() -> Self {
        Output {
            base: 0.0,
            effort: 0.0,
            share: 0.0,
            cap: None,
            serving_rate: 0.0,
            latency_target: 0.0,
            at: None,
            tuning: &Tuning::DEFAULT,
        }
    }
}

impl Output {
    /// Pressure, 0.0–1.0, with `inflight` requests in flight now:
    ///
    /// ```text
    /// u = inflight / max(share, MIN_SHARE)                (0 while the share is unknown)
    /// reference = SETPOINT + REST_MARGIN * max(0, 1 - effort / ENGAGED_EFFORT)
    /// predicted = inflight / serving_rate / latency_target     (infinite while nothing completes)
    /// gate = clamp((predicted - GATE_OPEN / 2) / (GATE_OPEN / 2), 0, 1)
    /// share_part = PROPORTIONAL_GAIN * (u - reference), times gate where positive
    /// proportional = max(share_part, CAP_GAIN * (inflight / cap - SETPOINT))   (the cap term if set)
    /// x = base + max(0, effort + proportional)
    /// p = 1 - 2^(-x)
    /// ```
    ///
    /// `x = 1` gives `p = 0.5`, `x = 2` 0.75, `x = 3` 0.875. Continuous in every state
    /// variable and non-decreasing in `inflight`. The gate opens where the share part is at
    /// most `PROPORTIONAL_GAIN * inflight / share`, in full at twice the in-flight count at
    /// which it starts to, so one more request moves the load index by at most three times
    /// `PROPORTIONAL_GAIN / share`.
    pub fn pressure(&self, inflight: u32) -> f64 {
        self.pressure_at(inflight, 0, Duration::ZERO)
    }

    /// [`Output::pressure`], with `completed` latency samples in the `since` that passed
    /// since the tick that made this output: `completed / max(since, MIN_RATE_SPAN)` per
    /// second is a rate the upstream serves at now, so a burst beyond anything this replica
    /// saw before is known to be served within milliseconds, not at the next tick. Only the
    /// gate's prediction reads it.
    #[expect(clippy::cast_precision_loss, reason = "a tick's count, below 2^52")]
    pub fn pressure_at(&self, inflight: u32, completed: u64, since: Duration) -> f64 {
        let k = self.tuning;
        let n = f64::from(inflight);
        let reference =
            k.setpoint + k.rest_margin * (1.0 - self.effort / k.engaged_effort).max(0.0);
        let mut proportional = k.proportional_gain * (self.per_share(n, k.min_share) - reference);
        if proportional > 0.0 {
            let serving = self
                .serving_rate
                .max(completed as f64 / since.max(k.min_rate_span).as_secs_f64());
            // n > 0 here; a rate or target of 0 predicts an infinite latency: the gate is open.
            let predicted = n / (serving * self.latency_target);
            // Shut under half of GATE_OPEN, open in full at it (a tuned GATE_OPEN of 0 is
            // always open, with no NaN from 0 / 0).
            let shut = k.gate_open / 2.0;
            let gate = if k.gate_open > 0.0 {
                ((predicted - shut) / (k.gate_open - shut)).clamp(0.0, 1.0)
            } else {
                1.0
            };
            proportional *= gate;
        }
        if let Some(per_cap) = self.per_cap(n) {
            proportional = proportional.max(k.cap_gain * (per_cap - k.setpoint));
        }
        let x = self.base + (self.effort + proportional).max(0.0);
        1.0 - (-x).exp2()
    }

    /// `inflight` as a multiple of the learned share, the share floored at `floor`
    /// requests; 0 while the share is unknown.
    pub(super) fn per_share(&self, inflight: f64, floor: f64) -> f64 {
        if self.share > 0.0 {
            inflight / self.share.max(floor)
        } else {
            0.0
        }
    }

    /// `inflight` as a multiple of the safety cap, if one is set.
    pub(super) fn per_cap(&self, inflight: f64) -> Option<f64> {
        self.cap.map(|cap| inflight / f64::from(cap.get()))
    }

    /// The in-flight load the loop reads: a multiple of the share floored at `floor`, or of
    /// the cap, the larger; 0 while neither is known.
    pub(super) fn utilisation(&self, inflight: f64, floor: f64) -> f64 {
        self.per_share(inflight, floor)
            .max(self.per_cap(inflight).unwrap_or(0.0))
    }

    /// The in-flight count class budgets share: the cap if set, else the in-flight the loop
    /// holds at full use (the share times [`SETPOINT`](super::SETPOINT), rounded up); `u32::MAX` while
    /// neither is known.
    pub fn capacity(&self) -> u32 {
        if let Some(cap) = self.cap {
            return cap.get();
        }
        let full = (self.share * self.tuning.setpoint).ceil();
        if full < 1.0 {
            return u32::MAX;
        }
        #[expect(clippy::cast_possible_truncation, reason = "saturates at u32::MAX")]
        #[expect(clippy::cast_sign_loss, reason = "at least 1 here")]
        let full = full as u32;
        full
    }
}
