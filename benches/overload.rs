//! Overload benchmark over real loopback sockets: the simulator as an upstream of known
//! capacity, open-loop Poisson load at 1x, 3x and 10x of it, through (a) shedgate, (b) a
//! plain forward (shedgate's proxy path with admission off: every stream unclassified), and
//! (c) a binary shedder (tower's `ConcurrencyLimit` + `LoadShed` at the upstream's capacity).
//!
//! The events of the streams that name their device (`vehicle.position`, `sensor.reading`)
//! come from a fleet of devices, each at one place of the real geography, in turn (as the
//! demo's fleet): the fleet is sized so that each device reports every second at the case's
//! overload rate (1,080 devices at 3x, 3,600 at 10x). Per run, beside goodput, latency and the
//! shed share per rank band: the p99 over the fleet's devices of the longest silence in the
//! overload window (the longest time between two of a device's delivered fixes, or from the
//! window's start to its first, or from its last to the window's end, as the demo's dark
//! table). The table's head names the `max_silence` the policy sets (the freshness floor).
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
//!
//! `cargo bench --bench overload -- --floor-pair [--rounds N] [--max-silence D]` (N = 3,
//! D = 2s by default; about a minute a round): shedgate alone, with copies of `policies/`
//! whose sheddable streams have `max_silence` D (floor on: short enough to act within the 8 s
//! overload) and none (floor off), at 3x and 10x, round by round (on first in odd rounds, off
//! first in even ones). Per factor, floor on beside floor off: the median over rounds and the
//! spread (min–max) of goodput, p99 latency, never-shed delivered, the devices' silence p99
//! and the floor's admissions
//! (`shedgate_freshness_total`). Each run's figures go to stderr as it ends.

//!
//! `cargo bench --bench overload -- --two-upstreams [--rounds N]` (N = 3 by default; about a
//! minute a round): two upstreams of the same capacity behind one shedgate (the second named
//! `b` in a copy of the policy, every request under `/b` sent there), one offered 3x while the
//! other is offered 0.5x, then swapped; beside each, the same calm load alone. Per round and
//! upstream: the healthy one's requests not delivered and its p99 beside its solo p99, the
//! overloaded one's goodput and p99, and its recovery; then the medians.

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
use shedgate::policy::Policy;
use tokio::time::Instant;

const WORKERS: u32 = 8;
const SERVICE: Duration = Duration::from_millis(20);
const TARGET: Duration = Duration::from_millis(30);
const CLIENT_DEADLINE: Duration = Duration::from_secs(1);
const WARM: u64 = 2;
const OVERLOAD: u64 = 8;
const AFTER: u64 = 4;
/// The streams whose events come from the fleet's devices: those the example policy reads a
/// `device_id` of (as the demo's fleet).
const DEVICE_STREAMS: [&str; 2] = ["vehicle.position", "sensor.reading"];
/// How often each device of the fleet reports at the case's overload rate.
const REPORT: Duration = Duration::from_secs(1);

use shedgate::demo::sim::MIX;

#[path = "overload/binary.rs"]
mod binary;
#[path = "overload/floor_pair.rs"]
mod floor_pair;
#[path = "overload/plot.rs"]
mod plot;
#[path = "overload/replicas.rs"]
mod replicas;
#[path = "overload/summary.rs"]
mod summary;
#[path = "overload/two.rs"]
mod two;
use binary::start_binary;
use plot::plot;
use summary::{Row, calm_after, ms, recovery, summarise};

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

/// What one load run saw: per second since its start, and per device of the fleet when its
/// fixes were delivered (answered 2xx in time), seconds since the start, in no order.
struct Run {
    secs: Vec<Sec>,
    delivered: Vec<Vec<f64>>,
}

