//! The overload bench's figures of one run: its table row (a module of `benches/overload.rs`).

use super::{AFTER, OVERLOAD, Run, Sec, WARM};

pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) factor: f64,
    pub(crate) goodput: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) never: f64,
    pub(crate) bands: [f64; 3],
    pub(crate) cv: f64,
    pub(crate) in_order: String,
    pub(crate) recover: String,
    pub(crate) calm: String,
    /// [`silence_p99`], seconds.
    pub(crate) silence_p99: f64,
    /// The floor's admissions and denials over the run (shedgate's
    /// `shedgate_freshness_total`; 0 for the other contenders).
    pub(crate) floor: (f64, f64),
}

/// Seconds of the overload in which the shed share is non-decreasing over the rank bands
/// that had traffic (priority areas lose the smallest share), of all overload seconds.
/// Seconds out of order are listed below the table as `shed/sent` per band.
pub(crate) fn in_rank_order(name: &str, factor: f64, secs: &[Sec]) -> String {
    let window = &secs[WARM as usize..(WARM + OVERLOAD) as usize];
    let mut ordered = 0;
    for (i, s) in window.iter().enumerate() {
        let shares: Vec<f64> = s
            .by_band
            .iter()
            .filter(|(sent, _)| *sent > 0)
            .map(|(sent, shed)| *shed as f64 / *sent as f64)
            .collect();
        if shares.windows(2).all(|w| w[0] <= w[1]) {
            ordered += 1;
        } else {
            let bands: Vec<String> = s
                .by_band
                .iter()
                .map(|(sent, shed)| format!("{shed}/{sent}"))
                .collect();
            eprintln!(
                "{name} {factor}x, overload second {i}: shed per band {}",
                bands.join(" ")
            );
        }
    }
    format!("{ordered}/{}", window.len())
}

/// Time from the end of the overload until pressure is below 0.5 for good: the first
/// 100 ms sample after which every sample is below 0.5 (shedgate only).
pub(crate) fn calm_after(samples: &[(f64, f64, f64)]) -> String {
    let end = (WARM + OVERLOAD) as f64;
    let after: Vec<_> = samples.iter().filter(|s| s.0 >= end).collect();
    let from = after.iter().rposition(|s| s.1 >= 0.5).map_or(0, |i| i + 1);
    after
        .get(from)
        .map_or("n/a".to_owned(), |s| format!("{:.1} s", s.0 - end))
}

pub(crate) fn summarise(
    name: &'static str,
    factor: f64,
    capacity: f64,
    run: &Run,
    recover: String,
    calm: String,
) -> Row {
    let secs = &run.secs;
    let window = &secs[(WARM + 2) as usize..(WARM + OVERLOAD) as usize];
    let ok: Vec<f64> = window.iter().map(|s| s.ok as f64).collect();
    let mean = ok.iter().sum::<f64>() / ok.len() as f64;
    let cv = (ok.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / ok.len() as f64).sqrt()
        / mean.max(1e-9);
    let mut lat: Vec<f64> = window.iter().flat_map(|s| s.lat_ms.clone()).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let (nev_sent, nev_ok) = secs
        .iter()
        .fold((0, 0), |a, s| (a.0 + s.never.0, a.1 + s.never.1));
    let band = |b: usize| {
        let (sent, shed) = window
            .iter()
            .fold((0, 0), |a, s| (a.0 + s.by_band[b].0, a.1 + s.by_band[b].1));
        shed as f64 / (sent as f64).max(1.0)
    };
    Row {
        name,
        factor,
        goodput: mean / capacity,
        p50: pct(0.5),
        p99: pct(0.99),
        never: nev_ok as f64 / (nev_sent as f64).max(1.0),
        bands: [band(0), band(1), band(2)],
        cv,
        in_order: in_rank_order(name, factor, secs),
        recover,
        calm,
        silence_p99: silence_p99(&run.delivered),
        floor: (0.0, 0.0),
    }
}

/// A [`silence_p99`] for a table, seconds: `≥8.00` when it is the whole overload window
/// (the devices at the p99 had no fix delivered in it), not a measured 8 s; `–` without a
/// fleet.
pub(crate) fn silence(p99: f64) -> String {
    if p99.is_nan() {
        "–".to_owned()
    } else if p99 >= OVERLOAD as f64 - 1e-9 {
        format!("≥{:.2}", OVERLOAD as f64)
    } else {
        format!("{p99:.2}")
    }
}

/// The p99 over the fleet's devices of each one's longest silence in the overload window,
/// seconds: the longest time between two of its delivered fixes, or from the window's start
/// to its first, or from its last to the window's end (as the demo's dark table); a device
/// with none delivered in the window is silent all of it. `NaN` without a fleet.
pub(crate) fn silence_p99(delivered: &[Vec<f64>]) -> f64 {
    let (from, to) = (WARM as f64, (WARM + OVERLOAD) as f64);
    let mut longest: Vec<f64> = delivered
        .iter()
        .map(|times| {
            let mut times: Vec<f64> = times
                .iter()
                .copied()
                .filter(|t| (from..to).contains(t))
                .collect();
            times.sort_by(f64::total_cmp);
            let mut last = from;
            let mut most = 0.0f64;
            for t in times {
                most = most.max(t - last);
                last = t;
            }
            most.max(to - last)
        })
        .collect();
    longest.sort_by(f64::total_cmp);
    longest
        .get(((longest.len() as f64 - 1.0) * 0.99) as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// A latency percentile in milliseconds for a table cell, `–` where nothing was admitted in
/// time (the percentile of no samples is NaN).
pub(crate) fn ms(v: f64) -> String {
    if v.is_nan() {
        "–".to_owned()
    } else {
        format!("{v:.1}")
    }
}

/// Seconds after the overload until a second where everything sent is delivered.
pub(crate) fn recovery(secs: &[Sec]) -> String {
    let end = (WARM + OVERLOAD) as usize;
    secs[end..end + AFTER as usize]
        .iter()
        .position(|s| s.sent > 0 && s.ok == s.sent)
        .map_or(format!(">{AFTER} s"), |i| format!("{} s", i + 1))
}
