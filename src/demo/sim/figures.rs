//! A scenario's figures over a window of its seconds.

use super::scenario::Second;

/// A scenario's figures over a window of its seconds (the controller's targets in docs/pressure.md, measured).
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Completed requests per second over the window, as a share of capacity (0.0–1.0+).
    pub goodput: f64,
    /// Median latency of admitted requests that completed, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile of the same, milliseconds.
    pub p99_ms: f64,
    /// Coefficient of variation of the per-second admitted count (0.0 = flat).
    pub cv: f64,
    /// Shed share of sheddable events per rank band ([`BANDS`](super::BANDS)), 0.0–1.0.
    pub shed_by_band: [f64; 4],
    /// Shed share of all sheddable events, 0.0–1.0.
    pub shed: f64,
    /// Never-shed events completed over offered, whole run, 0.0–1.0.
    pub never_delivered: f64,
}

impl Figures {
    /// Figures of `seconds[window]` against an upstream of `capacity` requests per second.
    #[expect(clippy::cast_precision_loss, reason = "counts of a run, below 2^52")]
    pub fn of(seconds: &[Second], window: std::ops::Range<usize>, capacity: f64) -> Figures {
        let w = &seconds[window];
        let n = w.len().max(1) as f64;
        let goodput = w.iter().map(|s| s.goodput as f64).sum::<f64>() / n / capacity;
        let admitted: Vec<f64> = w.iter().map(|s| s.admitted as f64).collect();
        let mean = admitted.iter().sum::<f64>() / n;
        let var = admitted.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n;
        let mut lat: Vec<f64> = w
            .iter()
            .flat_map(|s| s.latencies_ms.iter().copied())
            .collect();
        lat.sort_by(f64::total_cmp);
        #[expect(clippy::cast_possible_truncation, reason = "an index in [0, len - 1]")]
        #[expect(clippy::cast_sign_loss, reason = "an index in [0, len - 1]")]
        let pct = |q: f64| {
            lat.get(((lat.len().saturating_sub(1)) as f64 * q) as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let share = |shed: u64, of: u64| {
            if of == 0 {
                0.0
            } else {
                shed as f64 / of as f64
            }
        };
        let mut shed_by_band = [0.0; 4];
        for (b, out) in shed_by_band.iter_mut().enumerate() {
            let (shed, of) = w.iter().fold((0, 0), |(s, o), x| {
                (s + x.shed_by_band[b], o + x.offered_by_band[b])
            });
            *out = share(shed, of);
        }
        let (shed, of) = w.iter().fold((0, 0), |(s, o), x| {
            (
                s + x.shed_by_band.iter().sum::<u64>(),
                o + x.offered_by_band.iter().sum::<u64>(),
            )
        });
        let (delivered, offered) = seconds.iter().fold((0, 0), |(d, o), x| {
            (d + x.never_delivered, o + x.never_offered)
        });
        Figures {
            goodput,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
            shed_by_band,
            shed: share(shed, of),
            never_delivered: if offered == 0 {
                1.0
            } else {
                share(delivered, offered)
            },
        }
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "goodput {:.1}% p50 {:.1} ms p99 {:.1} ms cv {:.3} shed {:.1}% by band {:.1?} never {:.1}%",
            self.goodput * 100.0,
            self.p50_ms,
            self.p99_ms,
            self.cv,
            self.shed * 100.0,
            self.shed_by_band.map(|s| s * 100.0),
            self.never_delivered * 100.0
        )
    }
}

/// Seconds from the end of an overload (second `overload_end` of `seconds`) until pressure is
/// at most 0.5 (nothing shed) for good: the end of the first second from which every second
/// ends at or below 0.5 (1 = within the first second). At or below, not strictly below: the
/// scenarios return to 0.8x, where random queueing now and then takes latency to its target,
/// which is 0.5. The range is at most 3. Panics if `overload_end` is past the end.
pub fn recovery_seconds(seconds: &[Second], overload_end: usize) -> usize {
    seconds[overload_end..]
        .iter()
        .rposition(|s| s.end_pressure > 0.5)
        .map_or(0, |i| i + 1)
        + 1
}
