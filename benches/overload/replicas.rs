//! The overload bench's `--replicas N` and `--grown` (a module of `benches/overload.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shedgate::clock::Sources;
use shedgate::config::{Config, ServeArgs};
use shedgate::demo::sim::{ServiceTime, Simulator, Spread};

use super::summary::{ms, recovery, summarise};
use super::{AFTER, OVERLOAD, SERVICE, TARGET, Traffic, WARM, WORKERS, load, print_fleet};

/// `--replicas N`: N shedgate processes' worth of proxies (each a full `app::start`, its own
/// listener and controller, no `--max-inflight`) behind a round-robin spread, in front of one
/// upstream, at 3x and 10x. `--grown`: the upstream has three times the workers and is
/// offered 0.85x of that, the case where a fixed concurrency number shed traffic the upstream
/// had room for.
pub(crate) async fn replicas(
    n: usize,
    spread: Spread,
    grown: bool,
    load_reports: bool,
    policies: &Path,
    traffic: &Traffic,
) {
    let workers = if grown { 3 * WORKERS } else { WORKERS };
    let factors: &[f64] = if grown { &[0.85] } else { &[3.0, 10.0] };
    println!(
        "upstream: {workers} workers x {} ms = {:.0} req/s; latency target {} ms; {n} replica(s), {}, no --max-inflight{}",
        SERVICE.as_millis(),
        f64::from(workers) / SERVICE.as_secs_f64(),
        TARGET.as_millis(),
        match spread {
            Spread::RoundRobin => "round robin",
            Spread::Random => "spread at random per request",
            Spread::ByDevice => "by device",
        },
        if load_reports {
            "; load reports read (--load-report application_utilization)"
        } else {
            ""
        },
    );
    print_fleet(
        f64::from(workers) / SERVICE.as_secs_f64(),
        factors,
        &traffic.policy,
    );
    println!(
        "| replicas | load | goodput / capacity | p50 ms | p99 ms | never delivered | shed rank 1-10 | 11-30 | 31-50 | device silence p99 s | seconds in rank order | CV admitted/s | all delivered after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &factor in factors {
        let sim = Simulator::new(workers, ServiceTime::Fixed(SERVICE), Vec::new(), 9);
        let capacity = sim.capacity();
        let (up, up_task) = Arc::clone(&sim)
            .serve_http_with(load_reports)
            .await
            .unwrap();
        let mut running = Vec::new();
        for _ in 0..n {
            let config = Config::from_args(ServeArgs {
                listen: Some("127.0.0.1:0".parse().unwrap()),
                admin_listen: Some("127.0.0.1:0".parse().unwrap()),
                upstream: Some(format!("http://{up}")),
                policies: Some(policies.to_owned()),
                latency_target: Some(TARGET.into()),
                load_report: load_reports.then(|| "application_utilization".to_owned()),
                ..ServeArgs::default()
            })
            .unwrap();
            let (r, _) = shedgate::app::start(config, Sources::default())
                .await
                .unwrap();
            running.push(r);
        }
        let urls: Vec<String> = running
            .iter()
            .map(|r| format!("http://{}/ingest", r.proxy_addr))
            .collect();
        let fleet = traffic.fleet(capacity, factor);
        let run = load(
            &urls,
            spread,
            capacity,
            &[(WARM, 0.5), (OVERLOAD, factor), (AFTER, 0.5)],
            (&traffic.evs, &fleet),
            3,
        )
        .await;
        let r = summarise(
            "shedgate",
            factor,
            capacity,
            &run,
            recovery(&run.secs),
            String::new(),
        );
        println!(
            "| {n} | {}x | {:.1}% | {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {} | {} | {:.3} | {} |",
            r.factor,
            r.goodput * 100.0,
            ms(r.p50),
            ms(r.p99),
            r.never * 100.0,
            r.bands[0] * 100.0,
            r.bands[1] * 100.0,
            r.bands[2] * 100.0,
            super::summary::silence(r.silence_p99),
            r.in_order,
            r.cv,
            r.recover
        );
        for r in running {
            r.shutdown().await;
        }
        up_task.abort();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
