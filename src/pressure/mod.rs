//! The pressure controller: upstream in-flight count and latency in, pressure in `[0, 1]`
//! out (docs/pressure.md "Pressure").
//!
//! [`Controller`] is the pure state machine (time is an argument); its [`Output`] is what
//! every decision reads between ticks (`output.rs`); [`PressureGauge`] is the shared,
//! lock-free front the request path uses, ticked by one task.
//!
//! # The loop
//!
//! Shedding changes the load the controller measures, so the controller is a feedback loop
//! whose plant is the upstream's queue. A queue integrates the difference between the
//! admitted rate and the upstream's capacity, so a controller that is proportional only
//! settles with an offset that grows with the overload (the more must be shed, the longer
//! the queue that pays for it: 91% goodput and a 114 ms p99 at 10x in this crate's first
//! version), and one that is integral only oscillates (two integrators in a ring). This one
//! is proportional-integral, like CoDel's and Vector's controllers in spirit:
//!
//! - the **integral** `b` (the shedding effort, in load-index units) rises while the upstream
//!   holds a queue *and* its latency is over [`LATENCY_SETPOINT`] times the target, and falls
//!   otherwise, so that in steady overload latency settles there whatever the overload
//!   factor and however many replicas share the upstream (they all read its latency);
//! - the **proportional** part acts on the in-flight count at the moment of each decision,
//!   not at the last tick: a step to 10x fills a queue in milliseconds, long before a 50 ms
//!   tick could react, and this term is what keeps the onset from overshooting;
//! - below capacity, `base` (latency over target, at most 1) says how close the upstream is
//!   to full: `p = 0.5` exactly at its latency target with no shedding effort needed
//!   (docs/pressure.md "Pressure").
//!
//! The reference is the operator's target, not a measured minimum RTT that could ratchet up
//! or drift (docs/pressure.md "Pressure controllers"). The no-load latency it also learns
//! ([`noload`]) only says whether there is a queue: an upstream that a deploy made slower
//! than the target does not shed on its own (Netflix Gradient2's "app-limited" guard in
//! another form), and a slow upstream under load is held at its real capacity. No
//! concurrency number is an input ([`ControllerConfig::max_inflight`] is a safety cap); an
//! upstream that reports its own utilisation ([`report`], `--load-report`) gives every
//! replica the same queue reading in place of its own.

mod constants;
mod controller;
pub mod costs;
mod gauge;
pub mod noload;
mod output;
pub mod probe;
pub mod report;
pub mod schedule;
#[cfg(test)]
mod tests;
pub mod tuning;

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

pub use constants::{
    CALM, CALM_TICKS, CAP_GAIN, COLD_SETPOINT, ENGAGED_EFFORT, ERROR_CLAMP, FEW_INFLIGHT_MARGIN,
    FEW_LATENCY_SETPOINT, FEW_SHARE, FULL_CONFIDENCE_RATE, INTEGRAL_GAIN, LATENCY_DECAY_TAU,
    LATENCY_SETPOINT, LATENCY_TAU, MAX_EFFORT, MIN_SHARE, PEAK_TAU, PROPORTIONAL_GAIN, RATE_TAU,
    REST_MARGIN, SCHEDULE_FLIPS, SCHEDULE_MAX_FLIPS, SCHEDULE_RUN, SETPOINT, STILL_OFFERED, TICK,
    UNWIND_GAIN,
};
pub use controller::{Controller, ControllerState};
pub use costs::CostSlot;
pub use gauge::{InflightGuard, PressureGauge, PressureView};
pub use output::{InflightWindow, LatencyWindow, Output};
pub use report::{MAX_REPORT, REPORT_STALE, ReportWindow};
pub use tuning::{Tuning, TuningError};

/// Pressure: a number in `[0, 1]`. 0.5 means the upstream is fully used with latency at its
/// target; 1.0 means overloaded beyond what shedding every lower-priority area can fix
/// (docs/pressure.md "Pressure").
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
pub struct Pressure(f64);

impl Pressure {
    /// No pressure.
    pub const ZERO: Pressure = Pressure(0.0);
    /// Full pressure: every sheddable event is shed.
    pub const FULL: Pressure = Pressure(1.0);
    /// The shed floor, 0.5: the upstream fully used with latency at its target. At and below
    /// it nothing is shed (docs/pressure.md "Pressure"); the shed curve, `Retry-After` and
    /// the shedding-seconds counter all start above it.
    pub const SHED_FLOOR: Pressure = Pressure(0.5);

    /// `Some` for a value in `[0, 1]` (NaN is `None`).
    pub fn new(value: f64) -> Option<Self> {
        (0.0..=1.0).contains(&value).then_some(Pressure(value))
    }

    /// Clamps into `[0, 1]`; NaN becomes 0 (shed nothing rather than everything).
    pub fn saturating(value: f64) -> Self {
        if value.is_nan() {
            Pressure(0.0)
        } else {
            Pressure(value.clamp(0.0, 1.0))
        }
    }

    /// The value in `[0, 1]`.
    pub const fn get(self) -> f64 {
        self.0
    }
}

/// Controller settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerConfig {
    /// A safety cap on this replica's in-flight requests (`--max-inflight`): in-flight over it
    /// reads as full and, beyond the proportional part's reference, sheds. Optional and never
    /// the reference that defines "full" (that is latency against the target and against the
    /// learned no-load latency, which every replica observes alike); `None`: no cap.
    pub max_inflight: Option<NonZeroU32>,
    /// The upstream latency (to response headers) considered "at target".
    pub latency_target: Duration,
    /// The controller's tuned values: [`Tuning::DEFAULT`] outside tests and benches
    /// ([`tuning`]).
    pub tuning: &'static Tuning,
}

/// A tick's `mean` folded into the estimate `value` smoothed over `tau` ([`LATENCY_TAU`] by
/// default) across the tick's `dt` seconds, or `mean` itself when the last arrival (`last`;
/// `None`: none yet) was `tau` or more before `now`: after a silence the decayed estimate
/// says nothing of the upstream, so it starts again from what it answers now. The
/// controller's latency and the upstream's load report ([`report`]) both follow this rule.
fn follow(
    value: f64,
    mean: f64,
    dt: f64,
    tau: Duration,
    last: Option<Instant>,
    now: Instant,
) -> f64 {
    if last.is_none_or(|seen| now.saturating_duration_since(seen) >= tau) {
        mean
    } else {
        value + alpha(dt, tau) * (mean - value)
    }
}

/// The step of an exponential smoothing with time constant `tau` over `dt` seconds:
/// `1 - e^(-dt / tau)`.
fn alpha(dt: f64, tau: Duration) -> f64 {
    1.0 - (-dt / tau.as_secs_f64()).exp()
}
