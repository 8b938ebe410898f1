//! What each stream costs the upstream, so that the loop reads the queue, not the mix
//! (Netflix/concurrency-limits#121, #33: one limit over endpoints of different latency).
//!
//! When streams cost the upstream different work (a position stored in 10 ms, a geofence
//! transition evaluated in 200 ms), the mean latency of what is admitted moves with the mix as
//! well as with the queue. Shedding the cheap, sheddable stream then raises that mean: with a
//! 95/5 mix of such streams at 1.2 times the upstream's capacity, the loop read its own
//! shedding as overload and shed every position for good, pressure stuck at 1.0. So latency
//! samples are normalised per stream, and completions counted as work:
//!
//! - In a queue all requests wait alike: a stream's mean latency in a tick is the queue's wait
//!   plus its own service time, so the difference between two streams' means is the
//!   difference of their service times, whatever the queue (`offset`, learned against an
//!   anchor stream over ticks where both answered, [`OFFSET_TAU`]).
//! - A sample is read as the wait plus the long-run mean service time: its stream's offset is
//!   taken off and the traffic-weighted mean offset (weights over [`WEIGHT_TAU`]) put back.
//!   The normalised latency moves with the queue only; in a steady mix it is the latency
//!   itself, so the latency target keeps its meaning (the mean latency of the usual mix).
//! - A completion counts as its stream's service time over the mean's (at the learned no-load
//!   latency `L0`, the long-run mean service time): Little's law then holds for work, so the
//!   in-flight count over what completions hold at `L0`, and the share of the upstream's
//!   concurrency, read the same queue whatever the mix.
//!
//! With one stream, or streams that cost alike, offsets are nil and nothing changes. Slots are
//! streams by name ([`CostSlot::of`], stable across policy reloads for the life of the
//! process); slot 0 is requests of no known stream.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::output::LatencyWindow;

/// Number of cost slots: 0 for no known stream, then one per stream name in the order names
/// are first seen, the last one shared by every name past it.
pub const SLOTS: usize = 64;

/// Time constant of a stream's learned offset, over ticks where it and the anchor answered:
/// long next to the queue's swings within a tick (a 200 ms request met the wait of 200 ms
/// earlier), short next to a deploy that changes what a stream costs.
pub const OFFSET_TAU: Duration = Duration::from_secs(10);
/// Time constant of the traffic weights the mean offset is taken over: long, so that the mix
/// the loop's own shedding leaves is not the mix latency is referred to.
pub const WEIGHT_TAU: Duration = Duration::from_secs(60);
/// Ticks a stream must have answered beside the anchor before its offset is used.
pub const WARM_TICKS: u32 = 20;

/// A stream's cost slot, for [`super::PressureGauge::record_latency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct CostSlot(pub u8);

impl CostSlot {
    /// Requests of no known stream.
    pub const NONE: CostSlot = CostSlot(0);

    /// The slot of the stream named `name`: the same for the life of the process, across
    /// policy reloads (a process-wide registry; called when a policy is compiled, never per
    /// request).
    pub fn of(name: &str) -> CostSlot {
        static NAMES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
        let mut names = NAMES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let at = names.iter().position(|n| n == name).unwrap_or_else(|| {
            names.push(name.to_owned());
            names.len() - 1
        });
        CostSlot(u8::try_from((at + 1).min(SLOTS - 1)).unwrap_or(u8::MAX))
    }

    /// The slot's index, `0..SLOTS`.
    pub fn index(self) -> usize {
        usize::from(self.0).min(SLOTS - 1)
    }
}

/// Per slot: the learned offset and the traffic weight.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Service time over the anchor's, seconds.
    offset: f64,
    /// Variance of one tick's difference from the anchor, seconds squared (smoothed as the
    /// offset is): with the smoothing's step, how uncertain the offset is.
    spread: f64,
    /// Ticks this slot answered beside the anchor (saturating).
    ticks: u32,
    /// Smoothed samples per second.
    weight: f64,
}

impl Slot {
    /// The variance of the learned offset: a running mean's while warming up, then an
    /// exponential average's (`alpha` its step: `alpha / (2 - alpha)` of one tick's).
    fn uncertainty(&self, alpha: f64) -> f64 {
        let n = f64::from(self.ticks.max(1));
        self.spread * (1.0 / n).max(alpha / (2.0 - alpha))
    }
}

