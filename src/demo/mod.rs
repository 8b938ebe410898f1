//! The self-contained demo (docs/operations.md "Operator tools"): an upstream of fixed capacity, the
//! proxy with a policy directory, and traffic from real geography (GeoNames cities weighted
//! by population, and rural places) at 1×, then 4×, then 1× the upstream's capacity, all
//! over loopback sockets. It prints what was delivered and shed per stream and per area.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::clock::Sources;
use crate::clock::UnixMillis;
use crate::config::{Config, ServeArgs};
use crate::policy::{self, Policy, Supersession};

pub mod floor;
pub mod geography;
pub mod sim;

use geography::{Geography, pick_stream};

/// `shedgate demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Policy directory.
    #[arg(long, default_value = "policies")]
    pub policies: PathBuf,
    /// Upstream workers (concurrent requests it serves).
    #[arg(long, default_value_t = 8)]
    pub workers: u32,
    /// Upstream service time per request, milliseconds.
    #[arg(long, default_value_t = 40)]
    pub service_ms: u64,
    /// Seconds per phase (the overload phase lasts twice as long).
    #[arg(long, default_value_t = 5)]
    pub phase_seconds: u64,
    /// Overload factor of the middle phase.
    #[arg(long, default_value_t = 4.0)]
    pub overload: f64,
    /// Random seed of the traffic.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// How often each device reports during the overload (the fleet is sized for it; at 1x
    /// its devices report `--overload` times less often), seconds.
    #[arg(long, default_value_t = 1.0)]
    pub report_seconds: f64,
    /// The freshness floor of the demo's sheddable streams, set on a copy of the policy: a
    /// duration (`3s`) or `off`; by default the policy's own (docs/decision.md "Devices").
    #[arg(long, value_parser = floor::parse_max_silence)]
    pub max_silence: Option<floor::MaxSilence>,
}

/// Stream mix of the demo traffic: (stream, share). Streams not in the policy are unknown,
/// hence never shed.
const STREAMS: &[(&str, f64)] = &[
    ("vehicle.position", 0.62),
    ("sensor.reading", 0.18),
    ("tile.render", 0.08),
    ("feature.boundary_edit", 0.04),
    ("geofence.transition", 0.05),
    ("dlq.replay", 0.02),
    ("partner.unclassified", 0.01),
];
/// Share of sheddable events sent already stale (ten minutes old).
const STALE_SHARE: f64 = 0.04;
/// Share of events from rural places (the rest: cities, weighted by population).
const RURAL_SHARE: f64 = 0.25;

/// Counts of one row of the report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Requests sent.
    pub sent: u64,
    /// Answered 2xx by the upstream.
    pub delivered: u64,
    /// Shed with 503 (pressure or disabled).
    pub shed: u64,
    /// Shed as stale (202 + `X-Shed-Reason: stale`).
    pub stale: u64,
    /// Anything else (errors, time-outs).
    pub other: u64,
}

