//! The shared loopback harness's traffic (`../shared/bench/run.sh` in the issue: one Berlin
//! vehicle position, rank 5, per request) in the simulator, in-process under paused time: one
//! replica with `--max-inflight 8 --latency-target 25ms` in front of 8 workers, started cold
//! or after idle seconds, its admitted p99 over the whole run (onset included) held at twice
//! the target.

use std::time::Duration;

use shedgate::demo::sim::{Figures, Replicas, ServiceTime, SimEvent};

use crate::replicas::{Run, assert_held, assert_invariants, policy};
use crate::scenarios::{figures, summary};

/// The shared harness's latency target (`--latency-target 25ms`).
const HARNESS_TARGET_MS: u64 = 25;

/// The shared loopback harness (`--max-inflight 8 --latency-target 25ms` in front of 8 workers
/// x 20 ms): one Berlin vehicle position (rank 5) per request, `factor` times capacity from a
/// cold start for 20 s. Admitted p99 over the whole run, onset included, at most twice the
/// target.
async fn harness_all_rank_5(factor: f64) {
    let (f, text) = harness_all_rank_5_with(factor, 20, 0).await;
    assert_held(&f, HARNESS_TARGET_MS, &text);
}

/// [`harness_all_rank_5`]'s run with the upstream's service time fixed at `service_ms`, after
/// `idle_s` seconds with no traffic: its invariants asserted, the figures of its overload
/// (onset included) and the per-second summary returned.
async fn harness_all_rank_5_with(factor: f64, service_ms: u64, idle_s: u64) -> (Figures, String) {
    let idle = usize::try_from(idle_s).expect("a few seconds");
    let policy = policy();
    let stream = policy.stream("vehicle.position");
    let (lat, lon) = (52.520008, 13.404954);
    let (_, rank) = policy.area_at(lat, lon);
    assert_eq!(rank.get(), 5);
    let events = vec![SimEvent {
        stream,
        never: false,
        lat,
        lon,
        rank,
        service: None,
        device: None,
    }];
    // An idle phase only when asked for: even an empty phase draws the first arrival's gap,
    // which would shift every later arrival of the runs without one.
    let load = if idle_s > 0 {
        vec![(idle_s, 0.0), (20, factor)]
    } else {
        vec![(20, factor)]
    };
    let mut run = Run::new(&load, Replicas::one(), 35);
    run.service = ServiceTime::Fixed(Duration::from_millis(service_ms));
    run.target = Duration::from_millis(HARNESS_TARGET_MS);
    run.cap = Some(8);
    let (s, capacity) = run.go(&policy, &events).await;
    let text = summary(&s, capacity);
    assert_invariants(&s, &text);
    let f = figures(
        &format!("all rank 5, {factor}x, {service_ms} ms service, the overload with its onset"),
        &s,
        idle..idle + 20,
        capacity,
    );
    (f, text)
}

#[tokio::test(start_paused = true)]
async fn the_harness_all_rank_5_traffic_at_3x_keeps_p99_within_twice_the_target() {
    harness_all_rank_5(3.0).await;
}

/// At 10x the whole-run p99 is 40 ms; it was 57 ms with the cap's gain at 4
/// (`shedgate::pressure::CAP_GAIN`), and 121 ms with the previous controller.
#[tokio::test(start_paused = true)]
async fn the_harness_all_rank_5_traffic_at_10x_keeps_p99_within_twice_the_target() {
    harness_all_rank_5(10.0).await;
}

/// A replica that has not yet seen its upstream calm holds latency at the target on latency
/// alone (`shedgate::pressure::COLD_SETPOINT`), so when the upstream's own latency without a
/// queue is at or just over the target (25, 27 and 29 ms of service against 25), shedding
/// cannot bring latency under it and the effort winds up. Until the upstream was re-measured
/// after three seconds under-used at the target (`shedgate::pressure::noload::
/// COLD_UNDER_USED_TICKS`) the replica shed nearly everything: goodput 17% and 13% at 3x and
/// 10x with 27 ms, 11% at 10x with 29 ms. That rule does not reach 25 ms (the replica keeps
/// more than half its share busy, so it is never under-used): 64–68% over seeds 1–6, until
/// the cold probe (`shedgate::pressure::probe`) found the upstream's idle workers: 94–99%.
/// Now 98.7% and 98.5% with 25 ms, 82.7% and 83.1% with 27, 95.2% and 85.5% with 29 (the
/// recovered runs oscillating): this holds them as bounds that must not get worse (0.9 and
/// 0.75; the 95% is not met at 27 and 29 ms; docs/operations.md "Sizing"). On the shared harness
/// a proxy sharing a saturated core with the upstream measures 20 ms of service as 22–25.
/// The collapses seen there (4 of 25 runs) had another cause: the proxy idled before the load
/// and counted that as calm ([`a_replica_idle_before_its_overload_meets_it_cold`]).
#[tokio::test(start_paused = true)]
async fn a_cold_replica_in_front_of_an_upstream_at_its_target_recovers_most_of_it() {
    for (service_ms, bound) in [(25, 0.9), (27, 0.75), (29, 0.75)] {
        for factor in [3.0, 10.0] {
            let (f, text) = harness_all_rank_5_with(factor, service_ms, 0).await;
            assert!(f.goodput >= bound, "goodput: {f}\n{text}");
        }
    }
}

/// A proxy started before its traffic (the shared harness starts it seconds before the load;
/// a pod is ready before the balancer sends to it) meets the overload as one started into it.
/// Idle ticks used to count as calm, so such a replica met the overload as one that had seen
/// its upstream calm: it read the queue it learned from its first answers as none, and neither
/// the cold rules nor the probe reached it. With two idle seconds before the harness's
/// overload: 10x over 20 ms of service, p99 55 ms then (over twice the target), 40 now; 3x
/// over 25 ms, goodput 89.2% then, 98.6% now (98.7% without the idle seconds). On the
/// real harness this was the collapse of one run in five or six (docs/operations.md "Sizing").
#[tokio::test(start_paused = true)]
async fn a_replica_idle_before_its_overload_meets_it_cold() {
    for factor in [3.0, 10.0] {
        let (f, text) = harness_all_rank_5_with(factor, 20, 2).await;
        assert_held(&f, HARNESS_TARGET_MS, &text);
        let (f, text) = harness_all_rank_5_with(factor, 25, 2).await;
        assert!(f.goodput >= 0.9, "goodput: {f}\n{text}");
    }
}
