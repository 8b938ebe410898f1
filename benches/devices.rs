//! Device figures (docs/decision.md "Devices"): a fleet of 10,000 devices reporting every 5 s
//! from the real geography, in-process under paused time, decided by device and, in the same
//! run (the same seed, arrivals and places), by an independent draw per fix as before devices
//! were read. Per case, over seeds 1–20 (`-- --seeds 1-40` for others): goodput, admitted p99,
//! never-shed delivered; per rank band, the shed share both ways and the p99 over its devices
//! of the longest gap between admitted fixes, both ways, against the bound
//! `1.5 × 5 s / (1 − s)` (bands shed between 10% and 90%); and the share of devices within the
//! same bound at their own shed share. Medians and worst over the seeds.
//!
//! Run: `cargo bench --bench devices` (about a minute once built). The example policy's
//! freshness floor is off in this comparison: it measures thinning alone.
//!
//! `cargo bench --bench devices -- --max-silence 20s [--share 0.1]`: the freshness floor
//! instead. Each case by device twice in the same run (same seed, arrivals and places): the
//! example policy with no floor, and with `max_silence` (and `freshness_share`) set on its
//! streams that name devices. Per band: the p99 over its devices of the longest gap between
//! admitted fixes both ways, and its floor demand (devices ÷ `max_silence`, fixes a second)
//! beside the floor's budget (its in-flight limit over the mean service time);
//! goodput, admitted p99 and never-shed delivered both ways. Medians and worst over the seeds.

#![allow(missing_docs, reason = "a bench binary: its items are not an API")]

use std::sync::Arc;
use std::time::Duration;

use shedgate::demo::sim::fleet::{
    FleetCase, FleetFigures, band_name, gap_bound, gap_quantile, run_fleet,
};
use shedgate::demo::sim::{Replicas, Spread};

const INTERVAL: Duration = Duration::from_secs(5);
/// The fleet simulator's mean service time (uniform 10–30 ms, `run_fleet`).
const SERVICE_MEAN: Duration = Duration::from_millis(20);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn worst(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::MIN, f64::max)
}