impl Tally {
    fn add(&mut self, outcome: Result_) {
        self.sent += 1;
        match outcome {
            Result_::Delivered => self.delivered += 1,
            Result_::Shed => self.shed += 1,
            Result_::Stale => self.stale += 1,
            Result_::Other => self.other += 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Result_ {
    Delivered,
    Shed,
    Stale,
    Other,
}

/// What the demo saw: per phase (index into [`Report::phases`]), per stream and per area.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Phase names, in order.
    pub phases: Vec<&'static str>,
    /// `(phase, stream)` → counts.
    pub by_stream: BTreeMap<(usize, &'static str), Tally>,
    /// `(phase, area label)` → counts, sheddable streams only.
    pub by_area: BTreeMap<(usize, String), Tally>,
    /// Per device of the fleet: its area label and when its fixes were delivered, seconds
    /// since the demo's start.
    pub delivered: BTreeMap<u32, (String, Vec<f64>)>,
    /// When the overload phase began and ended, seconds since the start.
    pub overload: (f64, f64),
}

/// One device of the demo's fleet: a vehicle or a sensor at one place.
#[derive(Debug, Clone)]
struct Device {
    stream: &'static str,
    lat: f64,
    lon: f64,
    is_rural: bool,
}

/// Runs the demo and prints its tables. Exit code 1 if something could not start.
pub async fn run(args: DemoArgs) -> ExitCode {
    match run_demo(&args, true).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo; prints progress and the tables when `print` is set; returns the report.
///
/// # Errors
/// When the policy does not load or a listener cannot bind.
pub async fn run_demo(args: &DemoArgs, print: bool) -> Result<Report, Box<dyn std::error::Error>> {
    // Loaded first, so that an error names the operator's files rather than the copy's.
    let mut policy = policy::load_dir(&args.policies)?.policy;
    let copy = args
        .max_silence
        .map(|f| floor::policy_copy(&args.policies, f))
        .transpose()?;
    let policies = copy
        .as_ref()
        .map_or_else(|| args.policies.clone(), |c| c.path().to_owned());
    if copy.is_some() {
        policy = policy::load_dir(&policies)?.policy;
    }
    let service = Duration::from_millis(args.service_ms.max(1));
    let sim = crate::demo::sim::Simulator::new(
        args.workers.max(1),
        crate::demo::sim::ServiceTime::Fixed(service),
        Vec::new(),
        args.seed,
    );
    let (upstream_addr, upstream_task) = Arc::clone(&sim).serve_http().await?;
    let capacity = f64::from(args.workers.max(1)) / service.as_secs_f64();
    let config = Config::from_args(ServeArgs {
        listen: Some("127.0.0.1:0".parse()?),
        admin_listen: Some("127.0.0.1:0".parse()?),
        upstream: Some(format!("http://{upstream_addr}")),
        policies: Some(policies),
        latency_target: Some(Duration::from_millis(args.service_ms * 3 / 2).into()),
        upstream_timeout: Some(Duration::from_secs(5).into()),
        ..ServeArgs::default()
    })?;
    let sources = Sources::system();
    let (proxy, _) = crate::app::start(config, sources.clone()).await?;
    let geography = Geography::embedded();
    let phases = [
        ("steady", 1.0, args.phase_seconds),
        ("overload", args.overload, args.phase_seconds * 2),
        ("steady again", 1.0, args.phase_seconds),
    ];
    let say = |line: String| {
        if print {
            println!("{line}");
        }
    };
    say(format!(
        "shedgate demo: upstream {} workers x {} ms = {capacity:.0} req/s; policy {} ({} areas); \
         phases {}",
        args.workers,
        args.service_ms,
        policy.version(),
        policy.areas().len(),
        phases
            .iter()
            .map(|(n, f, s)| format!("{n} {f}x {s}s"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http();
    let report = Arc::new(Mutex::new(Report::default()));
    let mut rng = fastrand::Rng::with_seed(args.seed);
    // The fleet: as many devices as report every `--report-seconds` at the overload's rate.
    let device_share: f64 = STREAMS
        .iter()
        .filter(|(s, _)| DEVICE_STREAMS.contains(s))
        .map(|(_, share)| share)
        .sum();
    #[expect(clippy::cast_possible_truncation, reason = "a fleet of thousands")]
    #[expect(clippy::cast_sign_loss, reason = "a fleet of thousands")]
    let fleet_size = (capacity * args.overload * device_share * args.report_seconds.max(0.1))
        .ceil()
        .max(1.0) as usize;
    let fleet: Vec<Device> = (0..fleet_size)
        .map(|_| {
            let stream = pick_stream(&mut rng, &DEVICE_MIX);
            let (place, is_rural) = geography.pick(&mut rng, RURAL_SHARE);
            Device {
                stream,
                lat: (place.lat + (rng.f64() - 0.5) * 0.05).clamp(-90.0, 90.0),
                lon: (place.lon + (rng.f64() - 0.5) * 0.05).clamp(-180.0, 180.0),
                is_rural,
            }
        })
        .collect();
    let mut next_device = 0usize;
    let demo_start = Instant::now();
    let url = format!("http://{}/ingest", proxy.proxy_addr);
    let pressure = Arc::clone(&proxy.parts.pressure);
    for (phase_index, &(name, factor, secs)) in phases.iter().enumerate() {
        let rate = capacity * factor;
        let start = Instant::now();
        if phase_index == 1 {
            report.lock().unwrap_or_else(|p| p.into_inner()).overload.0 =
                demo_start.elapsed().as_secs_f64();
        }
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut pressure_sum = 0.0;
        let mut samples = 0u32;
        while start.elapsed() < Duration::from_secs(secs) {
            tick.tick().await;
            pressure_sum += pressure.pressure().get();
            samples += 1;
            #[expect(clippy::cast_possible_truncation, reason = "a count, >= 0")]
            #[expect(clippy::cast_sign_loss, reason = "a count, >= 0")]
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            while sent < due {
                sent += 1;
                let event = make_event(
                    &mut rng,
                    &geography,
                    &policy,
                    sources.now(),
                    (&fleet, &mut next_device),
                );
                let client = client.clone();
                let report = Arc::clone(&report);
                let url = url.clone();
                tokio::spawn(async move {
                    let outcome = send(&client, &url, &event).await;
                    let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                    if let (Some(d), Result_::Delivered) = (event.device, outcome) {
                        let at = demo_start.elapsed().as_secs_f64();
                        r.delivered
                            .entry(d)
                            .or_insert_with(|| (event.area.clone().unwrap_or_default(), Vec::new()))
                            .1
                            .push(at);
                    } else if let Some(d) = event.device {
                        r.delivered.entry(d).or_insert_with(|| {
                            (event.area.clone().unwrap_or_default(), Vec::new())
                        });
                    }
                    r.by_stream
                        .entry((phase_index, event.stream))
                        .or_default()
                        .add(outcome);
                    if let Some(area) = event.area {
                        r.by_area
                            .entry((phase_index, area))
                            .or_default()
                            .add(outcome);
                    }
                });
            }
        }
        if phase_index == 1 {
            report.lock().unwrap_or_else(|p| p.into_inner()).overload.1 =
                demo_start.elapsed().as_secs_f64();
        }
        say(format!(
            "  phase {name:<12} offered {:>5.0} req/s, mean pressure {:.2}",
            rate,
            pressure_sum / f64::from(samples.max(1))
        ));
    }
    // Let the last requests finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut report = report.lock().unwrap_or_else(|p| p.into_inner()).clone();
    report.phases = phases.iter().map(|p| p.0).collect();
    if print {
        print_report(&report, &policy);
        print_dark(&report, fleet_size, args);
    }
    say(format!(
        "\nmetrics: {} shed series; upstream served {} requests",
        proxy
            .parts
            .metrics
            .render()
            .lines()
            .filter(|l| l.starts_with(crate::metrics::SHED))
            .count(),
        sim.served()
    ));
    proxy.shutdown().await;
    upstream_task.abort();
    Ok(report)
}

/// The JSON body of an event of `stream` at (`lat`, `lon`) degrees, timed `at`, in the shape
/// `policies/streams.toml` reads for it: `tile.render` under `/tile` with `/requested_at`,
/// every other stream flat with `/lat`, `/lon` and `/occurred_at`.
pub fn event_body(
    rng: &mut fastrand::Rng,
    stream: &str,
    lat: f64,
    lon: f64,
    at: UnixMillis,
    device: Option<u32>,
) -> Bytes {
    let time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(at.0) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    let body = if stream == "tile.render" {
        format!(
            r#"{{"tile":{{"lat":{lat:.5},"lon":{lon:.5},"z":14}},"requested_at":"{time}","layer":"roads"}}"#
        )
    } else {
        let id = device.unwrap_or_else(|| rng.u32(100_000..1_000_000));
        format!(
            r#"{{"device_id":"dev-{id:06}","lat":{lat:.5},"lon":{lon:.5},"occurred_at":"{time}","speed_kmh":{:.1},"heading":{}}}"#,
            rng.f64() * 90.0,
            rng.u32(..360)
        )
    };
    Bytes::from(body)
}

struct Event {
    stream: &'static str,
    /// Area label for the report (sheddable streams only).
    area: Option<String>,
    body: Bytes,
    /// The fleet device that sent it, if one did.
    device: Option<u32>,
}

/// Streams whose events come from the fleet's devices (the policy reads their `device_id`).
const DEVICE_STREAMS: [&str; 2] = ["vehicle.position", "sensor.reading"];
/// The fleet's mix of those streams, as [`STREAMS`] has them.
const DEVICE_MIX: [(&str, f64); 2] = [("vehicle.position", 0.62), ("sensor.reading", 0.18)];

fn make_event(
    rng: &mut fastrand::Rng,
    geography: &Geography,
    policy: &Policy,
    now: UnixMillis,
    (fleet, next): (&[Device], &mut usize),
) -> Event {
    let drawn = pick_stream(rng, STREAMS);
    // Events of the devices' streams come from the fleet in turn (each device every
    // `--report-seconds` in the overload); the rest from anywhere.
    let device = (DEVICE_STREAMS.contains(&drawn) && !fleet.is_empty()).then(|| {
        *next = (*next + 1) % fleet.len();
        *next
    });
    let (stream, lat, lon, is_rural) = match device {
        Some(d) => {
            let f = &fleet[d];
            (f.stream, f.lat, f.lon, f.is_rural)
        }
        None => {
            let (place, is_rural) = geography.pick(rng, RURAL_SHARE);
            // Jitter within a few kilometres: vehicles are not all at the city centre.
            let lat = (place.lat + (rng.f64() - 0.5) * 0.05).clamp(-90.0, 90.0);
            let lon = (place.lon + (rng.f64() - 0.5) * 0.05).clamp(-180.0, 180.0);
            (drawn, lat, lon, is_rural)
        }
    };
    let sheddable = policy
        .stream(stream)
        .is_some_and(|id| policy.stream_policy(id).supersession == Supersession::SelfSuperseding);
    let stale = sheddable && rng.f64() < STALE_SHARE;
    let now = now.0;
    let at = if stale { now - 600_000 } else { now - 500 };
    let device = device.and_then(|d| u32::try_from(d).ok());
    let body = event_body(rng, stream, lat, lon, UnixMillis(at), device);
    let area = sheddable.then(|| {
        if stale {
            return "(stale events)".to_owned();
        }
        match policy.area_at(lat, lon) {
            (Some(id), rank) => format!("{} (rank {rank})", policy.area(id).name),
            (None, rank) if is_rural => format!("rural, unconfigured (rank {rank})"),
            (None, rank) => format!("cities, unconfigured (rank {rank})"),
        }
    });
    Event {
        stream,
        area,
        body,
        device: device.filter(|_| !stale),
    }
}

async fn send(client: &Client<HttpConnector, Full<Bytes>>, url: &str, event: &Event) -> Result_ {
    let Ok(req) = Request::post(url)
        .header("x-stream", event.stream)
        .header("content-type", "application/json")
        .body(Full::new(event.body.clone()))
    else {
        return Result_::Other;
    };
    let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(10), client.request(req)).await
    else {
        return Result_::Other;
    };
    let reason = resp
        .headers()
        .get(crate::edge::rejection::X_SHED_REASON)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    match (status.as_u16(), reason.as_deref()) {
        (_, Some("stale")) => Result_::Stale,
        (503, Some(_)) => Result_::Shed,
        (200..=299, None) => Result_::Delivered,
        _ => Result_::Other,
    }
}

/// Per area, the fleet's devices and how long they went dark in the overload: the longest
/// time between two of a device's delivered fixes (or from the phase's start to its first,
/// or from its last to the phase's end), its median and most over the area's devices, beside
/// what an even thinning at the area's shed share would leave (`interval / (1 - shed)`).
#[expect(clippy::cast_precision_loss, reason = "demo counts below 2^52")]
fn print_dark(report: &Report, fleet: usize, args: &DemoArgs) {
    let (from, to) = report.overload;
    let mut by_area: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (area, times) in report.delivered.values() {
        let mut last = from;
        let mut longest = 0.0f64;
        for &t in times.iter().filter(|t| (from..to).contains(*t)) {
            longest = longest.max(t - last);
            last = t;
        }
        by_area
            .entry(area.as_str())
            .or_default()
            .push(longest.max(to - last));
    }
    let floor = match args.max_silence {
        Some(floor::MaxSilence::On(d)) => format!("; freshness floor {:.1} s", d.as_secs_f64()),
        Some(floor::MaxSilence::Off) => "; freshness floor off".into(),
        None => String::new(),
    };
    println!(
        "\n== devices in the overload: {fleet}, each reporting every {:.1} s there{floor} ==",
        args.report_seconds
    );
    println!(
        "{:<40} {:>7} {:>14} {:>10} {:>16}",
        "area", "devices", "dark: median", "longest", "even thinning"
    );
    for (area, mut gaps) in by_area {
        gaps.sort_by(f64::total_cmp);
        let shed = report
            .by_area
            .get(&(1, area.to_owned()))
            .map_or(0.0, |t| t.shed as f64 / t.sent.max(1) as f64);
        let even = if shed < 1.0 {
            format!("{:.1} s", args.report_seconds / (1.0 - shed))
        } else {
            "-".into()
        };
        println!(
            "{area:<40} {:>7} {:>12.1} s {:>8.1} s {even:>16}",
            gaps.len(),
            gaps[gaps.len() / 2],
            gaps[gaps.len() - 1],
        );
    }
}

#[expect(clippy::cast_precision_loss, reason = "demo counts below 2^52")]
fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.1}%", n as f64 * 100.0 / of as f64)
    }
}

fn print_report(report: &Report, policy: &Policy) {
    for (i, phase) in report.phases.iter().enumerate() {
        println!("\n== phase {phase} ==");
        println!(
            "{:<40} {:>7} {:>10} {:>8} {:>8} {:>6}",
            "stream", "sent", "delivered", "shed", "stale", "other"
        );
        for ((p, stream), t) in &report.by_stream {
            if *p != i {
                continue;
            }
            let class = match policy.stream(stream) {
                Some(id) => match policy.stream_policy(id).supersession {
                    Supersession::Never => "never",
                    Supersession::SelfSuperseding => "sheddable",
                },
                None => "unknown: never",
            };
            println!(
                "{:<40} {:>7} {:>10} {:>8} {:>8} {:>6}",
                format!("{stream} ({class})"),
                t.sent,
                pct(t.delivered, t.sent),
                pct(t.shed, t.sent),
                pct(t.stale, t.sent),
                t.other
            );
        }
        println!(
            "{:<40} {:>7} {:>10} {:>8} {:>8} {:>6}",
            "area (sheddable streams)", "sent", "delivered", "shed", "stale", "other"
        );
        for ((p, area), t) in &report.by_area {
            if *p != i {
                continue;
            }
            println!(
                "{:<40} {:>7} {:>10} {:>8} {:>8} {:>6}",
                area,
                t.sent,
                pct(t.delivered, t.sent),
                pct(t.shed, t.sent),
                pct(t.stale, t.sent),
                t.other
            );
        }
    }
}
