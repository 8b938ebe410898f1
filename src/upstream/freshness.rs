//! The freshness floor's budget on the request path: floor admissions in flight, and the
//! threshold that picks the devices silent longest while the budget binds
//! (docs/decision.md "Devices").

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::admission::{DeviceHistory, Floor};
use crate::clock::UnixMillis;

/// How far the threshold moves after a second: up after a second in which more candidates
/// silent long enough met a full budget than the floor admitted (demand above the threshold
/// exceeds what the budget serves), down (to 1 at least) after one in which none met a full
/// budget, and not at all in between. Doubling reaches the silence of the longest-silent
/// candidates in a few seconds (a threshold of 8 is eight `max_silence`s of silence) without a
/// queue or a sort; halving lets the floor open again as quickly once the budget has room.
const THRESHOLD_STEP: f64 = 2.0;
/// The highest threshold: 64 `max_silence`s of silence.
const MAX_THRESHOLD: f64 = 64.0;

/// Floor admissions in flight and the threshold of their budget.
#[derive(Debug)]
pub struct FreshnessBudget {
    inflight: AtomicU32,
    /// The second the threshold below is of, and the threshold (`f64` bits): read without
    /// the lock while the second has not changed. Written under `window`'s lock, the
    /// threshold first.
    second: AtomicI64,
    threshold: AtomicU64,
    window: Mutex<Window>,
}

/// One second of floor candidates.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The second (unix seconds) this window counts.
    second: i64,
    /// Floor admissions in it.
    admitted: u32,
    /// Candidates in it silent long enough for the threshold that met a full budget.
    full: u32,
    /// The threshold in force during it.
    threshold: f64,
}

impl Window {
    fn new(second: i64, threshold: f64) -> Window {
        Window {
            second,
            admitted: 0,
            full: 0,
            threshold,
        }
    }
}

impl Default for FreshnessBudget {
    fn default() -> Self {
        FreshnessBudget {
            inflight: AtomicU32::new(0),
            second: AtomicI64::new(i64::MIN),
            threshold: AtomicU64::new(1.0f64.to_bits()),
            window: Mutex::new(Window::new(i64::MIN, 1.0)),
        }
    }
}

impl FreshnessBudget {
    /// The floor a decision of a device's fix reads at `now`: `max_silence` (`None`: no
    /// floor, and nothing else is read), the floor admissions in flight, the budget
    /// ([`Floor::limit_of`] of `share` and `capacity`) and the threshold of this second.
    pub fn floor(
        &self,
        max_silence: Option<Duration>,
        share: f64,
        capacity: u32,
        now: UnixMillis,
    ) -> Floor {
        let Some(max) = max_silence else {
            return Floor::OFF;
        };
        Floor {
            inflight: self.inflight.load(Ordering::Relaxed),
            threshold: self.threshold(now),
            ..Floor::idle(max, share, capacity)
        }
    }

    /// The threshold in force at `now`: one load while the second has not changed, else the
    /// window rolled under its lock.
    fn threshold(&self, now: UnixMillis) -> f64 {
        let second = now.0.div_euclid(1000);
        if self.second.load(Ordering::Acquire) == second {
            return f64::from_bits(self.threshold.load(Ordering::Relaxed));
        }
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        self.roll(&mut w, second);
        w.threshold
    }

    /// Moves `w` to `second`, moving the threshold when a second has passed: by the closing
    /// second's counts ([`THRESHOLD_STEP`]), then down once for each second without
    /// candidates after it.
    fn roll(&self, w: &mut Window, second: i64) {
        if w.second != second {
            let mut threshold = w.threshold;
            let mut falls = 0;
            if w.second != i64::MIN {
                if w.full > w.admitted {
                    threshold = (threshold * THRESHOLD_STEP).min(MAX_THRESHOLD);
                } else if w.full == 0 {
                    falls += 1;
                }
                falls += (second - w.second - 1).clamp(0, 16);
            }
            for _ in 0..falls {
                threshold = (threshold / THRESHOLD_STEP).max(1.0);
            }
            *w = Window::new(second, threshold);
            self.threshold.store(threshold.to_bits(), Ordering::Relaxed);
            self.second.store(second, Ordering::Release);
        }
    }

    /// Notes a floor candidate of `history` denied at `now` with `floor` as it read it: one
    /// silent long enough for the threshold that met a full budget raises the next second's
    /// threshold. A candidate below the threshold moves nothing: counting it would raise the
    /// threshold every second the budget is busy, up to its highest, shutting the floor.
    pub fn denied(&self, floor: &Floor, history: &DeviceHistory, now: UnixMillis) {
        if floor.met_a_full_budget(history) {
            let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
            self.roll(&mut w, now.0.div_euclid(1000));
            w.full = w.full.saturating_add(1);
        }
    }

    /// Counts a floor admission at `now` in flight until the returned guard drops (when its
    /// response body ends, or it is refused before).
    pub fn start(self: &Arc<Self>, now: UnixMillis) -> FloorGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        self.roll(&mut w, now.0.div_euclid(1000));
        w.admitted = w.admitted.saturating_add(1);
        drop(w);
        FloorGuard {
            budget: Arc::clone(self),
        }
    }

    /// Floor admissions in flight now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }
}

