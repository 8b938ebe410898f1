//! Clock skew: the offset between the local wall clock and the upstream's, estimated from
//! the `Date` header every HTTP response carries (RFC 9110 section 6.6.1: an origin server
//! with a clock sends it in every 2xx, 3xx and 4xx response), so that one bad clock on the
//! proxy's host cannot turn the stale rule into silent loss.
//!
//! - **Samples.** `Date` has one-second resolution and is truncated, so one response says the
//!   upstream's clock is in `[d, d + 1 s)` of the local one, where `d` is the `Date` minus the
//!   local time the response arrived. At most one sample per second of local time is taken;
//!   a response without `Date` costs one header lookup.
//! - **Estimate.** The median of the last [`WINDOW`] samples plus half a second: robust to a
//!   few responses delayed in a queue, an upstream replica with a bad clock, or a `Date`
//!   cached by a CDN. Nothing is estimated before [`MIN_SAMPLES`] samples. When
//!   [`RESTART_AFTER`] samples in a row disagree with the estimate by more than [`BOUND`] (a
//!   clock stepped by NTP), the window restarts from them, so the estimate follows within
//!   seconds instead of waiting for the median to move.
//! - **Correction.** Ages are judged against the local clock plus the estimate only when it
//!   is beyond [`BOUND`] (5 s, five times the header's resolution): smaller offsets are noise
//!   and the local clock stays authoritative. Beyond [`IMPLAUSIBLE`] (24 h, the limit past
//!   which event times are not believed either) neither clock is believable, and nothing is
//!   corrected.
//! - **Probes.** A proxy whose clock is ahead answers every fresh event stale and forwards
//!   nothing, so it would never see a `Date` to learn from. While stale answers are given
//!   and no sample is recent, it probes the upstream with `OPTIONS *` (RFC 9110 section
//!   9.3.7, the server-wide "ping"): at most one per [`PROBE_INTERVAL_FAST`] while no estimate
//!   exists or a correction is engaged (both are when answering stale may be wrong), else one
//!   per [`PROBE_INTERVAL`]. So a host clock 90 s fast answers fresh events stale for about
//!   [`MIN_SAMPLES`] seconds after start, and a corrected clock that NTP fixes is released
//!   within about [`RESTART_AFTER`] seconds.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use super::UnixMillis;

/// Samples the estimate is the median of.
pub const WINDOW: usize = 31;
/// Samples needed before an estimate exists.
pub const MIN_SAMPLES: usize = 3;
/// Samples in a row that disagree with the estimate by more than [`BOUND`] and restart the
/// window: more than a few responses from one upstream replica with a bad clock.
pub const RESTART_AFTER: usize = 5;
/// Offsets up to this, milliseconds, are not corrected (5 s).
pub const BOUND: i64 = 5_000;
/// Offsets beyond this, milliseconds, are not believed (24 h).
pub const IMPLAUSIBLE: i64 = 24 * 3600 * 1000;
/// Least local time between two samples, milliseconds (the header's resolution).
pub const SAMPLE_INTERVAL: i64 = 1_000;
/// Least time between probes, and how old the last sample must be before one is sent, while
/// no estimate exists or a correction is engaged, milliseconds.
pub const PROBE_INTERVAL_FAST: i64 = 1_000;
/// The same once the local clock is known to agree, milliseconds.
pub const PROBE_INTERVAL: i64 = 10_000;

/// What a sample changed in the correction, for the caller's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// Ages are now judged against the upstream's clock: the local clock is off by this
    /// many milliseconds (positive: the upstream is ahead).
    Engaged(i64),
    /// The offset is back within the bound: the local clock is used.
    Released,
    /// The offset is beyond [`IMPLAUSIBLE`]: neither clock is believed, the local one is
    /// used (milliseconds, as estimated).
    Disbelieved(i64),
}

/// The skew estimate shared by every request of one proxy. Lock-free on the request path
/// ([`ClockSkew::correct`] is one atomic load); the sample window is behind a mutex taken at
/// most once per second.
#[derive(Debug)]
pub struct ClockSkew {
    window: Mutex<Window>,
    /// Milliseconds added to the local clock when judging ages (0: none).
    correction: AtomicI64,
    /// The estimate, milliseconds; `i64::MIN` before one exists.
    estimate: AtomicI64,
    /// Local time of the last sample, or `i64::MIN`.
    last_sample: AtomicI64,
    /// Local time of the last probe granted, or `i64::MIN`.
    last_probe: AtomicI64,
}

impl Default for ClockSkew {
    fn default() -> Self {
        ClockSkew {
            window: Mutex::new(Window::default()),
            correction: AtomicI64::new(0),
            estimate: AtomicI64::new(i64::MIN),
            last_sample: AtomicI64::new(i64::MIN),
            last_probe: AtomicI64::new(i64::MIN),
        }
    }
}

