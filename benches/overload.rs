//! Overload benchmark over real loopback sockets: the simulator as an upstream of known
//! capacity, open-loop Poisson load at 1x, 3x and 10x of it, through (a) shedgate, (b) a
//! plain forward (shedgate's proxy path with admission off: every stream unclassified), and
//! (c) a binary shedder (tower's `ConcurrencyLimit` + `LoadShed` at the upstream's capacity).
//!
//! Run: `cargo bench --bench overload` (about three minutes). Prints one table; writes
//! `docs/overload-shedgate-10x.png` (pressure and shed share per 100 ms of the 10x run, with
//! title, axis labels, ticks, legend and the overload window named; see `plot`). shedgate
//! runs as configured by default: no `--max-inflight`, only the latency target.
//!
//! `cargo bench --bench overload -- --replicas N`: N shedgate proxies (each a full
//! `app::start`, its own listener and controller) behind a round-robin spread in front of one
//! upstream, at 3x and 10x; one table. `-- --grown`: the upstream has three times the workers
//! and is offered 0.85x of that (the case where a fixed concurrency number shed 12%).
//! `-- --load-reports` (with `--replicas`): the upstream states its utilisation with every
//! answer (ORCA) and each proxy reads it (`--load-report application_utilization`).
//! `-- --random` (with `--replicas`): requests spread over the replicas at random, each on its
//! own, instead of in turn (kube-proxy's iptables mode picks a backend at random per
//! connection; many short connections make that per request).

#![allow(missing_docs, reason = "a bench binary: its items are not an API")]
#![allow(clippy::cast_precision_loss, reason = "counts below 2^52")]
#![allow(clippy::cast_possible_truncation, reason = "counts below 2^52")]
#![allow(clippy::cast_sign_loss, reason = "counts below 2^52")]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use shedgate::clock::Sources;
use shedgate::config::{Config, ServeArgs};
use shedgate::demo::sim::{ServiceTime, Simulator, Spread};
use tokio::time::Instant;

const WORKERS: u32 = 8;
const SERVICE: Duration = Duration::from_millis(20);
const TARGET: Duration = Duration::from_millis(30);
const CLIENT_DEADLINE: Duration = Duration::from_secs(1);
const WARM: u64 = 2;
const OVERLOAD: u64 = 8;
const AFTER: u64 = 4;

use shedgate::demo::sim::MIX;

#[path = "overload/binary.rs"]
mod binary;
#[path = "overload/plot.rs"]
mod plot;
#[path = "overload/summary.rs"]
mod summary;
use binary::start_binary;
use plot::plot;
use summary::{calm_after, ms, recovery, summarise};

#[derive(Clone)]
struct Ev {
    stream: &'static str,
    never: bool,
    band: usize,
    lat: f64,
    lon: f64,
}

#[derive(Default, Clone)]
struct Sec {
    sent: u64,
    ok: u64,
    by_band: [(u64, u64); 4],
    never: (u64, u64),
    lat_ms: Vec<f64>,
}

fn events(policy: &shedgate::policy::Policy) -> Vec<Ev> {
    let sim_events = shedgate::demo::sim::geographic_events(policy, MIX, 20_000, 5);
    sim_events
        .into_iter()
        .map(|e| {
            let stream = MIX
                .iter()
                .map(|(n, _)| *n)
                .find(|n| policy.stream(n) == e.stream)
                .unwrap_or("unknown");
            Ev {
                stream,
                never: e.never,
                band: shedgate::demo::sim::band(e.rank),
                lat: e.lat,
                lon: e.lon,
            }
        })
        .collect()
}

