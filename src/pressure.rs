//! The pressure controller: upstream in-flight count and latency in, pressure in `[0, 1]`
//! out (PRODUCT.md "Pressure").
//!
//! [`Controller`] is the pure state machine (time is an argument); [`PressureGauge`] is the
//! shared, lock-free front the request path uses, ticked by one task.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::admission::Pressure;

/// Controller settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    /// The upstream's comfortable concurrency: in-flight requests at which it is fully used.
    pub max_inflight: NonZeroU32,
    /// The upstream latency (to response headers) considered "at target".
    pub latency_target: Duration,
}

/// Smoothing time constant of the utilisation signal. In-flight is a direct measure, but at
/// 80% load random arrivals queue now and then: 400 ms keeps that noise under the floor
/// while a step in load shows within a second (tuned on the scenario tests: 250 ms shed 3.6%
/// at 0.8x, 400 ms 1.9%, with the same goodput under overload).
pub const UTILISATION_TAU: Duration = Duration::from_millis(400);
/// Smoothing time constant of the latency signal.
pub const LATENCY_TAU: Duration = Duration::from_millis(500);
/// Time constant with which the latency estimate decays while no samples arrive. It keeps the
/// controller from freezing: when everything sheddable is shed and the upstream idles, no
/// sample replaces the last high one (FIELD-NOTES "Pressure controllers").
pub const LATENCY_DECAY_TAU: Duration = Duration::from_secs(1);
/// Sample rate (per second) at and above which the latency signal gets full weight. Below
/// it the weight falls linearly: a handful of slow requests is noise, not overload
/// (PRODUCT.md "Pressure": "at very low request volume the estimate is noise").
pub const FULL_CONFIDENCE_RATE: f64 = 20.0;
/// How often [`PressureGauge::tick`] should run.
pub const TICK: Duration = Duration::from_millis(50);

/// Latency samples gathered between two ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencyWindow {
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples, microseconds.
    pub sum_us: u64,
}

/// The pure controller.
///
/// State: `u`, the smoothed utilisation; `l`, the smoothed latency ratio; `rate`, the
/// smoothed sample rate. On each update at time `now`, `dt` after the previous one, with
/// `a(τ) = 1 - exp(-dt/τ)`:
///
/// ```text
/// u    += a(UTILISATION_TAU) * (inflight / max_inflight - u)
/// l    += a(LATENCY_TAU)     * (mean_latency / latency_target - l)   if samples arrived
/// l    *= exp(-dt / LATENCY_DECAY_TAU)                               otherwise
/// rate += a(LATENCY_TAU)     * (count / dt - rate)
/// x     = max(u, l * min(1, rate / FULL_CONFIDENCE_RATE))            the load index
/// p     = 1 - 2^(-x)
/// ```
///
/// `x = 1` is "upstream fully used, latency at target", so `p = 0.5` there, as PRODUCT.md
/// requires; `x = 2` gives 0.75, `x = 3` 0.875; `p` approaches 1 smoothly and never jumps.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ControllerConfig,
    u: f64,
    l: f64,
    rate: f64,
    last: Option<Instant>,
    pressure: f64,
}

/// The controller's view, for `GET /pressure`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ControllerState {
    /// Computed pressure, 0.0–1.0.
    pub computed: f64,
    /// Smoothed in-flight utilisation (in-flight / max_inflight).
    pub utilisation: f64,
    /// Smoothed latency ratio (latency / target), before confidence weighting.
    pub latency_ratio: f64,
    /// Smoothed latency samples per second.
    pub sample_rate: f64,
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
            last: None,
            pressure: 0.0,
        }
    }

    /// Folds in the current in-flight count and the latency samples since the last update,
    /// returning the new pressure.
    pub fn update(&mut self, now: Instant, inflight: u32, window: LatencyWindow) -> f64 {
        let dt = match self.last {
            Some(last) => now.saturating_duration_since(last).as_secs_f64(),
            None => TICK.as_secs_f64(),
        };
        self.last = Some(now);
        if dt <= 0.0 {
            return self.pressure;
        }
        let alpha = |tau: Duration| 1.0 - (-dt / tau.as_secs_f64()).exp();
        let target = f64::from(self.config.max_inflight.get());
        self.u += alpha(UTILISATION_TAU) * (f64::from(inflight) / target - self.u);
        #[allow(clippy::cast_precision_loss)]
        if window.count > 0 {
            let mean = window.sum_us as f64 / window.count as f64 / 1e6;
            let ratio = mean / self.config.latency_target.as_secs_f64();
            self.l += alpha(LATENCY_TAU) * (ratio - self.l);
        } else {
            self.l *= (-dt / LATENCY_DECAY_TAU.as_secs_f64()).exp();
        }
        #[allow(clippy::cast_precision_loss)]
        let instant_rate = window.count as f64 / dt;
        self.rate += alpha(LATENCY_TAU) * (instant_rate - self.rate);
        let confidence = (self.rate / FULL_CONFIDENCE_RATE).min(1.0);
        let x = self.u.max(self.l * confidence).max(0.0);
        self.pressure = 1.0 - (-x).exp2();
        self.pressure
    }

    /// The last computed pressure.
    pub fn pressure(&self) -> f64 {
        self.pressure
    }

    /// The controller's state.
    pub fn state(&self) -> ControllerState {
        ControllerState {
            computed: self.pressure,
            utilisation: self.u,
            latency_ratio: self.l,
            sample_rate: self.rate,
            max_inflight: self.config.max_inflight.get(),
            latency_target_ms: self.config.latency_target.as_secs_f64() * 1e3,
        }
    }
}