/// One floor admission in flight; dropping it ends it.
#[derive(Debug)]
pub struct FloorGuard {
    budget: Arc<FreshnessBudget>,
}

impl Drop for FloorGuard {
    fn drop(&mut self) {
        self.budget.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Option<Duration> = Some(Duration::from_secs(5));

    fn silent_for(ms: i64) -> DeviceHistory {
        DeviceHistory {
            since_delivered_ms: Some(ms),
            ..DeviceHistory::new(0.5)
        }
    }

    #[test]
    fn a_full_budget_raises_the_threshold_and_room_lowers_it() {
        let b = Arc::new(FreshnessBudget::default());
        let at = |s: i64| UnixMillis(s * 1000 + 300);
        let f = b.floor(MAX, 0.1, 10, at(0));
        assert_eq!((f.limit, f.threshold), (1, 1.0));
        let held = b.start(at(0));
        b.denied(&b.floor(MAX, 0.1, 10, at(0)), &silent_for(7_000), at(0));
        let full = b.floor(MAX, 0.1, 10, at(0));
        assert_eq!(full.inflight, 1);
        b.denied(&full, &silent_for(6_000), at(0));
        assert_eq!(b.floor(MAX, 0.1, 10, at(1)).threshold, 2.0);
        b.denied(&b.floor(MAX, 0.1, 10, at(1)), &silent_for(11_000), at(1));
        assert_eq!(b.floor(MAX, 0.1, 10, at(2)).threshold, 4.0);
        drop(held);
        assert_eq!(b.inflight(), 0);
        // A second with room halves it; three seconds later it is back at 1.
        assert_eq!(b.floor(MAX, 0.1, 10, at(3)).threshold, 2.0);
        assert_eq!(b.floor(MAX, 0.1, 10, at(6)).threshold, 1.0);
    }

    /// A busy budget denies every candidate; only those silent long enough for the threshold
    /// raise it. Counting the rest ratcheted the threshold to its highest within seconds of
    /// a busy budget and shut the floor: in the demo at 4x with `max_silence` 6 s, 26 fixes
    /// admitted by the floor in 10 s and 1,000 denied.
    #[test]
    fn a_candidate_below_the_threshold_does_not_raise_it() {
        let b = Arc::new(FreshnessBudget::default());
        let at = |s: i64| UnixMillis(s * 1000 + 300);
        let _held = b.start(at(0));
        b.denied(&b.floor(MAX, 0.1, 10, at(0)), &silent_for(6_000), at(0));
        b.denied(&b.floor(MAX, 0.1, 10, at(0)), &silent_for(6_000), at(0));
        assert_eq!(b.floor(MAX, 0.1, 10, at(1)).threshold, 2.0);
        // At threshold 2, a device silent 6 s (under 10 s) is denied and moves nothing.
        for _ in 0..100 {
            b.denied(&b.floor(MAX, 0.1, 10, at(1)), &silent_for(6_000), at(1));
        }
        assert_eq!(b.floor(MAX, 0.1, 10, at(2)).threshold, 1.0);
    }

    /// A one-slot budget busy with admissions, as many candidates long enough meeting it
    /// full as it admits each second: the budget serves the demand above the threshold,
    /// which holds (raising it on any one denial swung it between T and 2T, and in the 2T
    /// seconds the slot sat idle while candidates just below 2T were turned away).
    #[test]
    fn a_busy_budget_serving_its_demand_keeps_the_threshold() {
        let b = Arc::new(FreshnessBudget::default());
        let at = |s: i64| UnixMillis(s * 1000 + 300);
        // Two seconds of more demand than room: up to 4.
        for s in 0..2 {
            let _held = b.start(at(s));
            for _ in 0..3 {
                b.denied(&b.floor(MAX, 0.1, 10, at(s)), &silent_for(60_000), at(s));
            }
        }
        assert_eq!(b.floor(MAX, 0.1, 10, at(2)).threshold, 4.0);
        for s in 2..10 {
            for _ in 0..5 {
                let _held = b.start(at(s));
                b.denied(&b.floor(MAX, 0.1, 10, at(s)), &silent_for(25_000), at(s));
            }
            assert_eq!(
                b.floor(MAX, 0.1, 10, at(s + 1)).threshold,
                4.0,
                "second {s}"
            );
        }
    }

    #[test]
    fn a_denial_below_the_budget_moves_nothing() {
        let b = FreshnessBudget::default();
        let f = b.floor(MAX, 0.5, 10, UnixMillis(0));
        b.denied(&f, &silent_for(60_000), UnixMillis(0));
        assert_eq!(b.floor(MAX, 0.5, 10, UnixMillis(1000)).threshold, 1.0);
        assert_eq!(b.floor(None, 0.5, 10, UnixMillis(1000)), Floor::OFF);
    }
}
