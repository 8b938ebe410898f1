//! The pressure controller in closed loop, in-process under paused time: the real decision
//! and controller against a simulated upstream of known capacity, with seeded arrivals of
//! events from real geography. Each scenario asserts accepted ranges, not exact values.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use shedgate::pressure::ControllerConfig;
use shedgate::sim::{
    Figures, Phase, Scenario, Second, ServiceTime, Simulator, geographic_events, run_scenario,
};

use shedgate::sim::MIX;

const WORKERS: u32 = 8;
const SERVICE_MS: u64 = 20;
const TARGET_MS: u64 = 30;

fn policy() -> Arc<shedgate::policy::Policy> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    Arc::new(shedgate::policy::load_dir(&dir).unwrap().policy)
}

fn sim(phases: Vec<Phase>, seed: u64) -> Arc<Simulator> {
    Simulator::new(
        WORKERS,
        ServiceTime::Uniform {
            min: Duration::from_millis(SERVICE_MS / 2),
            max: Duration::from_millis(SERVICE_MS * 3 / 2),
        },
        phases,
        seed,
    )
}

pub(crate) async fn run(load: &[(u64, f64)], phases: Vec<Phase>, seed: u64) -> (Vec<Second>, f64) {
    let policy = policy();
    let events = geographic_events(&policy, MIX, 20_000, seed);
    let sim = sim(phases, seed);
    let scenario = Scenario {
        load: load
            .iter()
            .map(|(s, f)| (Duration::from_secs(*s), *f))
            .collect(),
        controller: ControllerConfig {
            max_inflight: NonZeroU32::new(WORKERS).unwrap(),
            latency_target: Duration::from_millis(TARGET_MS),
        },
        timeout: Duration::from_secs(1),
        seed,
    };
    let capacity = sim.capacity();
    (
        run_scenario(&scenario, &sim, &policy, &events).await,
        capacity,
    )
}

fn summary(seconds: &[Second], capacity: f64) -> String {
    seconds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{i:>2}s offered {:>5} admitted {:>5} goodput {:>4.0}% never {}/{} shed/band {:?} of {:?} p {:.2}/{:.2}\n",
                s.offered,
                s.admitted,
                s.goodput as f64 * 100.0 / capacity,
                s.never_delivered,
                s.never_offered,
                s.shed_by_band,
                s.offered_by_band,
                s.max_pressure,
                s.end_pressure
            )
        })
        .collect()
}

/// The figures of `seconds[window]`, printed (`cargo test scenarios -- --nocapture`).
fn figures(
    name: &str,
    seconds: &[Second],
    window: std::ops::Range<usize>,
    capacity: f64,
) -> Figures {
    let f = Figures::of(seconds, window.clone(), capacity);
    eprintln!("{name} [{}..{}s]: {f}", window.start, window.end);
    f
}

fn share(n: u64, of: u64) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

/// Never-shed events are all delivered, and in every second priority areas lose no larger a
/// share than default ones (rank bands in order).
fn assert_invariants(seconds: &[Second], text: &str) {
    let (never_offered, never_delivered) = seconds.iter().fold((0, 0), |(o, d), s| {
        (o + s.never_offered, d + s.never_delivered)
    });
    assert_eq!(
        never_delivered, never_offered,
        "never-shed delivery\n{text}"
    );
    for (i, s) in seconds.iter().enumerate() {
        let shares: Vec<f64> = (0..4)
            .map(|b| share(s.shed_by_band[b], s.offered_by_band[b]))
            .collect();
        // Bands with traffic only; a band is never shed more than a less important one.
        let present: Vec<f64> = (0..4)
            .filter(|b| s.offered_by_band[*b] > 0)
            .map(|b| shares[b])
            .collect();
        // Within an instant the shed probability is monotone in rank; over a second whose
        // pressure moved, and with few priority events, sampling noise remains: 0.1 slack.
        for w in present.windows(2) {
            assert!(
                w[0] <= w[1] + 0.1,
                "second {i}: shed share by band {shares:?}\n{text}"
            );
        }
    }
}

/// Seconds from the end of the overload until pressure is below 0.5 at a second's end.
fn recovery_seconds(seconds: &[Second], overload_end: usize) -> usize {
    seconds[overload_end..]
        .iter()
        .position(|s| s.end_pressure < 0.5)
        .unwrap_or(usize::MAX)
}

