//! Latency that depends on the stream (Netflix/concurrency-limits#121, #33): positions cost
//! the upstream 10 ms of work and geofence transitions 200 ms, so the mean latency moves with
//! the mix as well as with the queue. In the simulator, under paused time: 8 workers, a 95/5
//! mix (19.5 ms of work on average, about 410 requests/s of capacity), the default 100 ms
//! target.

#![expect(clippy::cast_precision_loss, reason = "counts below 2^52")]

use std::sync::Arc;
use std::time::Duration;

use shedgate::demo::sim::{
    Replicas, Scenario, Second, ServiceTime, SimEvent, Simulator, geographic_events,
    run_scenario_phased,
};
use shedgate::pressure::ControllerConfig;

const WORKERS: u32 = 8;
const POSITION: Duration = Duration::from_millis(10);
const TRANSITION: Duration = Duration::from_millis(200);

fn policy() -> Arc<shedgate::policy::Policy> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    Arc::new(shedgate::policy::load_dir(&dir).unwrap().policy)
}

/// Mean work of a mix with `transitions` of its requests transitions.
fn mean_work(transitions: f64) -> Duration {
    POSITION.mul_f64(1.0 - transitions) + TRANSITION.mul_f64(transitions)
}

/// Events from the real geography, `transitions` of them geofence transitions (never shed,
/// 200 ms of work), the rest vehicle positions (10 ms).
fn events(policy: &shedgate::policy::Policy, transitions: f64, seed: u64) -> Vec<SimEvent> {
    let mix = [
        ("vehicle.position", 1.0 - transitions),
        ("geofence.transition", transitions),
    ];
    let mut events = geographic_events(policy, &mix, 20_000, seed);
    for e in &mut events {
        e.service = Some(if e.never { TRANSITION } else { POSITION });
    }
    events
}

/// Runs `load` phases (seconds, offered work / the 95/5 mix's work capacity), phase `i` with
/// `mixes[i]` of transitions; the simulator's own distribution is the 95/5 mean, so its
/// capacity is the 95/5 mix's.
async fn run(load: &[(u64, f64)], mixes: &[f64], seed: u64) -> (Vec<Second>, f64) {
    let policy = policy();
    let base = mean_work(0.05);
    let sim = Simulator::new(WORKERS, ServiceTime::Fixed(base), Vec::new(), seed);
    let capacity = sim.capacity();
    // Offered work as a share of capacity: the request rate scales by the mix's cost.
    let load: Vec<(u64, f64)> = load
        .iter()
        .zip(mixes)
        .map(|(&(secs, work), &t)| (secs, work * base.as_secs_f64() / mean_work(t).as_secs_f64()))
        .collect();
    let pools: Vec<Vec<SimEvent>> = mixes.iter().map(|&t| events(&policy, t, seed)).collect();
    let pools: Vec<&[SimEvent]> = pools.iter().map(Vec::as_slice).collect();
    let controller = ControllerConfig {
        max_inflight: None,
        latency_target: Duration::from_millis(100),
        tuning: crate::support::tuning(),
    };
    let scenario = Scenario::new(&load, controller, Replicas::one(), seed);
    (
        run_scenario_phased(&scenario, &sim, &policy, &pools).await,
        capacity,
    )
}

/// Positions shed over `seconds`, as a share of those offered.
fn positions_shed(seconds: &[Second]) -> f64 {
    let (shed, offered) = seconds.iter().fold((0, 0), |(s, o), x| {
        (
            s + x.shed_by_band.iter().sum::<u64>(),
            o + x.offered_by_band.iter().sum::<u64>(),
        )
    });
    if offered == 0 {
        0.0
    } else {
        shed as f64 / offered as f64
    }
}

/// The share of positions that must be shed so that the offered work fits the capacity:
/// transitions' work is never shed, positions' fills what is left.
fn work_conserving_share(load: f64, transitions: f64) -> f64 {
    let capacity = f64::from(WORKERS);
    let rate = load * capacity / mean_work(0.05).as_secs_f64();
    let left = capacity - rate * transitions * TRANSITION.as_secs_f64();
    1.0 - left / (rate * (1.0 - transitions) * POSITION.as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Offered 1.2 times the upstream's capacity in work for 60 s, then 0.6: over the last 30 s
/// of the overload the positions shed are the work-conserving share (34%) within 5 points,
/// median over seeds 1-20; never-shed transitions are all delivered and pressure is back at
/// or under 0.5 within 3 s after, at 19 of 20 seeds.
///
/// Before latency was read per stream, the loop took its own shedding of the cheap stream
/// for overload (what it admitted was ever more transitions, over the target on their own)
/// and shed every position for good, pressure stuck at 1.0 after the overload, at 5 of 6
/// seeds. The one seed of 20 that still fails (17) is a queue learned at rest as the
/// upstream's latency while transitions' bursts make it fill and drain (docs/pressure.md
/// "Streams of different cost").
///
/// The issue asked for every second within 5 points: a second's transitions are a Poisson
/// count (24.6 a second, 200 ms each), whose spread alone moves the share a second leaves
/// positions by 21 points (one standard deviation), more than any shedder can follow without
/// a queue seconds long.
#[tokio::test(start_paused = true)]
async fn streams_of_different_cost_at_1_2x_are_shed_to_the_work_conserving_share() {
    let expected = work_conserving_share(1.2, 0.05);
    assert!((expected - 0.34).abs() < 0.01, "{expected}");
    let (mut shares, mut held) = (Vec::new(), 0);
    let mut lines = String::new();
    for seed in 1..=20 {
        let (s, _) = run(&[(5, 0.6), (60, 1.2), (10, 0.6)], &[0.05; 3], seed).await;
        let share = positions_shed(&s[35..65]);
        let lost: i64 = s
            .iter()
            .map(|x| {
                i64::try_from(x.never_offered).unwrap() - i64::try_from(x.never_delivered).unwrap()
            })
            .sum();
        let recovery = shedgate::demo::sim::recovery_seconds(&s, 65);
        lines += &format!(
            "seed {seed}: positions shed {:.1}%, never lost {lost}, back under 0.5 in {recovery} s\n",
            share * 100.0
        );
        shares.push(share);
        if lost == 0 && recovery <= 3 {
            held += 1;
        }
    }
    eprintln!("{lines}");
    let m = median(shares);
    assert!(
        (m - expected).abs() <= 0.05,
        "median {:.1}% against {:.1}%\n{lines}",
        m * 100.0,
        expected * 100.0
    );
    assert!(held >= 19, "held at {held} of 20 seeds\n{lines}");
}

/// At a constant 0.6 of the upstream's work capacity, the mix shifting from 95/5 to 90/10
/// (each request costing more on average, so fewer of them) is not an overload: at most 0.5%
/// of positions shed at any seed of 1-20 (a transitions' burst can fill the upstream for a
/// moment), none at most.
#[tokio::test(start_paused = true)]
async fn a_mix_that_shifts_toward_costlier_streams_is_not_shed() {
    let (mut none, mut lines) = (0, String::new());
    for seed in 1..=20 {
        let (s, _) = run(&[(10, 0.6), (30, 0.6)], &[0.05, 0.10], seed).await;
        let share = positions_shed(&s);
        lines += &format!("seed {seed}: {:.2}% shed\n", share * 100.0);
        assert!(share <= 0.005, "{lines}");
        if share == 0.0 {
            none += 1;
        }
    }
    eprintln!("{lines}");
    assert!(
        none >= 11,
        "nothing shed at only {none} of 20 seeds\n{lines}"
    );
}
