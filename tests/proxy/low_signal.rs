//! The pressure controller in closed loop where its signal is thin: an upstream that stops
//! answering (no new sample replaces the last), a trickle of requests (each sample is noise),
//! and traffic that resumes after a quiet spell (the newest samples are old). Each is one of
//! the requirements of docs/pressure.md "Pressure"; like `scenarios`, the real decision and
//! controller run against a simulated upstream under paused time, with accepted ranges.

use std::time::Duration;

use shedgate::demo::sim::{Phase, ServiceTime};

use crate::scenarios::{
    TARGET_MS, assert_invariants, assert_never_shed_delivered, figures, recovery_seconds, run,
    run_with, summary,
};

#[tokio::test(start_paused = true)]
async fn a_hung_upstream_is_shed_while_it_hangs_and_not_after() {
    // From 5 s to 7 s the upstream takes 100x as long (2 s a request, so it answers next to
    // nothing), then is itself again, under 0.8x load. While it hangs nothing answers, so
    // no latency sample arrives to say so: in-flight requests must (docs/pressure.md rule 8:
    // with a queue, the latency is at least the silence). Requests started in the
    // hang end by about 9 s; from then pressure must be back at or below 0.5 within 3 s,
    // and the load that follows is not shed.
    let phases = Phase::between(Duration::from_secs(5), Duration::from_secs(7), 100.0);
    let (s, cap) = run(&[(20, 0.8)], phases, 21).await;
    let text = summary(&s, cap);
    // Not the per-second rank order: pressure goes from 0.5 to 1.0 within second 5, so that
    // second's earlier, lower-pressure part sheds priority areas less than its later part
    // sheds the default band.
    assert_never_shed_delivered(&s, &text);
    assert!(
        s[5..8].iter().any(|s| s.max_pressure >= 0.9),
        "the hang is read as overload\n{text}"
    );
    let during = figures("hang", &s, 6..8, cap);
    assert!(during.shed > 0.5, "{during}\n{text}");
    assert!(recovery_seconds(&s, 9) <= 3, "{text}");
    let after = figures("after the hang", &s, 12..20, cap);
    assert!(after.shed < 0.01, "{after}\n{text}");
}

#[tokio::test(start_paused = true)]
async fn a_trickle_to_a_noisy_upstream_is_not_shed() {
    // 0.5% of the upstream's capacity (about 2 requests a second, under
    // `FULL_CONFIDENCE_RATE`), exponential service times of mean 20 ms against a 30 ms
    // target: one sample in five is over the target, one in a hundred over three targets.
    // Each second holds a sample or two, which is noise, not a measure of the upstream
    // (docs/pressure.md rule 8: a few slow samples are noise).
    let service = ServiceTime::Exponential {
        mean: Duration::from_millis(20),
    };
    let (s, cap) = run_with(service, &[(60, 0.005)], vec![], 22).await;
    let text = summary(&s, cap);
    assert_invariants(&s, &text);
    let f = figures("trickle", &s, 0..60, cap);
    assert!(f.shed < f64::EPSILON, "{f}\n{text}");
    // At most 0.5, where nothing is shed: the latency at the target reads 0.5.
    assert!(s.iter().all(|s| s.max_pressure <= 0.5), "{text}");
}

#[tokio::test(start_paused = true)]
async fn traffic_after_a_quiet_spell_is_judged_on_new_samples() {
    // 1.5x for 5 s (the loop sheds, its windows fill with queued latencies), then nothing
    // for a second while the upstream's queue drains, then 0.8x: the overload's samples are
    // a second old and must not steer the new window (docs/pressure.md "The loop": the
    // latency restarts after a silence). From the second traffic resumes, at most the 1%
    // steady 0.8x sheds.
    let (s, cap) = run(&[(5, 0.8), (5, 1.5), (1, 0.0), (10, 0.8)], vec![], 23).await;
    let text = summary(&s, cap);
    assert_invariants(&s, &text);
    let during = figures("overload", &s, 6..10, cap);
    assert!(during.shed > 0.1, "{during}\n{text}");
    let resumed = figures("resumed", &s, 11..21, cap);
    assert!(resumed.shed < 0.01, "{resumed}\n{text}");
    assert!(
        resumed.p99_ms <= 2000.0 * Duration::from_millis(TARGET_MS).as_secs_f64(),
        "{resumed}\n{text}"
    );
}
