//! A fleet of devices for the scenario runner: each device at one place of the real
//! geography, reporting on its own schedule (a fixed interval from a phase of its own, with a
//! little jitter), and the figure that says whether devices went dark: the longest gap between
//! a device's admitted fixes (docs/decision.md "Devices").

use std::sync::Arc;
use std::time::Duration;

use super::scenario::{BANDS, Second, SimEvent, band, geographic_events};
use crate::policy::Policy;

/// A fleet's events (one per device, device `i` at index `i`) and its arrival schedule over
/// `length`: `(since the start, device)` in time order, each device every `interval`, from a
/// phase drawn uniformly over one interval, each report moved by up to `jitter` of the
/// interval either way (senders' timers drift). Only the first `warm.1` of the devices (a
/// share) report during the first `warm.0`: a calm start, before the overload.
#[expect(clippy::too_many_arguments, reason = "a fleet's settings, by name")]
pub fn device_fleet(
    policy: &Policy,
    mix: &[(&str, f64)],
    devices: u32,
    interval: Duration,
    jitter: f64,
    warm: (Duration, f64),
    length: Duration,
    seed: u64,
) -> (Vec<SimEvent>, Arc<[(Duration, u32)]>) {
    let n = usize::try_from(devices).unwrap_or(usize::MAX);
    let mut events = geographic_events(policy, mix, n, seed);
    for (i, e) in events.iter_mut().enumerate() {
        e.device = u32::try_from(i).ok();
    }
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_f1ee7);
    let mut schedule = Vec::new();
    #[expect(clippy::cast_possible_truncation, reason = "a share of a u32")]
    #[expect(clippy::cast_sign_loss, reason = "a share of a u32")]
    let early = (f64::from(devices) * warm.1.clamp(0.0, 1.0)) as u32;
    for d in 0..devices {
        let begin = if d < early { Duration::ZERO } else { warm.0 };
        let mut at = begin + interval.mul_f64(rng.f64());
        while at < length {
            schedule.push((at, d));
            let step = interval.mul_f64(1.0 + jitter * (2.0 * rng.f64() - 1.0));
            at += step;
        }
    }
    schedule.sort_by_key(|(t, d)| (*t, *d));
    (events, schedule.into())
}

/// Per device of a sheddable stream, the longest time without an admitted fix in
/// `window` (seconds since the start): between two admitted fixes that end in it, and from
/// the last one (or the window's start) to the window's end. `(device, band, gap seconds)`.
pub fn longest_gaps(
    seconds: &[Second],
    events: &[SimEvent],
    window: std::ops::Range<f64>,
) -> Vec<(u32, usize, f64)> {
    let mut fixes: Vec<Vec<f64>> = vec![Vec::new(); events.len()];
    for s in seconds {
        for &(d, t) in &s.admitted_fixes {
            if let Some(list) = fixes.get_mut(usize::try_from(d).unwrap_or(usize::MAX)) {
                list.push(t);
            }
        }
    }
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let Some(d) = e.device.filter(|_| !e.never) else {
            continue;
        };
        let list = &mut fixes[i];
        list.sort_by(f64::total_cmp);
        let mut last = list
            .iter()
            .copied()
            .rfind(|t| *t <= window.start)
            .unwrap_or(window.start);
        let mut longest = 0.0f64;
        for &t in list.iter().filter(|t| window.contains(t)) {
            longest = longest.max(t - last);
            last = t;
        }
        longest = longest.max(window.end - last);
        out.push((d, band(e.rank), longest));
    }
    out
}

/// The `q` quantile (0–1) of the longest gaps of devices in band `b`, seconds (`NaN` with
/// none).
#[expect(clippy::cast_precision_loss, reason = "a count of devices")]
#[expect(clippy::cast_possible_truncation, reason = "an index in [0, len)")]
#[expect(clippy::cast_sign_loss, reason = "an index in [0, len)")]
pub fn gap_quantile(gaps: &[(u32, usize, f64)], b: usize, q: f64) -> f64 {
    let mut g: Vec<f64> = gaps
        .iter()
        .filter(|(_, band, _)| *band == b)
        .map(|(_, _, g)| *g)
        .collect();
    if g.is_empty() {
        return f64::NAN;
    }
    g.sort_by(f64::total_cmp);
    g[((g.len() - 1) as f64 * q).round() as usize]
}

/// The bound on a band's longest gap the issue sets: 1.5 times `interval / (1 - s)` for its
/// shed share `s` (the gap regular thinning at that share would leave, with room for jitter
/// and the loop's own movement).
pub fn gap_bound(interval: Duration, shed: f64) -> f64 {
    1.5 * interval.as_secs_f64() / (1.0 - shed)
}

/// The bands' names, for reports.
pub fn band_name(b: usize) -> String {
    format!("ranks {}", crate::policy::curve::BAND_NAMES[b])
}

