//! The gauge: the shared, lock-free front the request path reads and feeds, ticked by one
//! task.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::time::Instant;

use super::controller::{Controller, ControllerState};
use super::costs::{CostSlot, SLOTS};
use super::output::{InflightWindow, LatencyWindow, Output};
use super::report::{MAX_REPORT, ReportWindow};
use super::{ControllerConfig, Pressure};

/// Bits of a packed latency window's sum (microseconds; the count is in the bits above):
/// 2^44 µs is 203 days of summed latency per tick, 2^20 samples per tick 20 million per
/// second. One `AtomicU64` holds both, so a tick never reads a count without its sum.
pub(super) const LATENCY_SUM_BITS: u32 = 44;
/// Bits of a packed in-flight window's sum (the count is in the 24 bits above).
const OBSERVED_SUM_BITS: u32 = 40;

pub(super) fn unpack(word: u64, sum_bits: u32) -> (u64, u64) {
    (word >> sum_bits, word & ((1 << sum_bits) - 1))
}

/// Bits of an unpinned [`PressureGauge::pinned`] value (NaN never equals a valid pin).
const UNPINNED: u64 = f64::NAN.to_bits();

/// The shared pressure: the request path reads it and feeds it lock-free; one task ticks it.
#[derive(Debug)]
pub struct PressureGauge {
    controller: Mutex<Controller>,
    /// Requests in flight: shared with the gauge this one succeeds, if any
    /// ([`PressureGauge::succeeding`]), and with each request's [`InflightGuard`].
    inflight: Arc<AtomicU32>,
    /// Packed [`LatencyWindow`] (see [`LATENCY_SUM_BITS`]) of every sample: its count is
    /// what decisions between two ticks read.
    latency: AtomicU64,
    /// The same per cost slot ([`CostSlot`]), for the tick.
    by_slot: Box<[AtomicU64]>,
    /// Packed [`InflightWindow`] (see [`OBSERVED_SUM_BITS`]): the arrivals since the last
    /// tick and the in-flight counts they saw ([`PressureGauge::arrive`]).
    observed: AtomicU64,
    /// Arrivals folded into the controller by past ticks; written under `controller`'s lock
    /// with the swap of `observed`, so that [`PressureGauge::arrivals`] never counts one twice.
    ticked_arrivals: AtomicU64,
    /// Packed [`ReportWindow`] (the layout of `latency`, millionths for microseconds).
    reports: AtomicU64,
    output: ArcSwap<Output>,
    /// [`Output::capacity`] of `output`, kept beside it so that a request that checks class
    /// budgets reads one atomic, not the output a second time.
    capacity: AtomicU32,
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
        let controller = Controller::new(config);
        let output = controller.output();
        PressureGauge {
            controller: Mutex::new(controller),
            inflight: Arc::new(AtomicU32::new(0)),
            latency: AtomicU64::new(0),
            by_slot: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            observed: AtomicU64::new(0),
            ticked_arrivals: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            output: ArcSwap::from_pointee(output),
            capacity: AtomicU32::new(output.capacity()),
            pinned: AtomicU64::new(UNPINNED),
        }
    }

    /// A gauge of `config` at rest, as [`PressureGauge::new`], that counts the requests in
    /// flight `old` counts: the two share one count, so a request started under `old`
    /// stays counted here, where its in-flight cap and class budgets read it, and ends on
    /// it. Nothing else of `old` is taken (what it learned, its pin, its samples since its
    /// last tick). For a reload that gives an upstream a new controller.
    pub fn succeeding(config: ControllerConfig, old: &PressureGauge) -> Self {
        PressureGauge {
            inflight: Arc::clone(&old.inflight),
            ..PressureGauge::new(config)
        }
    }

    /// The controller's output at `inflight`, with the latency samples since the last tick
    /// (their count, and the time since the tick: one clock read).
    fn computed(&self, inflight: u32) -> f64 {
        let (completed, _) = unpack(self.latency.load(Ordering::Relaxed), LATENCY_SUM_BITS);
        let out = self.output.load();
        let since = out.at.map_or(Duration::ZERO, |at| {
            Instant::now().saturating_duration_since(at)
        });
        out.pressure_at(inflight, completed, since)
    }

    fn pin_value(&self) -> Option<Pressure> {
        let pinned = f64::from_bits(self.pinned.load(Ordering::Relaxed));
        (!pinned.is_nan()).then(|| Pressure::saturating(pinned))
    }

    /// The pressure now: the pin if pinned, else the controller's output at the current
    /// in-flight count. For reports; decisions use [`PressureGauge::admission_pressure`].
    pub fn pressure(&self) -> Pressure {
        self.pin_value()
            .unwrap_or_else(|| Pressure::saturating(self.computed(self.inflight())))
    }

    /// Observes one arrival: a request that reaches its admission decision (a sheddable
    /// body read) or streams through unread (a `never` or unknown stream). Records the
    /// in-flight count it saw, for the next tick's mean and the offered rate (the
    /// controller's still-offered test and the cold probe read it, docs/pressure.md
    /// "Samples"). Called once per request, by the live path and the simulator alike:
    /// [`PressureGauge::admission_pressure`] calls it, and a request that needs no pressure
    /// calls it alone. Returns that in-flight count.
    pub fn arrive(&self) -> u32 {
        let inflight = self.inflight();
        let sum = u64::from(inflight).min((1 << OBSERVED_SUM_BITS) - 1);
        self.observed
            .fetch_add((1 << OBSERVED_SUM_BITS) | sum, Ordering::Relaxed);
        inflight
    }

    /// Observes one arrival ([`PressureGauge::arrive`]) and returns the pressure its
    /// admission decision uses: as [`PressureGauge::pressure`], at the in-flight count the
    /// arrival saw. Call it once per request: a second call counts a second arrival.
    pub fn admission_pressure(&self) -> Pressure {
        let inflight = self.arrive();
        self.pin_value()
            .unwrap_or_else(|| Pressure::saturating(self.computed(inflight)))
    }

    /// Arrivals observed since the gauge was made (ticked or not): the count the offered
    /// rate is made of, for tests and reports.
    pub fn arrivals(&self) -> u64 {
        let _c = self.controller.lock().unwrap_or_else(|p| p.into_inner());
        let (pending, _) = unpack(self.observed.load(Ordering::Relaxed), OBSERVED_SUM_BITS);
        self.ticked_arrivals.load(Ordering::Relaxed) + pending
    }

    /// Pins pressure (drills, tests); `None` unpins.
    pub fn pin(&self, value: Option<Pressure>) {
        let bits = value.map_or(UNPINNED, |p| p.get().to_bits());
        self.pinned.store(bits, Ordering::Relaxed);
    }

    /// Whether pressure is pinned.
    pub fn is_pinned(&self) -> bool {
        self.pin_value().is_some()
    }

    /// Counts a request as in flight until the returned guard drops.
    pub fn start(&self) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            inflight: Arc::clone(&self.inflight),
        }
    }

    /// The in-flight count class budgets share ([`Output::capacity`]) as of the last tick.
    pub fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Records an upstream latency sample of a request of the stream in `slot` (an answer
    /// that served it, docs/pressure.md "Samples"; or a timeout, as a sample as slow as the
    /// timeout).
    pub fn record_latency(&self, slot: CostSlot, latency: Duration) {
        // One sample is capped at 2^36 µs (19 hours), far above any timeout, so that 256 of
        // them in one tick still fit the window's 44-bit sum without reaching the count.
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .min((1 << 36) - 1);
        let packed = (1 << LATENCY_SUM_BITS) | us;
        self.latency.fetch_add(packed, Ordering::Relaxed);
        self.by_slot[slot.index()].fetch_add(packed, Ordering::Relaxed);
    }

    /// Records the utilisation the upstream reported with an answer (in-flight over its
    /// concurrency, [`super::report`]), read as at most [`MAX_REPORT`]; negative or
    /// non-finite values are not reports.
    pub fn record_load_report(&self, utilisation: f64) {
        if !utilisation.is_finite() || utilisation < 0.0 {
            return;
        }
        #[expect(clippy::cast_possible_truncation, reason = "at most 16 million")]
        #[expect(clippy::cast_sign_loss, reason = "not negative here")]
        let millionths = (utilisation.min(MAX_REPORT) * 1e6) as u64;
        self.reports
            .fetch_add((1 << LATENCY_SUM_BITS) | millionths, Ordering::Relaxed);
    }

    /// Updates the controller with what was observed since the last tick; returns the
    /// pressure at the current in-flight count.
    pub fn tick(&self, now: Instant) -> f64 {
        self.latency.store(0, Ordering::Relaxed);
        let windows: [LatencyWindow; SLOTS] = std::array::from_fn(|i| {
            let (count, sum_us) =
                unpack(self.by_slot[i].swap(0, Ordering::Relaxed), LATENCY_SUM_BITS);
            LatencyWindow { count, sum_us }
        });
        let (count, sum_millionths) =
            unpack(self.reports.swap(0, Ordering::Relaxed), LATENCY_SUM_BITS);
        let reports = ReportWindow {
            count,
            sum_millionths,
        };
        let inflight = self.inflight();
        let mut c = self.controller.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, sum) = unpack(self.observed.swap(0, Ordering::Relaxed), OBSERVED_SUM_BITS);
        self.ticked_arrivals.fetch_add(seen, Ordering::Relaxed);
        let observed = InflightWindow { count: seen, sum };
        let out = c.update_slots(now, inflight, observed, &windows, reports);
        self.output.store(Arc::new(out));
        self.capacity.store(out.capacity(), Ordering::Relaxed);
        out.pressure(inflight)
    }

    /// Everything `GET /pressure` shows.
    pub fn view(&self) -> PressureView {
        let inflight = self.inflight();
        let c = self.controller.lock().unwrap_or_else(|p| p.into_inner());
        PressureView {
            value: self.pressure().get(),
            pinned: self.is_pinned(),
            inflight,
            controller: c.state(inflight),
        }
    }
}