/// How many standard errors a stream's offset must exceed before it is used, and by how much
/// it is shrunk (soft thresholding): streams that cost alike (offsets within their noise) are
/// left exactly as they are, so a policy of streams of one cost is read as before.
pub const SIGNIFICANCE: f64 = 3.0;

/// The learned costs ([`super::Controller`] holds one).
#[derive(Debug, Clone)]
pub struct Costs {
    slots: Box<[Slot; SLOTS]>,
    anchor: Option<usize>,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            slots: Box::new([Slot::default(); SLOTS]),
            anchor: None,
        }
    }
}

/// A tick's samples as the loop reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Folded {
    /// The samples, normalised: count, and the sum of their latencies less their streams'
    /// offsets plus the mean offset.
    pub latency: LatencyWindow,
    /// Completions counted as work: each its stream's service time over the mean's (at
    /// `l0`), equal to the count while costs are alike or unknown.
    pub work: f64,
}

impl Costs {
    /// Folds a tick's samples per slot (`windows[i]` for slot `i`), `dt` seconds long, with
    /// `l0` the learned no-load latency (seconds; `None` while unknown), and learns from them.
    #[expect(clippy::cast_precision_loss, reason = "tick counts and sums < 2^52")]
    pub fn fold(&mut self, windows: &[LatencyWindow], l0: Option<f64>, dt: f64) -> Folded {
        let a = |tau: Duration| super::alpha(dt, tau);
        let (a_offset, a_weight) = (a(OFFSET_TAU), a(WEIGHT_TAU));
        for (slot, w) in self.slots.iter_mut().zip(windows) {
            slot.weight += a_weight * (w.count as f64 / dt - slot.weight);
        }
        self.reanchor();
        let mean = |w: &LatencyWindow| w.sum_us as f64 / w.count as f64 / 1e6;
        if let Some(anchor) = self.anchor
            && let Some(aw) = windows.get(anchor).filter(|w| w.count > 0)
        {
            let base = mean(aw);
            for (i, w) in windows.iter().enumerate() {
                if i == anchor || w.count == 0 {
                    continue;
                }
                let slot = &mut self.slots[i];
                slot.ticks = slot.ticks.saturating_add(1);
                // A running mean while warming up, then smoothed.
                let k = (1.0 / f64::from(slot.ticks)).max(a_offset);
                let x = mean(w) - base;
                let d = x - slot.offset;
                slot.offset += k * d;
                slot.spread += k * (d * d * (1.0 - k) - slot.spread);
            }
        }
        let shifts = self.shifts(a_offset);
        if shifts.iter().all(|s| *s == 0.0) {
            // Streams that cost alike: the samples as they are.
            let count: u64 = windows.iter().map(|w| w.count).sum();
            return Folded {
                latency: LatencyWindow {
                    count,
                    sum_us: windows.iter().map(|w| w.sum_us).sum(),
                },
                work: count as f64,
            };
        }
        let mut folded = Folded::default();
        let mut sum = 0.0;
        for (w, &shift) in windows.iter().zip(shifts.iter()) {
            if w.count == 0 {
                continue;
            }
            folded.latency.count += w.count;
            sum += (w.sum_us as f64 / 1e6 - w.count as f64 * shift).max(0.0);
            let cost = match l0 {
                Some(l0) if l0 > 0.0 => ((l0 + shift) / l0).max(0.0),
                _ => 1.0,
            };
            folded.work += w.count as f64 * cost;
        }
        #[expect(clippy::cast_possible_truncation, reason = "microseconds of a tick")]
        #[expect(clippy::cast_sign_loss, reason = "clamped at 0")]
        {
            folded.latency.sum_us = (sum * 1e6).round() as u64;
        }
        folded
    }