/// Bits of an unpinned [`PressureGauge::pinned`] value (NaN never equals a valid pin).
const UNPINNED: u64 = f64::NAN.to_bits();

/// The shared pressure: the request path reads it and feeds it lock-free; one task ticks it.
#[derive(Debug)]
pub struct PressureGauge {
    controller: Mutex<Controller>,
    inflight: AtomicU32,
    sum_us: AtomicU64,
    count: AtomicU64,
    current: AtomicU64,
    pinned: AtomicU64,
}

/// `GET /pressure`'s answer.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PressureView {
    /// The pressure decisions use now: the pin if pinned, else the computed value.
    pub value: f64,
    /// Whether an operator pinned it.
    pub pinned: bool,
    /// Requests in flight now.
    pub inflight: u32,
    /// The controller's inputs and state.
    pub controller: ControllerState,
}

impl PressureGauge {
    /// A gauge at rest.
    pub fn new(config: ControllerConfig) -> Self {
        PressureGauge {
            controller: Mutex::new(Controller::new(config)),
            inflight: AtomicU32::new(0),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
            current: AtomicU64::new(0f64.to_bits()),
            pinned: AtomicU64::new(UNPINNED),
        }
    }

    /// The pressure decisions use now.
    pub fn pressure(&self) -> Pressure {
        let pinned = f64::from_bits(self.pinned.load(Ordering::Relaxed));
        if pinned.is_nan() {
            Pressure::saturating(f64::from_bits(self.current.load(Ordering::Relaxed)))
        } else {
            Pressure::saturating(pinned)
        }
    }

    /// Pins pressure (drills, tests); `None` unpins.
    pub fn pin(&self, value: Option<Pressure>) {
        let bits = value.map_or(UNPINNED, |p| p.get().to_bits());
        self.pinned.store(bits, Ordering::Relaxed);
    }

    /// Whether pressure is pinned.
    pub fn is_pinned(&self) -> bool {
        !f64::from_bits(self.pinned.load(Ordering::Relaxed)).is_nan()
    }

    /// Counts a request as in flight until the returned guard drops.
    pub fn start(self: &std::sync::Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            gauge: std::sync::Arc::clone(self),
        }
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Records an upstream latency sample (a response the upstream itself gave).
    pub fn record_latency(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Updates the controller with the samples since the last tick; returns the new
    /// computed pressure.
    pub fn tick(&self, now: Instant) -> f64 {
        let window = LatencyWindow {
            count: self.count.swap(0, Ordering::Relaxed),
            sum_us: self.sum_us.swap(0, Ordering::Relaxed),
        };
        let mut c = self.controller.lock().unwrap_or_else(|p| p.into_inner());
        let p = c.update(now, self.inflight(), window);
        self.current.store(p.to_bits(), Ordering::Relaxed);
        p
    }

    /// Everything `GET /pressure` shows.
    pub fn view(&self) -> PressureView {
        let c = self.controller.lock().unwrap_or_else(|p| p.into_inner());
        PressureView {
            value: self.pressure().get(),
            pinned: self.is_pinned(),
            inflight: self.inflight(),
            controller: c.state(),
        }
    }
}

/// One in-flight request; dropping it ends it.
#[derive(Debug)]
pub struct InflightGuard {
    gauge: std::sync::Arc<PressureGauge>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.gauge.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller() -> Controller {
        Controller::new(ControllerConfig {
            max_inflight: NonZeroU32::new(10).unwrap(),
            latency_target: Duration::from_millis(50),
        })
    }

    fn run(
        c: &mut Controller,
        start: Instant,
        secs: f64,
        inflight: u32,
        per_tick: LatencyWindow,
    ) -> Instant {
        let mut now = start;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ticks = (secs / TICK.as_secs_f64()) as u32;
        for _ in 0..ticks {
            now += TICK;
            c.update(now, inflight, per_tick);
        }
        now
    }

    #[tokio::test(start_paused = true)]
    async fn half_at_full_use_and_target_latency() {
        let mut c = controller();
        // 10 in flight of 10; 50 samples/s at exactly the 50 ms target.
        let w = LatencyWindow {
            count: 5,
            sum_us: 5 * 50_000,
        };
        run(&mut c, Instant::now(), 5.0, 10, w);
        assert!((c.pressure() - 0.5).abs() < 0.01, "{}", c.pressure());
    }

    #[tokio::test(start_paused = true)]
    async fn decays_when_samples_stop() {
        let mut c = controller();
        let slow = LatencyWindow {
            count: 5,
            sum_us: 5 * 400_000,
        };
        let now = run(&mut c, Instant::now(), 3.0, 10, slow);
        assert!(c.pressure() > 0.9, "{}", c.pressure());
        // Everything shed: nothing in flight, no samples.
        run(&mut c, now, 3.0, 0, LatencyWindow::default());
        assert!(c.pressure() < 0.5, "{}", c.pressure());
    }

    #[tokio::test(start_paused = true)]
    async fn few_slow_samples_are_noise() {
        let mut c = controller();
        // One very slow request per second, nothing else in flight.
        let mut now = Instant::now();
        for _ in 0..10 {
            now = run(&mut c, now, 0.95, 0, LatencyWindow::default());
            now += TICK;
            c.update(
                now,
                1,
                LatencyWindow {
                    count: 1,
                    sum_us: 500_000,
                },
            );
        }
        assert!(c.pressure() <= 0.5, "{}", c.pressure());
    }
}
