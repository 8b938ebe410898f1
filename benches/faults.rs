//! Ack ⇒ delivered under faults, long: the harness of `tests/proxy/faults.rs` at a million
//! requests or more (the test runs 20,000). Never-shed events with unique ids through
//! shedgate while the upstream is killed and restarted, resets connections mid-response and
//! closes idle pooled connections, the policy is reloaded every 100 ms (every other file
//! broken), and shedgate is stopped and restarted on its port every 2 s.
//!
//! Run: `cargo bench --bench faults` (about two minutes on 2 cores);
//! `FAULTS_REQUESTS=N` changes the count; `-- --upstream-churn` has every other good reload
//! add an upstream the events go to and the next remove it, under load. Prints one line of figures; exits 1 if an
//! acknowledged event was not delivered, anything panicked, or requests stayed in flight.

#![allow(missing_docs, reason = "a bench binary: its items are not an API")]

#[path = "../tests/proxy/faults.rs"]
mod faults;

fn main() {
    let requests = std::env::var("FAULTS_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let churn = std::env::args().any(|a| a == "--upstream-churn");
    let report = faults::runtime().block_on(faults::run(requests, 32, churn));
    println!("{report}");
    if report.acked_not_delivered > 0 || report.panics > 0 || report.inflight_after > 0 {
        std::process::exit(1);
    }
}