    /// Each slot's service time over the traffic-weighted mean's, seconds, shrunk toward 0 by
    /// [`SIGNIFICANCE`] standard errors (exactly 0 within them); 0 for slots not warmed up.
    /// `alpha` is the offsets' smoothing step.
    fn shifts(&self, alpha: f64) -> [f64; SLOTS] {
        let mut shifts = [0.0; SLOTS];
        let total: f64 = self.slots.iter().map(|s| s.weight).sum();
        if total <= 0.0 {
            return shifts;
        }
        let used = |i: usize, s: &Slot| Some(i) == self.anchor || s.ticks >= WARM_TICKS;
        let (mut mean, mut mean_var) = (0.0, 0.0);
        for (i, s) in self.slots.iter().enumerate() {
            if used(i, s) {
                let share = s.weight / total;
                mean += share * s.offset;
                if Some(i) != self.anchor {
                    mean_var += share * share * s.uncertainty(alpha);
                }
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            if !used(i, s) {
                continue;
            }
            let own = if Some(i) == self.anchor {
                0.0
            } else {
                s.uncertainty(alpha)
            };
            let relative = s.offset - mean;
            let noise = SIGNIFICANCE * (own + mean_var).sqrt();
            shifts[i] = relative.signum() * (relative.abs() - noise).max(0.0);
        }
        shifts
    }

    /// Takes the slot with the most traffic as the anchor when there is none, or when another
    /// has twice the anchor's: offsets are re-expressed against it, so nothing learned is lost.
    fn reanchor(&mut self) {
        let Some((top, weight)) = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.weight))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .filter(|(_, w)| *w > 0.0)
        else {
            return;
        };
        match self.anchor {
            Some(a) if a == top || weight < 2.0 * self.slots[a].weight => {}
            Some(a) if self.slots[top].ticks >= WARM_TICKS => {
                let shift = self.slots[top].offset;
                for s in self.slots.iter_mut() {
                    s.offset -= shift;
                }
                self.slots[top].offset = 0.0;
                self.slots[a].ticks = self.slots[a].ticks.max(WARM_TICKS);
                self.anchor = Some(top);
            }
            Some(_) => {}
            None => self.anchor = Some(top),
        }
    }

    /// The learned offsets in use, milliseconds over the traffic-weighted mean (for `GET
    /// /pressure`): `(slot, offset)` for slots whose offset is significant.
    pub fn offsets_ms(&self) -> Vec<(usize, f64)> {
        let alpha = super::alpha(super::TICK.as_secs_f64(), OFFSET_TAU);
        self.shifts(alpha)
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != 0.0)
            .map(|(i, s)| (i, s * 1e3))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(count: u64, mean_ms: f64) -> LatencyWindow {
        #[expect(clippy::cast_precision_loss, reason = "small")]
        #[expect(clippy::cast_possible_truncation, reason = "small")]
        #[expect(clippy::cast_sign_loss, reason = "positive")]
        LatencyWindow {
            count,
            sum_us: (count as f64 * mean_ms * 1e3) as u64,
        }
    }

    /// Two streams of 10 and 200 ms of work behind one queue: once learned, a tick's
    /// normalised mean is the wait plus the usual mix's mean service, however the mix of the
    /// tick; and a completion of the heavy stream is twenty of the light one's work.
    #[test]
    fn the_mix_leaves_the_normalised_latency_and_work_follows_cost() {
        let mut c = Costs::default();
        let dt = 0.05;
        let mut windows = [LatencyWindow::default(); SLOTS];
        // 95/5 for two minutes, no queue: light 10 ms, heavy 200 ms.
        for _ in 0..2400 {
            windows[1] = window(19, 10.0);
            windows[2] = window(1, 200.0);
            c.fold(&windows, Some(0.0195), dt);
        }
        // A tick of heavy requests only, behind a 50 ms wait: read as 50 ms plus the mean
        // service of the usual mix (19.5 ms), not 250 ms.
        windows[1] = LatencyWindow::default();
        windows[2] = window(4, 250.0);
        let f = c.fold(&windows, Some(0.0195), dt);
        #[expect(clippy::cast_precision_loss, reason = "small")]
        let mean_ms = f.latency.sum_us as f64 / f.latency.count as f64 / 1e3;
        assert!((mean_ms - 69.5).abs() < 1.0, "{mean_ms}");
        assert!((f.work - 4.0 * 200.0 / 19.5).abs() < 0.5, "{}", f.work);
        // One stream: nothing changes.
        let mut one = Costs::default();
        let mut w = [LatencyWindow::default(); SLOTS];
        w[3] = window(10, 42.0);
        let f = one.fold(&w, Some(0.02), dt);
        assert_eq!(f.latency, w[3]);
        assert!((f.work - 10.0).abs() < 1e-9);
    }

    #[test]
    fn slots_are_stable_per_name() {
        let a = CostSlot::of("costs-test.a");
        let b = CostSlot::of("costs-test.b");
        assert_ne!(a, b);
        assert_eq!(CostSlot::of("costs-test.a"), a);
        assert_ne!(a, CostSlot::NONE);
    }
}