/// One in-flight request; dropping it ends it (on the count it started on, which the gauges
/// that succeed its own share).
#[derive(Debug)]
pub struct InflightGuard {
    inflight: Arc<AtomicU32>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn config(target_ms: u64) -> ControllerConfig {
        ControllerConfig {
            max_inflight: NonZeroU32::new(2),
            latency_target: Duration::from_millis(target_ms),
            tuning: &super::super::Tuning::DEFAULT,
        }
    }

    /// A successor counts the requests in flight under the gauge it succeeds, at its cap as
    /// they are; each request ends once, on the one count, whichever gauge it started on.
    #[test]
    fn a_successor_counts_the_requests_in_flight_under_the_old_gauge() {
        let old = PressureGauge::new(config(100));
        let held = [old.start(), old.start()];
        let at_cap = old.pressure();
        let new = PressureGauge::succeeding(config(80), &old);
        assert_eq!((new.inflight(), new.capacity()), (2, 2));
        assert_eq!(new.pressure(), at_cap, "the cap's term sees both");
        let third = new.start();
        assert_eq!((old.inflight(), new.inflight()), (3, 3));
        drop(held);
        assert_eq!(new.inflight(), 1);
        drop(third);
        assert_eq!((old.inflight(), new.inflight()), (0, 0));
        assert!(
            !new.is_pinned() && new.arrivals() == 0,
            "nothing else carried"
        );
    }
}