fn seeds() -> Vec<u64> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args
        .iter()
        .position(|a| a == "--seeds")
        .and_then(|i| args.get(i + 1))
        .map_or("1-20", String::as_str);
    let (a, b) = spec.split_once('-').unwrap_or((spec, spec));
    (a.parse().expect("a seed")..=b.parse().expect("a seed")).collect()
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The example policy with the floor on (`max_silence` and `share` set on every stream that
/// names its device) or off (`max_silence` removed), compiled from a copy.
fn example_policy(floor: Option<(&str, f64)>) -> shedgate::policy::Policy {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let copy = tempfile::tempdir().expect("a temporary directory");
    for entry in std::fs::read_dir(&dir).expect("policies/") {
        let entry = entry.expect("an entry");
        if entry.file_type().expect("a type").is_file() {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("a copy");
        }
    }
    let streams = std::fs::read_to_string(dir.join("streams.toml")).expect("streams.toml");
    let mut out: Vec<String> = streams
        .lines()
        .filter(|l| !l.trim_start().starts_with("max_silence"))
        .map(str::to_owned)
        .collect();
    if let Some((max_silence, share)) = floor {
        out = out
            .into_iter()
            .flat_map(|l| {
                let extra = l
                    .trim_start()
                    .starts_with("device =")
                    .then(|| format!("max_silence = {max_silence:?}"));
                std::iter::once(l).chain(extra)
            })
            .collect();
        let at = out
            .iter()
            .position(|l| l.trim() == "[defaults]")
            .expect("a [defaults] table");
        out.insert(at + 1, format!("freshness_share = {share}"));
    }
    std::fs::write(copy.path().join("streams.toml"), out.join("\n")).expect("streams.toml");
    shedgate::policy::load_dir(copy.path())
        .expect("the example policy compiles")
        .policy
}

/// The fleet's cases: name, upstream workers (13: 3x, 4: 10x), replicas.
fn cases() -> Vec<(&'static str, u32, Replicas)> {
    vec![
        ("1 replica, 3x", 13, Replicas::one()),
        ("1 replica, 10x", 4, Replicas::one()),
        (
            "4 replicas, 3x, in turn",
            13,
            Replicas::steady(4, Spread::RoundRobin),
        ),
        (
            "4 replicas, 3x, at random",
            13,
            Replicas::steady(4, Spread::Random),
        ),
        (
            "4 replicas, 3x, by device",
            13,
            Replicas::steady(4, Spread::ByDevice),
        ),
        (
            "4 replicas, 10x, in turn",
            4,
            Replicas::steady(4, Spread::RoundRobin),
        ),
        (
            "4 replicas, 10x, by device",
            4,
            Replicas::steady(4, Spread::ByDevice),
        ),
    ]
}

/// The paused-time runtime the fleet runs in.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// The case of 10,000 devices every [`INTERVAL`] at `workers` (13: 3x, 4: 10x).
fn fleet_case(workers: u32, replicas: Replicas) -> FleetCase {
    FleetCase {
        devices: 10_000,
        interval: INTERVAL,
        workers,
        replicas,
    }
}

/// `case` run twice at each seed, as `a` and as `b` (a policy, and whether by device).
fn paired(
    runtime: &tokio::runtime::Runtime,
    case: &FleetCase,
    seeds: &[u64],
    a: (&Arc<shedgate::policy::Policy>, bool),
    b: (&Arc<shedgate::policy::Policy>, bool),
) -> Vec<(FleetFigures, FleetFigures)> {
    seeds
        .iter()
        .map(|&seed| {
            let first = runtime.block_on(run_fleet(case, a.0, a.1, seed));
            let second = runtime.block_on(run_fleet(case, b.0, b.1, seed));
            (first, second)
        })
        .collect()
}

fn main() {
    if let Some(max_silence) = arg("--max-silence") {
        let share = arg("--share").map_or(0.1, |s| s.parse().expect("a share"));
        return floor(&max_silence, share);
    }
    // Thinning alone: the example policy with its freshness floor off.
    let policy = Arc::new(example_policy(None));
    let runtime = runtime();
    let seeds = seeds();
    println!(
        "10,000 devices every 5 s; seeds {:?}..={:?}",
        seeds[0],
        seeds[seeds.len() - 1]
    );
    let cases = cases();
    for (name, workers, replicas) in cases {
        let case = fleet_case(workers, replicas);
        let runs = paired(&runtime, &case, &seeds, (&policy, false), (&policy, true));
        let met = runs
            .iter()
            .filter(|(_, d)| d.bands_within_bound(INTERVAL))
            .count();
        let met_draw = runs
            .iter()
            .filter(|(d, _)| d.bands_within_bound(INTERVAL))
            .count();
        println!(
            "\n{name}: bands within the gap bound at {met} of {} seeds by device, {met_draw} by draw",
            seeds.len()
        );
        let col = |f: &dyn Fn(&shedgate::demo::sim::fleet::FleetFigures) -> f64, device: bool| {
            runs.iter()
                .map(|(a, b)| f(if device { b } else { a }))
                .collect::<Vec<f64>>()
        };
        for device in [false, true] {
            let how = if device { "by device" } else { "by draw  " };
            let goodput = col(&|r| r.figures.goodput * 100.0, device);
            let p99 = col(&|r| r.figures.p99_ms, device);
            let never = col(&|r| r.figures.never_delivered * 100.0, device);
            let within = col(&|r| r.devices_within_bound(INTERVAL) * 100.0, device);
            println!(
                "  {how}: goodput median {:.1}% lowest {:.1}%; p99 median {:.0} ms worst {:.0} ms; \
                 never-shed delivered lowest {:.1}%; devices within the bound at their own share \
                 median {:.1}% lowest {:.1}%",
                median(goodput.clone()),
                goodput.iter().copied().fold(f64::MAX, f64::min),
                median(p99.clone()),
                worst(&p99),
                never.iter().copied().fold(f64::MAX, f64::min),
                median(within.clone()),
                within.iter().copied().fold(f64::MAX, f64::min),
            );
        }
        for b in 0..4 {
            let share = |device: bool| col(&|r| r.figures.shed_by_band[b] * 100.0, device);
            let gap = |device: bool| col(&|r| gap_quantile(&r.gaps, b, 0.99), device);
            let (s0, s1) = (share(false), share(true));
            if median(s1.clone()).is_nan()
                || s1.iter().all(|s| *s == 0.0) && s0.iter().all(|s| *s == 0.0)
            {
                continue;
            }
            let diff: Vec<f64> = s0.iter().zip(&s1).map(|(a, b)| (b - a).abs()).collect();
            let bound: Vec<f64> = s1.iter().map(|s| gap_bound(INTERVAL, s / 100.0)).collect();
            println!(
                "  {}: shed median {:.1}% by draw, {:.1}% by device (difference most {:.1} points); \
                 p99 longest gap median {:.1} s by draw, {:.1} s by device (worst {:.1}); bound median {:.1} s",
                band_name(b),
                median(s0),
                median(s1),
                worst(&diff),
                median(gap(false)),
                median(gap(true)),
                worst(&gap(true)),
                median(bound),
            );
        }
    }
}

/// The freshness floor's figures: by device with no floor and with one, the same seeds.
fn floor(max_silence: &str, share: f64) {
    let off = Arc::new(example_policy(None));
    let on = Arc::new(example_policy(Some((max_silence, share))));
    let secs = humantime::parse_duration(max_silence)
        .expect("a duration")
        .as_secs_f64();
    let runtime = runtime();
    let seeds = seeds();
    println!(
        "10,000 devices every 5 s; max_silence {max_silence}, freshness_share {share}; seeds \
         {:?}..={:?}",
        seeds[0],
        seeds[seeds.len() - 1]
    );
    // The cases of one replica, and four spread in turn and by device at 3x.
    let cases = cases()
        .into_iter()
        .filter(|(name, _, _)| !name.contains("at random") && !name.starts_with("4 replicas, 10x"));
    for (name, workers, replicas) in cases {
        let n = u32::try_from(replicas.steps.last().map_or(1, |s| s.1).max(1)).unwrap_or(1);
        let case = fleet_case(workers, replicas);
        let runs = paired(&runtime, &case, &seeds, (&off, true), (&on, true));
        // The floor's budget: per replica max(1, share x its in-flight capacity, here its
        // part of the upstream's workers) admissions in flight, each held for the
        // simulator's mean service time.
        let limit = n * shedgate::admission::Floor::limit_of(share, workers / n);
        let budget = f64::from(limit) / SERVICE_MEAN.as_secs_f64();
        println!("\n{name}: floor budget {limit} in flight, about {budget:.0} fixes/s");
        let col = |f: &dyn Fn(&shedgate::demo::sim::fleet::FleetFigures) -> f64, floored: bool| {
            runs.iter()
                .map(|(a, b)| f(if floored { b } else { a }))
                .collect::<Vec<f64>>()
        };
        for floored in [false, true] {
            let how = if floored { "floor on " } else { "floor off" };
            let goodput = col(&|r| r.figures.goodput * 100.0, floored);
            let p99 = col(&|r| r.figures.p99_ms, floored);
            let never = col(&|r| r.figures.never_delivered * 100.0, floored);
            println!(
                "  {how}: goodput median {:.1}% lowest {:.1}%; p99 median {:.1} ms worst {:.1} ms; \
                 never-shed delivered lowest {:.1}%",
                median(goodput.clone()),
                goodput.iter().copied().fold(f64::MAX, f64::min),
                median(p99.clone()),
                worst(&p99),
                never.iter().copied().fold(f64::MAX, f64::min),
            );
        }
        for b in 0..4 {
            let devices = runs[0]
                .1
                .gaps
                .iter()
                .filter(|(_, band, _)| *band == b)
                .count();
            if devices == 0 {
                continue;
            }
            let gap = |floored: bool| col(&|r| gap_quantile(&r.gaps, b, 0.99), floored);
            #[expect(clippy::cast_precision_loss, reason = "a count of devices")]
            let demand = devices as f64 / secs;
            let fits = if demand <= budget { "fits" } else { "over" };
            println!(
                "  {}: {devices} devices, floor demand {demand:.0} fixes/s ({fits} the budget); \
                 p99 longest gap median {:.1} s off, {:.1} s on (worst {:.1} s)",
                band_name(b),
                median(gap(false)),
                median(gap(true)),
                worst(&gap(true)),
            );
        }
    }
}