impl ClockSkew {
    /// Takes a sample from a response's HTTP-date `date` received at local time `local`,
    /// unless one was taken less than [`SAMPLE_INTERVAL`] ago. `None` when no sample was
    /// taken (too soon, or not an HTTP-date); else what it changed.
    pub fn sample(&self, local: UnixMillis, date: &http::HeaderValue) -> Option<Change> {
        let last = self.last_sample.load(Ordering::Relaxed);
        if local.0.saturating_sub(last) < SAMPLE_INTERVAL {
            return None;
        }
        let upstream = date.to_str().ok().and_then(parse_http_date)?;
        self.last_sample
            .compare_exchange(last, local.0, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        Some(self.add(upstream.0.saturating_sub(local.0)))
    }

    /// Adds one sample `d` (upstream `Date` minus local time, milliseconds). The estimate and
    /// the correction are published under the window's lock, so a sample that lost a race
    /// never publishes an older window.
    fn add(&self, d: i64) -> Change {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let Some(estimate) = window.add(d) else {
            return Change::None;
        };
        self.estimate.store(estimate, Ordering::Relaxed);
        let believable = estimate.abs() <= IMPLAUSIBLE;
        let correction = if estimate.abs() > BOUND && believable {
            estimate
        } else {
            0
        };
        let before = self.correction.swap(correction, Ordering::Relaxed);
        match (before, correction) {
            (0, c) if c != 0 => Change::Engaged(c),
            (b, 0) if b != 0 && believable => Change::Released,
            (b, 0) if b != 0 => Change::Disbelieved(estimate),
            _ => Change::None,
        }
    }

    /// The time to judge event ages against: `now` plus the correction, if one is engaged.
    pub fn correct(&self, now: UnixMillis) -> UnixMillis {
        UnixMillis(
            now.0
                .saturating_add(self.correction.load(Ordering::Relaxed)),
        )
    }

    /// The estimated offset, milliseconds (positive: the upstream's clock is ahead), once
    /// [`MIN_SAMPLES`] samples were taken.
    pub fn estimate(&self) -> Option<i64> {
        let e = self.estimate.load(Ordering::Relaxed);
        (e != i64::MIN).then_some(e)
    }

    /// Whether ages are being judged against the upstream's clock.
    pub fn corrected(&self) -> bool {
        self.correction.load(Ordering::Relaxed) != 0
    }

    /// Whether the caller, about to answer an event stale at local time `now`, should probe
    /// the upstream's clock: no sample and no probe within the probe interval. At most one
    /// caller per interval is told yes.
    pub fn wants_probe(&self, now: UnixMillis) -> bool {
        let interval = if self.estimate().is_none() || self.corrected() {
            PROBE_INTERVAL_FAST
        } else {
            PROBE_INTERVAL
        };
        let last_sample = self.last_sample.load(Ordering::Relaxed);
        let last_probe = self.last_probe.load(Ordering::Relaxed);
        now.0.saturating_sub(last_sample) >= interval
            && now.0.saturating_sub(last_probe) >= interval
            && self
                .last_probe
                .compare_exchange(last_probe, now.0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The last samples and the estimate they gave.
#[derive(Debug, Default)]
struct Window {
    samples: Vec<i64>,
    estimate: Option<i64>,
    /// Samples in a row that disagreed with the estimate by more than [`BOUND`].
    disagreeing: usize,
}

impl Window {
    /// Adds a sample; the estimate once there are enough.
    fn add(&mut self, d: i64) -> Option<i64> {
        let centre = d + SAMPLE_INTERVAL / 2;
        if self.estimate.is_some_and(|e| (centre - e).abs() > BOUND) {
            self.disagreeing += 1;
        } else {
            self.disagreeing = 0;
        }
        if self.samples.len() == WINDOW {
            self.samples.remove(0);
        }
        self.samples.push(d);
        if self.disagreeing >= RESTART_AFTER {
            // The clock stepped: start over from the samples taken since.
            let keep = self.samples.len() - self.disagreeing;
            self.samples.drain(..keep);
            self.disagreeing = 0;
        }
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let estimate = sorted[sorted.len() / 2] + SAMPLE_INTERVAL / 2;
        self.estimate = Some(estimate);
        Some(estimate)
    }
}

/// An HTTP-date (RFC 9110 section 5.6.7: IMF-fixdate, and the obsolete RFC 850 and asctime
/// forms a recipient must accept), parsed by `httpdate`, as unix milliseconds.
fn parse_http_date(text: &str) -> Option<UnixMillis> {
    let t = httpdate::parse_http_date(text).ok()?;
    let secs = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs)
        .ok()
        .and_then(|s| s.checked_mul(1000))
        .map(UnixMillis)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_780_000_000_000; // 2026-05-28T20:26:40Z

    fn date(ms: i64) -> http::HeaderValue {
        let t =
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap());
        http::HeaderValue::from_str(&httpdate::fmt_http_date(t)).unwrap()
    }

    /// Samples once a second for `n` seconds: local time `start + i s + jitter`, upstream
    /// `offset` ahead.
    fn feed(skew: &ClockSkew, start: i64, n: i64, offset: i64) -> Vec<Option<Change>> {
        (0..n)
            .map(|i| {
                let local = start + i * 1000 + (i * 137) % 1000;
                skew.sample(UnixMillis(local), &date(local + offset))
            })
            .collect()
    }

    #[test]
    fn a_local_clock_ahead_is_corrected_after_enough_samples() {
        let skew = ClockSkew::default();
        let changes = feed(&skew, T, 10, -90_000);
        assert!(
            changes[..MIN_SAMPLES - 1]
                .iter()
                .all(|c| *c == Some(Change::None))
        );
        assert!(
            matches!(changes[MIN_SAMPLES - 1], Some(Change::Engaged(c)) if (-91_000..=-89_000).contains(&c)),
            "{changes:?}"
        );
        assert!(skew.corrected());
        let e = skew.estimate().unwrap();
        assert!((-90_600..=-89_400).contains(&e), "{e}");
        let judged = skew.correct(UnixMillis(T));
        assert!((T - 90_600..=T - 89_400).contains(&judged.0));
    }

    #[test]
    fn a_local_clock_behind_is_corrected_too() {
        let skew = ClockSkew::default();
        feed(&skew, T, 10, 120_000);
        assert!(skew.corrected());
        assert!(skew.correct(UnixMillis(T)).0 > T + 119_000);
    }

    #[test]
    fn small_offsets_are_noise_and_wild_ones_not_believed() {
        let skew = ClockSkew::default();
        feed(&skew, T, 10, 3_000);
        assert!(!skew.corrected());
        assert_eq!(skew.correct(UnixMillis(T)), UnixMillis(T));
        let wild = ClockSkew::default();
        feed(&wild, T, 10, 200 * 24 * 3600 * 1000);
        assert!(!wild.corrected());
        assert!(wild.estimate().is_some());
        // Engaged, then the upstream's clock jumps a year: disbelieved, not "agrees again".
        let jump = ClockSkew::default();
        feed(&jump, T, 5, 60_000);
        let changes = feed(&jump, T + 5_000, 10, 365 * 24 * 3600 * 1000);
        assert!(
            changes
                .iter()
                .any(|c| matches!(c, Some(Change::Disbelieved(_)))),
            "{changes:?}"
        );
        assert!(!changes.contains(&Some(Change::Released)));
        assert!(!jump.corrected());
    }

    #[test]
    fn a_few_outliers_do_not_move_it_and_a_stepped_clock_is_followed() {
        let skew = ClockSkew::default();
        feed(&skew, T, 20, -90_000);
        // A few responses in a row from a replica whose clock is right: still corrected.
        feed(&skew, T + 20_000, (RESTART_AFTER - 1) as i64, 0);
        assert!(skew.corrected());
        feed(&skew, T + 30_000, 3, -90_000);
        // The local clock fixed (NTP stepped it): released within RESTART_AFTER samples.
        let changes = feed(&skew, T + 40_000, RESTART_AFTER as i64, 0);
        assert_eq!(changes.last(), Some(&Some(Change::Released)), "{changes:?}");
        assert!(!skew.corrected());
    }

    #[test]
    fn samples_and_probes_are_rate_limited() {
        let skew = ClockSkew::default();
        let at = |ms| UnixMillis(T + ms);
        assert!(skew.wants_probe(at(0)));
        assert!(!skew.wants_probe(at(500)), "one probe per interval");
        assert!(skew.wants_probe(at(1_000)));
        for i in 0..MIN_SAMPLES as i64 {
            assert!(skew.sample(at(i * 1000), &date(T + i * 1000)).is_some());
            // A second sample within the same second is not taken.
            assert_eq!(skew.sample(at(i * 1000 + 10), &date(T + 999_999)), None);
        }
        assert!(!skew.corrected());
        assert!(!skew.wants_probe(at(9_000)), "a sample is recent");
        assert!(skew.wants_probe(at(12_000)));
        // Garbage is ignored.
        let g = http::HeaderValue::from_static("yesterday");
        assert_eq!(skew.sample(at(20_000), &g), None);
        // While a correction is engaged, probes are fast again.
        let engaged = ClockSkew::default();
        feed(&engaged, T, 5, -90_000);
        assert!(engaged.corrected());
        assert!(engaged.wants_probe(at(6_000)));
        assert!(engaged.wants_probe(at(7_000)));
    }
}