/// A fleet scenario of the device figures (docs/decision.md "Devices"): `devices` devices
/// reporting every `interval` from the real geography with [`super::MIX`], through
/// `replicas`, against an upstream of `workers` workers serving uniformly 10–30 ms (so
/// `workers` sets the overload: 10,000 devices every 5 s are 2,000 requests a second, three
/// times 13 workers' capacity and ten times 4's), its target 30 ms. A calm start of 10 s (a
/// share of the devices, 0.8 of the capacity), then 60 s of the whole fleet; figures over the
/// last 30 s.
#[derive(Debug, Clone)]
pub struct FleetCase {
    /// Devices.
    pub devices: u32,
    /// Their report interval.
    pub interval: Duration,
    /// The upstream's workers.
    pub workers: u32,
    /// The proxy replicas.
    pub replicas: super::Replicas,
}

/// A fleet scenario's figures over its last 30 s.
#[derive(Debug, Clone)]
pub struct FleetFigures {
    /// Goodput, latency and shed shares.
    pub figures: super::Figures,
    /// Each sheddable device's longest gap ([`longest_gaps`]).
    pub gaps: Vec<(u32, usize, f64)>,
    /// Each sheddable device's own shed share over the window, by device.
    pub shed_by_device: Vec<f64>,
}

/// Runs `case` at `seed`, deciding by device if `by_device` (else every fix an independent
/// draw, as before devices were read). Deterministic under paused tokio time.
pub async fn run_fleet(
    case: &FleetCase,
    policy: &Arc<Policy>,
    by_device: bool,
    seed: u64,
) -> FleetFigures {
    let service = super::ServiceTime::Uniform {
        min: Duration::from_millis(10),
        max: Duration::from_millis(30),
    };
    let sim = super::Simulator::new(case.workers, service, Vec::new(), seed);
    let offered = f64::from(case.devices) / case.interval.as_secs_f64();
    let warm = (Duration::from_secs(10), 0.8 * sim.capacity() / offered);
    let (events, schedule) = device_fleet(
        policy,
        super::MIX,
        case.devices,
        case.interval,
        0.05,
        warm,
        Duration::from_secs(70),
        seed,
    );
    let controller = crate::pressure::ControllerConfig {
        max_inflight: None,
        latency_target: Duration::from_millis(30),
        tuning: &crate::pressure::Tuning::DEFAULT,
    };
    let mut scenario = super::Scenario::new(&[(70, 1.0)], controller, case.replicas.clone(), seed);
    scenario.schedule = Some(schedule);
    scenario.devices = by_device;
    let seconds = super::run_scenario(&scenario, &sim, policy, &events).await;
    let figures = super::Figures::of(&seconds, 40..70, sim.capacity());
    let gaps = longest_gaps(&seconds, &events, 40.0..70.0);
    // A device's own share: its fixes offered in the window less those admitted.
    let mut admitted = vec![0u32; events.len()];
    for s in &seconds[40..70] {
        for &(d, _) in &s.admitted_fixes {
            if let Some(a) = admitted.get_mut(usize::try_from(d).unwrap_or(usize::MAX)) {
                *a += 1;
            }
        }
    }
    let per_window = 30.0 / case.interval.as_secs_f64();
    let shed_by_device = gaps
        .iter()
        .map(|(d, _, _)| {
            let a = f64::from(admitted[usize::try_from(*d).unwrap_or(0)]);
            (1.0 - a / per_window).clamp(0.0, 1.0)
        })
        .collect();
    FleetFigures {
        figures,
        gaps,
        shed_by_device,
    }
}

impl FleetFigures {
    /// Whether every band whose shed share is in (0.1, 0.9) keeps the p99 of its devices'
    /// longest gaps within [`gap_bound`] (the measure).
    pub fn bands_within_bound(&self, interval: Duration) -> bool {
        (0..BANDS.len()).all(|b| {
            let s = self.figures.shed_by_band[b];
            !(0.1..0.9).contains(&s) || gap_quantile(&self.gaps, b, 0.99) <= gap_bound(interval, s)
        })
    }

    /// The share of devices whose longest gap is within [`gap_bound`] of their own shed share
    /// (devices of one band can have very different shares: a band's average bound is tight
    /// for its most-shed ranks); devices shed under 0.1 or over 0.9 are left out.
    #[expect(clippy::cast_precision_loss, reason = "a count of devices")]
    pub fn devices_within_bound(&self, interval: Duration) -> f64 {
        let judged: Vec<bool> = self
            .gaps
            .iter()
            .zip(&self.shed_by_device)
            .filter(|(_, s)| (0.1..0.9).contains(*s))
            .map(|((_, _, g), s)| *g <= gap_bound(interval, *s))
            .collect();
        if judged.is_empty() {
            return 1.0;
        }
        judged.iter().filter(|ok| **ok).count() as f64 / judged.len() as f64
    }
}