/// Open-loop Poisson load: `phases` of (seconds, multiple of capacity), spread over `urls` in
/// turn (a round-robin balancer in front of several replicas) or at random, per request.
async fn load(
    urls: &[String],
    spread: Spread,
    capacity: f64,
    phases: &[(u64, f64)],
    evs: &[Ev],
    seed: u64,
) -> Vec<Sec> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(2048)
        .build_http();
    let total: u64 = phases.iter().map(|p| p.0).sum();
    let secs = Arc::new(Mutex::new(vec![Sec::default(); total as usize + 2]));
    let start = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut at = start;
    let mut phase_end = start;
    let mut tasks = Vec::new();
    let clock = Sources::system();
    let mut turn = 0usize;
    for &(len, factor) in phases {
        phase_end += Duration::from_secs(len);
        let rate = capacity * factor;
        loop {
            at += Duration::from_secs_f64(-(1.0 - rng.f64()).ln() / rate);
            if at >= phase_end {
                at = phase_end;
                break;
            }
            tokio::time::sleep_until(at).await;
            let ev = evs[rng.usize(..evs.len())].clone();
            let body =
                shedgate::demo::event_body(&mut rng, ev.stream, ev.lat, ev.lon, clock.now(), None);
            let url = &urls[spread.pick(&mut turn, urls.len(), &mut rng)];
            let req = Request::post(url)
                .header("x-stream", ev.stream)
                .header("content-type", "application/json")
                .body(Full::new(body))
                .unwrap();
            let (client, secs) = (client.clone(), Arc::clone(&secs));
            tasks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let second = sent.duration_since(start).as_secs() as usize;
                let outcome = tokio::time::timeout(CLIENT_DEADLINE, async {
                    let resp = client.request(req).await.ok()?;
                    let status = resp.status();
                    resp.into_body().collect().await.ok()?;
                    Some(status)
                })
                .await;
                let ok = matches!(outcome, Ok(Some(s)) if s.is_success());
                let mut s = secs.lock().unwrap();
                let s = &mut s[second];
                s.sent += 1;
                if ev.never {
                    s.never.0 += 1;
                    s.never.1 += u64::from(ok);
                } else {
                    s.by_band[ev.band].0 += 1;
                    s.by_band[ev.band].1 += u64::from(!ok);
                }
                if ok {
                    s.ok += 1;
                    s.lat_ms.push(sent.elapsed().as_secs_f64() * 1e3);
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    secs.lock().unwrap().clone()
}

/// `--replicas N`: N shedgate processes' worth of proxies (each a full `app::start`, its own
/// listener and controller, no `--max-inflight`) behind a round-robin spread, in front of one
/// upstream, at 3x and 10x. `--grown`: the upstream has three times the workers and is
/// offered 0.85x of that, the case where a fixed concurrency number shed traffic the upstream
/// had room for.
async fn replicas(
    n: usize,
    spread: Spread,
    grown: bool,
    load_reports: bool,
    policies: &Path,
    evs: &[Ev],
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
    println!(
        "| replicas | load | goodput / capacity | p50 ms | p99 ms | never delivered | shed rank 1-10 | 11-30 | 31-50 | seconds in rank order | CV admitted/s | all delivered after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
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
        let secs = load(
            &urls,
            spread,
            capacity,
            &[(WARM, 0.5), (OVERLOAD, factor), (AFTER, 0.5)],
            evs,
            3,
        )
        .await;
        let r = summarise(
            "shedgate",
            factor,
            capacity,
            &secs,
            recovery(&secs),
            String::new(),
        );
        println!(
            "| {n} | {}x | {:.1}% | {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {} | {:.3} | {} |",
            r.factor,
            r.goodput * 100.0,
            ms(r.p50),
            ms(r.p99),
            r.never * 100.0,
            r.bands[0] * 100.0,
            r.bands[1] * 100.0,
            r.bands[2] * 100.0,
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let replicas_arg = args
        .iter()
        .position(|a| a == "--replicas")
        .and_then(|i| args.get(i + 1))
        .map(|n| {
            n.parse::<usize>()
                .expect("--replicas takes a number of replicas")
        });
    let grown = args.iter().any(|a| a == "--grown");
    let load_reports = args.iter().any(|a| a == "--load-reports");
    let spread = if args.iter().any(|a| a == "--random") {
        Spread::Random
    } else {
        Spread::RoundRobin
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if replicas_arg.is_some() || grown {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let policies = root.join("policies");
            let policy = shedgate::policy::load_dir(&policies).unwrap().policy;
            let n = replicas_arg.unwrap_or(1).max(1);
            replicas(n, spread, grown, load_reports, &policies, &events(&policy)).await;
            return;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let policies = root.join("policies");
        let policy = shedgate::policy::load_dir(&policies).unwrap().policy;
        let evs = events(&policy);
        // (b): every stream unclassified, so never shed: the proxy path with admission off.
        let open = tempfile::tempdir().unwrap();
        std::fs::write(open.path().join("streams.toml"), "[streams.\"none\"]\nsupersession = \"never\"\n").unwrap();
        let mut rows = Vec::new();
        let mut plot_samples = Vec::new();
        for factor in [1.0, 3.0, 10.0] {
            for contender in ["shedgate", "plain forward", "binary shedder"] {
                let sim = Simulator::new(WORKERS, ServiceTime::Fixed(SERVICE), Vec::new(), 9);
                let capacity = sim.capacity();
                let (up, up_task) = Arc::clone(&sim).serve_http().await.unwrap();
                let upstream = format!("http://{up}");
                let mut running = None;
                let addr = match contender {
                    "binary shedder" => start_binary(&upstream).await,
                    _ => {
                        let dir = if contender == "shedgate" { policies.clone() } else { open.path().to_owned() };
                        let config = Config::from_args(ServeArgs {
                            listen: Some("127.0.0.1:0".parse().unwrap()),
                            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
                            upstream: Some(upstream.clone()),
                            policies: Some(dir),
                            latency_target: Some(TARGET.into()),
                            ..ServeArgs::default()
                        })
                        .unwrap();
                        let (r, _) = shedgate::app::start(config, Sources::default()).await.unwrap();
                        let a = r.proxy_addr;
                        running = Some(r);
                        a
                    }
                };
                // Pressure and shed share, sampled every 100 ms (shedgate at 10x: the plot).
                let sampler = running
                    .as_ref()
                    .filter(|_| contender == "shedgate")
                    .map(|r| {
                    let gauge = Arc::clone(&r.parts.pressure);
                    let metrics = Arc::clone(&r.parts.metrics);
                    tokio::spawn(async move {
                        let start = Instant::now();
                        let mut out = Vec::new();
                        let (mut last_shed, mut last_all) = (0.0, 0.0);
                        loop {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            let text = metrics.render();
                            let sum = |name: &str, filter: &str| -> f64 {
                                text.lines()
                                    .filter(|l| l.starts_with(name) && l.contains(filter))
                                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                                    .sum()
                            };
                            let shed = sum("shedgate_requests_total", "outcome=\"shed\"");
                            let all = sum("shedgate_requests_total", "");
                            let share = if all > last_all { (shed - last_shed) / (all - last_all) } else { 0.0 };
                            (last_shed, last_all) = (shed, all);
                            out.push((start.elapsed().as_secs_f64(), gauge.pressure().get(), share));
                            if start.elapsed() > Duration::from_secs(WARM + OVERLOAD + AFTER) {
                                return out;
                            }
                        }
                    })
                });
                let url = vec![format!("http://{addr}/ingest")];
                let secs = load(&url, Spread::RoundRobin, capacity, &[(WARM, 0.5), (OVERLOAD, factor), (AFTER, 0.5)], &evs, 3).await;
                let samples = match sampler {
                    Some(s) => s.await.unwrap(),
                    None => Vec::new(),
                };
                let calm = if samples.is_empty() { "n/a".to_owned() } else { calm_after(&samples) };
                rows.push(summarise(contender, factor, capacity, &secs, recovery(&secs), calm));
                if factor == 10.0 && contender == "shedgate" {
                    plot_samples = samples;
                }
                if let Some(r) = running {
                    r.shutdown().await;
                }
                up_task.abort();
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        println!(
            "upstream: {WORKERS} workers x {} ms = {:.0} req/s; latency target {} ms; client deadline {} s; load: Poisson, {}% never-shed",
            SERVICE.as_millis(),
            f64::from(WORKERS) / SERVICE.as_secs_f64(),
            TARGET.as_millis(),
            CLIENT_DEADLINE.as_secs(),
            5
        );
        println!("| contender | load | goodput / capacity | p50 ms | p99 ms | never delivered | shed rank 1-10 | 11-30 | 31-50 | seconds in rank order | CV admitted/s | all delivered after | pressure < 0.5 after |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {}x | {:.1}% | {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {} | {:.3} | {} | {} |",
                r.name, r.factor, r.goodput * 100.0, ms(r.p50), ms(r.p99), r.never * 100.0,
                r.bands[0] * 100.0, r.bands[1] * 100.0, r.bands[2] * 100.0, r.in_order, r.cv,
                r.recover, r.calm
            );
        }
        let out = root.join("docs/overload-shedgate-10x.png");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        plot(&plot_samples, &out);
        println!("plot: {}", out.display());
    });
}
