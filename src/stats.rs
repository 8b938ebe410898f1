//! The operational summary behind `GET /stats`: accepted, shed by reason, active and shed
//! rate, per stream and per class, over the last minute and since start (the "Shed Load
//! Pattern" source's statistics).
//!
//! Counts live outside the policy so a reload does not reset them: each stream name gets one
//! [`Counts`], looked up when a policy snapshot is built, never per request. The last minute
//! is a ring of 60 one-second buckets, each stamped with its second; a bucket from an older
//! second is reset by the first writer of the new one (counts may lose a few increments at a
//! second boundary under contention: this is a summary, the exact figures are the metrics).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::admission::ShedReason;
use crate::clock::UnixMillis;

const REASONS: usize = ShedReason::ALL.len();
/// Seconds in the short window.
pub const WINDOW_SECONDS: u64 = 60;

#[derive(Debug, Default)]
struct Bucket {
    second: AtomicU64,
    accepted: AtomicU64,
    shed: [AtomicU64; REASONS],
}

/// One stream's counts.
#[derive(Debug)]
pub struct Counts {
    accepted: AtomicU64,
    shed: [AtomicU64; REASONS],
    active: AtomicI64,
    ring: Vec<Bucket>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            accepted: AtomicU64::new(0),
            shed: Default::default(),
            active: AtomicI64::new(0),
            ring: (0..WINDOW_SECONDS).map(|_| Bucket::default()).collect(),
        }
    }
}

impl Counts {
    fn bucket(&self, now: UnixMillis) -> &Bucket {
        let second = u64::try_from(now.0 / 1000).unwrap_or(0);
        let b = &self.ring[(second % WINDOW_SECONDS) as usize];
        let seen = b.second.load(Ordering::Relaxed);
        if seen != second
            && b.second
                .compare_exchange(seen, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            b.accepted.store(0, Ordering::Relaxed);
            for s in &b.shed {
                s.store(0, Ordering::Relaxed);
            }
        }
        b
    }

    /// Counts a request forwarded to the upstream.
    pub fn accepted(&self, now: UnixMillis) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.bucket(now).accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a shed.
    pub fn shed(&self, reason: ShedReason, now: UnixMillis) {
        self.shed[reason.index()].fetch_add(1, Ordering::Relaxed);
        self.bucket(now).shed[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Marks a request active until the guard drops.
    pub fn start(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(Arc::clone(self))
    }

    fn window(&self, now: UnixMillis) -> Window {
        let second = u64::try_from(now.0 / 1000).unwrap_or(0);
        let mut w = Window::default();
        for b in &self.ring {
            let stamped = b.second.load(Ordering::Relaxed);
            // Buckets stamped in the future (the clock stepped back) are not the last minute.
            if stamped <= second && second - stamped < WINDOW_SECONDS {
                w.add(b.accepted.load(Ordering::Relaxed), &b.shed);
            }
        }
        w
    }

    fn total(&self) -> Window {
        let mut w = Window::default();
        w.add(self.accepted.load(Ordering::Relaxed), &self.shed);
        w
    }
}

/// An active request; dropping it ends it.
#[derive(Debug)]
pub struct ActiveGuard(Arc<Counts>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts over one period.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Window {
    /// Forwarded to the upstream.
    pub accepted: u64,
    /// Shed, by reason (`disabled`, `stale`, `superseded`, `pressure`, `budget`, `memory`).
    pub shed: std::collections::BTreeMap<&'static str, u64>,
    /// Shed in all.
    pub shed_total: u64,
    /// Of them, stale and superseded: worthless events (their successors came), answered as
    /// delivered.
    pub superseded: u64,
    /// The share of events that cost a delivery: `(shed_total - superseded) / (accepted +
    /// shed_total - superseded)`, 0 when nothing was seen.
    pub shed_rate: f64,
}

impl Window {
    fn add(&mut self, accepted: u64, shed: &[AtomicU64; REASONS]) {
        self.accepted += accepted;
        for (reason, n) in ShedReason::ALL.iter().zip(shed) {
            let n = n.load(Ordering::Relaxed);
            *self.shed.entry(reason.as_str()).or_default() += n;
            self.shed_total += n;
            if reason.superseded() {
                self.superseded += n;
            }
        }
        self.rate();
    }

    fn merge(&mut self, other: &Window) {
        self.accepted += other.accepted;
        for (k, v) in &other.shed {
            *self.shed.entry(k).or_default() += v;
        }
        self.shed_total += other.shed_total;
        self.superseded += other.superseded;
        self.rate();
    }

    fn rate(&mut self) {
        let lost = self.shed_total - self.superseded;
        let seen = self.accepted + lost;
        #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let rate = if seen == 0 {
            0.0
        } else {
            lost as f64 / seen as f64
        };
        self.shed_rate = rate;
    }
}

/// One row of the summary.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Row {
    /// Requests in flight now.
    pub active: i64,
    /// The last minute.
    pub last_minute: Window,
    /// Since start.
    pub since_start: Window,
}

/// All counts of one proxy.
#[derive(Debug, Default)]
pub struct Stats {
    streams: Mutex<HashMap<String, Arc<Counts>>>,
}

impl Stats {
    /// The counts of a stream name (created on first use; one per name for the process).
    pub fn counts(&self, stream: &str) -> Arc<Counts> {
        let mut map = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(map.entry(stream.to_owned()).or_default())
    }

    /// Per-stream rows, and per-class rows given each stream's class (streams no longer in
    /// the policy go to `class_of`'s answer for them, `None` skips them).
    pub fn report(
        &self,
        now: UnixMillis,
        class_of: impl Fn(&str) -> Option<&'static str>,
    ) -> (
        std::collections::BTreeMap<String, Row>,
        std::collections::BTreeMap<&'static str, Row>,
    ) {
        let map = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let mut streams = std::collections::BTreeMap::new();
        let mut classes: std::collections::BTreeMap<&'static str, Row> =
            std::collections::BTreeMap::new();
        for (name, counts) in map.iter() {
            let row = Row {
                active: counts.active.load(Ordering::Relaxed),
                last_minute: counts.window(now),
                since_start: counts.total(),
            };
            if let Some(class) = class_of(name) {
                let c = classes.entry(class).or_default();
                c.active += row.active;
                c.last_minute.merge(&row.last_minute);
                c.since_start.merge(&row.since_start);
            }
            streams.insert(name.clone(), row);
        }
        (streams, classes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_minute_forgets_older_seconds() {
        let c = Arc::new(Counts::default());
        let t0 = UnixMillis(1_780_000_000_000);
        c.accepted(t0);
        c.shed(ShedReason::Pressure, t0);
        c.shed(ShedReason::Stale, UnixMillis(t0.0 + 30_000));
        c.shed(ShedReason::Superseded, UnixMillis(t0.0 + 30_000));
        let w = c.window(UnixMillis(t0.0 + 30_000));
        assert_eq!((w.accepted, w.shed_total, w.superseded), (1, 3, 2));
        // Stale and superseded events cost no delivery: one shed of two that did.
        assert!((w.shed_rate - 0.5).abs() < 1e-9);
        let later = c.window(UnixMillis(t0.0 + 75_000));
        assert_eq!((later.accepted, later.shed_total), (0, 2));
        let total = c.total();
        assert_eq!((total.accepted, total.shed_total), (1, 3));
        let g = c.start();
        assert_eq!(c.active.load(Ordering::Relaxed), 1);
        drop(g);
        assert_eq!(c.active.load(Ordering::Relaxed), 0);
    }
}