#[tokio::test(start_paused = true)]
async fn steady_below_capacity_sheds_next_to_nothing() {
    let (s, cap) = run(&[(20, 0.8)], vec![], 11).await;
    let text = summary(&s, cap);
    figures("0.8x", &s, 0..20, cap);
    eprintln!("{text}");
    assert_invariants(&s, &text);
    let offered: u64 = s
        .iter()
        .map(|s| s.offered_by_band.iter().sum::<u64>())
        .sum();
    let shed: u64 = s.iter().map(|s| s.shed_by_band.iter().sum::<u64>()).sum();
    // Accepted range: under 5%. Random arrivals at 80% of capacity queue now and then, and
    // the controller reads that as full use (the target is none: issue 4 is open on it).
    assert!(
        share(shed, offered) < 0.05,
        "{shed} of {offered} shed\n{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn step_to_3x_keeps_the_upstream_busy_and_recovers() {
    let (s, cap) = run(&[(5, 0.8), (15, 3.0), (5, 0.8)], vec![], 12).await;
    let text = summary(&s, cap);
    figures("3x", &s, 7..20, cap);
    eprintln!("3x recovery {}", recovery_seconds(&s, 20));
    assert_invariants(&s, &text);
    // Steady overload (skip the first two seconds of the step).
    let goodput: u64 = s[7..20].iter().map(|s| s.goodput).sum();
    let share_of_capacity = goodput as f64 / (13.0 * cap);
    assert!(
        share_of_capacity > 0.70,
        "goodput {share_of_capacity:.2} of capacity\n{text}"
    );
    // Priority areas (rank <= 10) are not shed at 3x.
    let priority: u64 = s[5..20].iter().map(|s| s.shed_by_band[0]).sum();
    assert_eq!(priority, 0, "{text}");
    assert!(recovery_seconds(&s, 20) <= 3, "{text}");
}

#[tokio::test(start_paused = true)]
async fn step_to_10x_sheds_in_rank_order_and_recovers() {
    let (s, cap) = run(&[(5, 0.8), (15, 10.0), (5, 0.8)], vec![], 13).await;
    let text = summary(&s, cap);
    figures("10x", &s, 7..20, cap);
    figures("10x onset", &s, 5..7, cap);
    eprintln!("10x recovery {}", recovery_seconds(&s, 20));
    assert_invariants(&s, &text);
    let goodput: u64 = s[7..20].iter().map(|s| s.goodput).sum();
    let share_of_capacity = goodput as f64 / (13.0 * cap);
    assert!(
        share_of_capacity > 0.60,
        "goodput {share_of_capacity:.2} of capacity\n{text}"
    );
    assert!(recovery_seconds(&s, 20) <= 3, "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_spike_then_recovery() {
    let (s, cap) = run(&[(5, 0.8), (3, 5.0), (10, 0.8)], vec![], 14).await;
    let text = summary(&s, cap);
    figures("spike", &s, 5..8, cap);
    eprintln!("spike recovery {}", recovery_seconds(&s, 8));
    assert_invariants(&s, &text);
    assert!(
        s[5..8].iter().any(|s| s.max_pressure > 0.5),
        "the spike raised pressure\n{text}"
    );
    assert!(recovery_seconds(&s, 8) <= 3, "{text}");
}

#[tokio::test(start_paused = true)]
async fn upstream_at_half_speed_under_constant_load() {
    // 0.8x of the original capacity is 1.6x of the slowed one.
    let slow = Phase {
        from: Duration::from_secs(5),
        slowdown: 2.0,
        fail_rate: 0.0,
    };
    let (s, cap) = run(&[(20, 0.8)], vec![slow], 15).await;
    let text = summary(&s, cap);
    figures("half speed", &s, 7..20, cap / 2.0);
    assert_invariants(&s, &text);
    assert!(
        s[6..20].iter().all(|s| s.max_pressure > 0.5),
        "the slowdown is seen\n{text}"
    );
    // Nothing fails: what is admitted completes (no time-outs, no runaway queue).
    let failed: u64 = s.iter().map(|s| s.failed).sum();
    assert_eq!(failed, 0, "{text}");
}