/// `n` events from the real geography with the stream `mix`, ranked by `policy`.
fn events(policy: &Policy, mix: &[(&'static str, f64)], n: usize, seed: u64) -> Vec<Ev> {
    let sim_events = shedgate::demo::sim::geographic_events(policy, mix, n, seed);
    sim_events
        .into_iter()
        .map(|e| {
            let stream = mix
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

/// The traffic of every case: the policy that ranks it and 20,000 events sampled from the
/// real geography with [`MIX`] (each request draws one).
struct Traffic {
    policy: Policy,
    evs: Vec<Ev>,
}

impl Traffic {
    fn new(policy: Policy) -> Traffic {
        let evs = events(&policy, MIX, 20_000, 5);
        Traffic { policy, evs }
    }

    /// Devices in a fleet sized so that each reports every [`REPORT`] at `factor` times
    /// `capacity` (requests of [`DEVICE_STREAMS`] go to its devices in turn).
    fn fleet_size(capacity: f64, factor: f64) -> usize {
        let share: f64 = MIX
            .iter()
            .filter(|(s, _)| DEVICE_STREAMS.contains(s))
            .map(|(_, share)| share)
            .sum();
        (capacity * factor * share * REPORT.as_secs_f64()).ceil() as usize
    }

    /// The fleet of a case at `factor` times `capacity`: its devices' streams (in
    /// [`DEVICE_STREAMS`]' shares of [`MIX`]) and places; the same fleet for the same size.
    fn fleet(&self, capacity: f64, factor: f64) -> Vec<Ev> {
        let mix: Vec<(&'static str, f64)> = MIX
            .iter()
            .filter(|(s, _)| DEVICE_STREAMS.contains(s))
            .copied()
            .collect();
        events(&self.policy, &mix, Self::fleet_size(capacity, factor), 6)
    }
}

/// The policy's freshness floor, for a table's head: the `max_silence` of each stream and
/// route that sets one, and the `freshness_share`.
fn floor_note(policy: &Policy) -> String {
    let set: Vec<String> = policy
        .streams()
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.max_silence?)))
        .chain(
            policy
                .routes()
                .iter()
                .filter_map(|r| Some((format!("route {}", r.prefix), r.max_silence?))),
        )
        .map(|(name, d)| format!("{name} {}", humantime::format_duration(d)))
        .collect();
    if set.is_empty() {
        "no max_silence: no freshness floor".to_owned()
    } else {
        format!(
            "max_silence {}; freshness_share {}",
            set.join(", "),
            policy.freshness_share()
        )
    }
}

/// The table's head on the fleet (its size at each of `factors` times `capacity`) and the
/// policy's floor ([`floor_note`]).
fn print_fleet(capacity: f64, factors: &[f64], policy: &Policy) {
    let sizes: Vec<String> = factors
        .iter()
        .map(|f| format!("{} at {f}x", Traffic::fleet_size(capacity, *f)))
        .collect();
    println!(
        "fleet: {} from devices in turn, each every {} s in the overload ({}); device silence \
         p99: over the fleet's devices, each one's longest time without a delivered fix in the \
         overload window",
        DEVICE_STREAMS.join(" and "),
        REPORT.as_secs(),
        sizes.join(", ")
    );
    println!("policy: {}", floor_note(policy));
}

/// The sum of the samples of `name` whose line contains `filter`, in Prometheus text; 0 with
/// none (an empty sum of floats is −0.0).
fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

/// Open-loop Poisson load: `phases` of (seconds, multiple of capacity), spread over `urls` in
/// turn (a round-robin balancer in front of several replicas) or at random, per request. A
/// request whose drawn event is of [`DEVICE_STREAMS`] is the next device's of `fleet`, in turn.
async fn load(
    urls: &[String],
    spread: Spread,
    capacity: f64,
    phases: &[(u64, f64)],
    (evs, fleet): (&[Ev], &[Ev]),
    seed: u64,
) -> Run {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(2048)
        .build_http();
    let total: u64 = phases.iter().map(|p| p.0).sum();
    let secs = Arc::new(Mutex::new(vec![Sec::default(); total as usize + 2]));
    let delivered = Arc::new(Mutex::new(vec![Vec::new(); fleet.len()]));
    let start = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut at = start;
    let mut phase_end = start;
    let mut tasks = Vec::new();
    let clock = Sources::system();
    let mut turn = 0usize;
    let mut next_device = 0usize;
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
            let mut ev = evs[rng.usize(..evs.len())].clone();
            let device = (DEVICE_STREAMS.contains(&ev.stream) && !fleet.is_empty()).then(|| {
                next_device = (next_device + 1) % fleet.len();
                next_device
            });
            if let Some(d) = device {
                ev = fleet[d].clone();
            }
            let id = device.and_then(|d| u32::try_from(d).ok());
            let body =
                shedgate::demo::event_body(&mut rng, ev.stream, ev.lat, ev.lon, clock.now(), id);
            let url = &urls[spread.pick(&mut turn, urls.len(), &mut rng)];
            let req = Request::post(url)
                .header("x-stream", ev.stream)
                .header("content-type", "application/json")
                .body(Full::new(body))
                .unwrap();
            let (client, secs) = (client.clone(), Arc::clone(&secs));
            let delivered = Arc::clone(&delivered);
            tasks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let second = sent.duration_since(start).as_secs() as usize;
                // Delivered: a 2xx the upstream gave (the proxy's own 202 for a stale or
                // superseded fix carries X-Shed-Reason).
                let outcome = tokio::time::timeout(CLIENT_DEADLINE, async {
                    let resp = client.request(req).await.ok()?;
                    let delivered =
                        resp.status().is_success() && !resp.headers().contains_key("x-shed-reason");
                    resp.into_body().collect().await.ok()?;
                    Some(delivered)
                })
                .await;
                let ok = matches!(outcome, Ok(Some(true)));
                if let (Some(d), true) = (device, ok) {
                    delivered.lock().unwrap()[d].push(start.elapsed().as_secs_f64());
                }
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
    let secs = secs.lock().unwrap().clone();
    let delivered = std::mem::take(&mut *delivered.lock().unwrap());
    Run { secs, delivered }
}

/// Pressure and shed share of `running`, sampled every 100 ms over a run: `(seconds since
/// the start, pressure, shed share since the last sample)`.
fn sample(running: &shedgate::app::Running) -> tokio::task::JoinHandle<Vec<(f64, f64, f64)>> {
    let gauge = Arc::clone(&running.parts.pressure);
    let metrics = Arc::clone(&running.parts.metrics);
    tokio::spawn(async move {
        let start = Instant::now();
        let mut out = Vec::new();
        let (mut last_shed, mut last_all) = (0.0, 0.0);
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let text = metrics.render();
            let shed = metric_sum(&text, "shedgate_requests_total", "outcome=\"shed\"");
            let all = metric_sum(&text, "shedgate_requests_total", "");
            let share = if all > last_all {
                (shed - last_shed) / (all - last_all)
            } else {
                0.0
            };
            (last_shed, last_all) = (shed, all);
            out.push((start.elapsed().as_secs_f64(), gauge.pressure().get(), share));
            if start.elapsed() > Duration::from_secs(WARM + OVERLOAD + AFTER) {
                return out;
            }
        }
    })
}

/// One run of `contender` at `factor` times the capacity, over a fresh upstream: shedgate
/// and the plain forward read the policy directory `dir`, the binary shedder none. Its row
/// (with the floor's admissions and denials, shedgate's `shedgate_freshness_total`), and with
/// `sampled` the pressure and shed share per 100 ms ([`sample`]).
async fn run_case(
    contender: &'static str,
    dir: &Path,
    factor: f64,
    traffic: &Traffic,
    sampled: bool,
) -> (Row, Vec<(f64, f64, f64)>) {
    let sim = Simulator::new(WORKERS, ServiceTime::Fixed(SERVICE), Vec::new(), 9);
    let capacity = sim.capacity();
    let (up, up_task) = Arc::clone(&sim).serve_http().await.unwrap();
    let upstream = format!("http://{up}");
    let mut running = None;
    let addr = if contender == "binary shedder" {
        start_binary(&upstream).await
    } else {
        let config = Config::from_args(ServeArgs {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            upstream: Some(upstream.clone()),
            policies: Some(dir.to_owned()),
            latency_target: Some(TARGET.into()),
            ..ServeArgs::default()
        })
        .unwrap();
        let (r, _) = shedgate::app::start(config, Sources::default())
            .await
            .unwrap();
        let a = r.proxy_addr;
        running = Some(r);
        a
    };
    let sampler = running.as_ref().filter(|_| sampled).map(sample);
    let url = vec![format!("http://{addr}/ingest")];
    let fleet = traffic.fleet(capacity, factor);
    let phases = [(WARM, 0.5), (OVERLOAD, factor), (AFTER, 0.5)];
    let run = load(
        &url,
        Spread::RoundRobin,
        capacity,
        &phases,
        (&traffic.evs, &fleet),
        3,
    )
    .await;
    let samples = match sampler {
        Some(s) => s.await.unwrap(),
        None => Vec::new(),
    };
    let calm = if samples.is_empty() {
        "n/a".to_owned()
    } else {
        calm_after(&samples)
    };
    let mut row = summarise(contender, factor, capacity, &run, recovery(&run.secs), calm);
    if let Some(r) = running {
        let text = r.parts.metrics.render();
        let floor = |outcome: &str| {
            metric_sum(
                &text,
                "shedgate_freshness_total",
                &format!("outcome=\"{outcome}\""),
            )
        };
        row.floor = (floor("admitted"), floor("denied"));
        r.shutdown().await;
    }
    up_task.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    (row, samples)
}

/// The default table: shedgate, the plain forward and the binary shedder at 1x, 3x and 10x;
/// the plot of shedgate's 10x run.
async fn table(root: &Path, policies: &Path, traffic: &Traffic) {
    // (b): every stream unclassified, so never shed: the proxy path with admission off.
    let open = tempfile::tempdir().unwrap();
    std::fs::write(
        open.path().join("streams.toml"),
        "[streams.\"none\"]\nsupersession = \"never\"\n",
    )
    .unwrap();
    let mut rows = Vec::new();
    let mut plot_samples = Vec::new();
    for factor in [1.0, 3.0, 10.0] {
        for contender in ["shedgate", "plain forward", "binary shedder"] {
            let ours = contender == "shedgate";
            let dir = if ours { policies } else { open.path() };
            let (row, samples) = run_case(contender, dir, factor, traffic, ours).await;
            rows.push(row);
            if factor == 10.0 && ours {
                plot_samples = samples;
            }
        }
    }
    let capacity = f64::from(WORKERS) / SERVICE.as_secs_f64();
    println!(
        "upstream: {WORKERS} workers x {} ms = {capacity:.0} req/s; latency target {} ms; client deadline {} s; load: Poisson, {}% never-shed",
        SERVICE.as_millis(),
        TARGET.as_millis(),
        CLIENT_DEADLINE.as_secs(),
        5
    );
    print_fleet(capacity, &[1.0, 3.0, 10.0], &traffic.policy);
    println!(
        "| contender | load | goodput / capacity | p50 ms | p99 ms | never delivered | shed rank 1-10 | 11-30 | 31-50 | device silence p99 s | seconds in rank order | CV admitted/s | all delivered after | pressure < 0.5 after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {}x | {:.1}% | {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {} | {} | {:.3} | {} | {} |",
            r.name,
            r.factor,
            r.goodput * 100.0,
            ms(r.p50),
            ms(r.p99),
            r.never * 100.0,
            r.bands[0] * 100.0,
            r.bands[1] * 100.0,
            r.bands[2] * 100.0,
            summary::silence(r.silence_p99),
            r.in_order,
            r.cv,
            r.recover,
            r.calm
        );
    }
    let out = root.join("docs/overload-shedgate-10x.png");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    plot(&plot_samples, &out);
    println!("plot: {}", out.display());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|n| {
                n.parse::<usize>()
                    .unwrap_or_else(|_| panic!("{name} takes a number, got {n:?}"))
            })
    };
    let replicas_arg = value("--replicas");
    let rounds = value("--rounds").unwrap_or(3).max(1);
    let pair = args.iter().any(|a| a == "--floor-pair");
    let two_upstreams = args.iter().any(|a| a == "--two-upstreams");
    let grown = args.iter().any(|a| a == "--grown");
    let load_reports = args.iter().any(|a| a == "--load-reports");
    let spread = if args.iter().any(|a| a == "--random") {
        Spread::Random
    } else {
        Spread::RoundRobin
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let policies = root.join("policies");
    let traffic = Traffic::new(shedgate::policy::load_dir(&policies).unwrap().policy);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if two_upstreams {
            two::two_upstreams(rounds, &policies, &traffic).await;
        } else if pair {
            let max_silence = args
                .iter()
                .position(|a| a == "--max-silence")
                .and_then(|i| args.get(i + 1))
                .map_or(Duration::from_secs(2), |d| {
                    humantime::parse_duration(d).expect("--max-silence takes a duration")
                });
            floor_pair::floor_pair(rounds, max_silence, &policies, &traffic).await;
        } else if replicas_arg.is_some() || grown {
            let n = replicas_arg.unwrap_or(1).max(1);
            replicas::replicas(n, spread, grown, load_reports, &policies, &traffic).await;
        } else {
            table(root, &policies, &traffic).await;
        }
    });
}
