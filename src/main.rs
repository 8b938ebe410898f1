//! The `shedgate` command: `serve`, `check`, `explain`, `replay`, `preview`, `device-hash`,
//! `curve`, `demo`.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shedgate::admission;
use shedgate::clock::{Sources, UnixMillis};
use shedgate::config::{Config, HumanDuration, ServeArgs};
use shedgate::edge::rejection::Explanation;
use shedgate::extract::{self, Coordinates, EventTime, Facts};
use shedgate::policy;
use shedgate::pressure::Pressure;
use shedgate::signals::Signals;

/// jemalloc (tikv-jemallocator, as Vector uses), with a background thread that purges freed
/// pages after 1 s (`.cargo/config.toml`): the memory of closed connections goes back to the
/// system. 10,000 idle keep-alive connections (`scripts/idle-rss.py`): glibc's malloc 8.3 →
/// 153.8 MiB, still 153.8 MiB 12 s after they closed; jemalloc 10.0 → 155.9 MiB, 15.1 MiB
/// 12 s after (15.8 MiB after 5 s). Without the background thread jemalloc purged only on
/// allocator activity (96–148 MiB 20 s after). CPU per request was within the machine's
/// noise (docs/benchmark-history.md). Thread caches are garbage-collected every 1 MiB of
/// allocation activity, not every 64 KiB (`tcache_gc_incr_bytes`): about 1,500 fewer
/// instructions per request (`scripts/instructions.sh`), idle RSS unchanged.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// HTTP admission-control reverse proxy for geospatial webhook streams.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy.
    Serve(Box<ServeArgs>),
    /// Validate a policy directory offline: exit 0 valid, 1 invalid.
    Check {
        /// The policy directory.
        dir: PathBuf,
    },
    /// Print the decision for one event, and why.
    Explain(Box<ExplainArgs>),
    /// Decide an access log's requests again under a policy directory: the policy that was
    /// live reproduces every decision made under it, another is compared by stream, area and
    /// rank band.
    Replay(commands::replay::ReplayArgs),
    /// Decide a running proxy's traffic in a candidate policy's shadow for a while, then print
    /// what it would have done beside what the live policy did.
    Preview(commands::preview::PreviewArgs),
    /// Print a device id's hash as the access log writes it (`device`), with the secret file
    /// the proxy reads: select a device's lines with it.
    DeviceHash(commands::device_hash::DeviceHashArgs),
    /// Draw the policy's shed curve: shed probability against area rank, one line per
    /// pressure, with the areas and default_rank marked (PNG or SVG).
    #[cfg(feature = "plot")]
    Curve(CurveArgs),
    /// Run the self-contained demo: a fixed-capacity upstream, the proxy with a policy
    /// directory, and traffic from real geography at 1x, 4x, then 1x capacity.
    #[cfg(feature = "demo")]
    Demo(shedgate::demo::DemoArgs),
}

#[derive(Debug, clap::Args)]
struct ExplainArgs {
    /// Policy directory.
    #[arg(long, default_value = "policies")]
    policies: PathBuf,
    /// Stream name.
    #[arg(long)]
    stream: String,
    /// The route the request comes on, by its path prefix as the policy writes it: its
    /// `upstream` wins over the stream's (only where it goes is read from it: the facts still
    /// come from the stream's pointers) [default: no route].
    #[arg(long, value_name = "PREFIX")]
    route: Option<String>,
    /// A request body to read the facts from (by the stream's pointers).
    #[arg(long, conflicts_with_all = ["lat", "lon"])]
    body: Option<PathBuf>,
    /// The body's Content-Type, which picks the format's content mode as the proxy does
    /// (e.g. `application/cloudevents+json`) [default: the format's first mode].
    #[arg(long, requires = "body")]
    content_type: Option<String>,
    /// Latitude, degrees.
    #[arg(long, requires = "lon", allow_hyphen_values = true)]
    lat: Option<f64>,
    /// Longitude, degrees.
    #[arg(long, requires = "lat", allow_hyphen_values = true)]
    lon: Option<f64>,
    /// Event age in seconds (overrides the body's time).
    #[arg(long)]
    age: Option<f64>,
    /// Pressure, 0.0-1.0 (required).
    #[arg(long)]
    pressure: f64,
    /// Decide as of this time (RFC 3339, e.g. 2026-12-04T17:30:00+01:00): the schedules open
    /// then raise the pressure, and ages count from it [default: now].
    #[arg(long)]
    at: Option<String>,
    /// The random draw in [0, 1) [default: 0.5, the median draw].
    #[arg(long, default_value_t = 0.5)]
    draw: f64,
    /// The device's last admitted fix was this long ago (e.g. `40s`): decide as for a device
    /// the table remembers (docs/decision.md "Devices").
    #[arg(long, value_name = "DURATION")]
    last_admitted: Option<HumanDuration>,
    /// The device's report interval [default with a device: 5s].
    #[arg(long, value_name = "DURATION")]
    report_interval: Option<HumanDuration>,
    /// The device's credit in [0, 1) [default with a device: the draw].
    #[arg(long)]
    credit: Option<f64>,
    /// The event time of the device's newest delivered fix was this long ago: an event older
    /// than that is superseded under pressure.
    #[arg(long, value_name = "DURATION")]
    newest_delivered: Option<HumanDuration>,
    /// The upstream last took one of the device's fixes this long ago (its silence): past the
    /// stream's `max_silence`, the freshness floor admits a fix the curve sheds [default
    /// with a device: never, so silent].
    #[arg(long, value_name = "DURATION")]
    last_delivered: Option<HumanDuration>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "plot")]
#[derive(Debug, clap::Args)]
struct CurveArgs {
    /// Policy directory.
    #[arg(long, default_value = "policies")]
    policies: PathBuf,
    /// The picture to write.
    #[arg(long)]
    out: PathBuf,
    /// Pressures to draw, comma-separated, each 0.0-1.0 (one line each, at most 7)
    /// [default: 0.55,0.6,0.7,0.75,0.8,0.9].
    #[arg(long)]
    pressures: Option<String>,
    /// The x axis: `rank` (one line per pressure) or `pressure` (one line per rank that has
    /// areas; --pressures does not apply).
    #[arg(long, default_value = "rank", value_parser = ["rank", "pressure"])]
    against: String,
    /// `png` or `svg` [default: from --out's extension].
    #[arg(long)]
    format: Option<String>,
}

fn main() -> ExitCode {
    // First: a signal that came before its handler would kill the process (SIGHUP, SIGUSR1) or,
    // as PID 1, be lost (SIGTERM) (src/signals.rs).
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot handle signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse();
    init_tracing();
    if !matches!(cli.command, Command::Serve(_)) {
        signals.hangup_exits();
    }
    match cli.command {
        Command::Serve(args) => serve(*args, signals),
        Command::Check { dir } => check(&dir),
        Command::Explain(args) => explain(&args),
        Command::Replay(args) => commands::replay::run(&args),
        Command::Preview(args) => commands::preview::run(&args, &runtime(), &signals),
        Command::DeviceHash(args) => commands::device_hash::run(&args),
        #[cfg(feature = "plot")]
        Command::Curve(args) => curve(&args),
        #[cfg(feature = "demo")]
        Command::Demo(args) => runtime().block_on(shedgate::demo::run(args)),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log redirected to a file or a collector stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1)
        })
}

fn serve(args: ServeArgs, signals: Signals) -> ExitCode {
    let config = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime().block_on(shedgate::app::serve(config, signals)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (shedgate::app::StartError::Policy(_) | shedgate::app::StartError::Tls(_))) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(dir: &std::path::Path) -> ExitCode {
    match policy::load_dir(dir) {
        Ok(compiled) => {
            for w in &compiled.warnings {
                println!("{w}");
            }
            for n in &compiled.notes {
                println!("{}: note: {}", n.file.display(), n.message);
            }
            let p = &compiled.policy;
            println!(
                "{}: valid policy {}: {} streams, {} areas over {} cells, {} region positions \
                 (limit {}), {} warning(s)",
                dir.display(),
                p.version(),
                p.streams().len(),
                p.areas().len(),
                p.cell_count(),
                compiled.region_positions,
                shedgate::policy::MAX_REGION_POSITIONS,
                compiled.warnings.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Exit 0 drawn, 1 the policy is invalid or the file cannot be written, 2 a bad argument.
#[cfg(feature = "plot")]
fn curve(args: &CurveArgs) -> ExitCode {
    use shedgate::plot::{self, Format};
    let fail = |code: u8, msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(code)
    };
    let by_name = Format::from_path(&args.out);
    let format = match (&args.format, by_name) {
        (Some(flag), by_name) => match flag.parse::<Format>() {
            Ok(f) if by_name.is_none_or(|n| n == f) => f,
            Ok(f) => {
                return fail(
                    2,
                    format!(
                        "--format {f:?} but --out {} names another format",
                        args.out.display()
                    ),
                );
            }
            Err(e) => return fail(2, format!("--format: {e}")),
        },
        (None, Some(f)) => f,
        (None, None) => {
            return fail(
                2,
                format!(
                    "--out {}: name a .png or .svg file, or give --format",
                    args.out.display()
                ),
            );
        }
    };
    let view = match (args.against.as_str(), &args.pressures) {
        ("pressure", Some(_)) => {
            return fail(
                2,
                "--pressures draws the rank view; --against pressure draws every pressure"
                    .to_owned(),
            );
        }
        ("pressure", None) => plot::curve::View::ByPressure,
        (_, list) => {
            let list = list.as_deref().unwrap_or(plot::curve::DEFAULT_PRESSURES);
            match plot::curve::parse_pressures(list) {
                Ok(p) => plot::curve::View::ByRank(p),
                Err(e) => return fail(2, e.to_string()),
            }
        }
    };
    let compiled = match policy::load_dir(&args.policies) {
        Ok(c) => c,
        Err(e) => return fail(1, e.to_string()),
    };
    match plot::curve::draw(&compiled.policy, &view, &args.out, format) {
        Ok(()) => {
            println!(
                "{}: shed curve of policy {} against {}",
                args.out.display(),
                compiled.policy.version(),
                args.against
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, e.to_string()),
    }
}

/// The device history `explain` decides with, when a device flag is given.
fn device_history(
    args: &ExplainArgs,
    now: UnixMillis,
) -> Result<Option<admission::DeviceHistory>, String> {
    if args.last_admitted.is_none()
        && args.report_interval.is_none()
        && args.credit.is_none()
        && args.newest_delivered.is_none()
        && args.last_delivered.is_none()
    {
        return Ok(None);
    }
    let credit = args.credit.unwrap_or(args.draw);
    if !(0.0..1.0).contains(&credit) {
        return Err(format!("--credit must be in [0, 1), got {credit}"));
    }
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    Ok(Some(admission::DeviceHistory {
        credit,
        since_admitted_ms: args.last_admitted.map(|d| ms(d.0)),
        interval_ms: Some(ms(args
            .report_interval
            .map_or(std::time::Duration::from_secs(5), |d| d.0))),
        newest_delivered: args
            .newest_delivered
            .map(|d| UnixMillis(now.0.saturating_sub(ms(d.0)))),
        newest_position: None,
        since_delivered_ms: args.last_delivered.map(|d| ms(d.0)),
    }))
}

fn explain(args: &ExplainArgs) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(2)
    };
    let compiled = match policy::load_dir(&args.policies) {
        Ok(c) => c,
        Err(e) => return fail(e.to_string()),
    };
    let Some(pressure) = Pressure::new(args.pressure) else {
        return fail(format!(
            "--pressure must be in [0, 1], got {}",
            args.pressure
        ));
    };
    if !(0.0..1.0).contains(&args.draw) {
        return fail(format!("--draw must be in [0, 1), got {}", args.draw));
    }
    let p = &compiled.policy;
    let stream = p.stream(&args.stream);
    let route = match &args.route {
        None => None,
        Some(prefix) => match p.routes().iter().position(|r| r.prefix == *prefix) {
            Some(i) => Some(i),
            None => {
                let known: Vec<&str> = p.routes().iter().map(|r| r.prefix.as_str()).collect();
                return fail(format!(
                    "--route {prefix:?} is not a route of the policy (its routes: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        },
    };
    // The upstream the request goes to: its pressure is the one given.
    let upstream = p.upstream_of(route, stream);
    let now = match &args.at {
        None => Sources::system().now(),
        Some(text) => match text.parse::<jiff::Timestamp>() {
            Ok(t) => UnixMillis(t.as_millisecond()),
            Err(e) => return fail(format!("--at {text:?}: {e} (write RFC 3339)")),
        },
    };
    let mut facts = match (&args.body, args.lat, args.lon) {
        (Some(path), _, _) => match std::fs::read(path) {
            Ok(bytes) => {
                let mut headers = http::HeaderMap::new();
                if let Some(ct) = &args.content_type {
                    match http::HeaderValue::from_str(ct) {
                        Ok(v) => {
                            headers.insert(http::header::CONTENT_TYPE, v);
                        }
                        Err(e) => return fail(format!("--content-type: {e}")),
                    }
                }
                let reading = admission::Reading {
                    route: None,
                    known: Some(stream),
                    ambiguous: false,
                };
                admission::assess(p, reading, &headers, None, &bytes).1
            }
            Err(e) => return fail(format!("{}: {e}", path.display())),
        },
        (None, Some(lat), Some(lon)) => Facts {
            body: extract::BodyState::Unread,
            coordinates: Coordinates::new(lat, lon),
            time: EventTime::Missing,
            ambiguous: false,
            device: None,
        },
        _ => return fail("give --body FILE or --lat and --lon".into()),
    };
    if let Some(age) = args.age {
        #[expect(clippy::cast_possible_truncation, reason = "a CLI age, inside i64 ms")]
        let at = UnixMillis(now.0 - (age * 1000.0).round() as i64);
        facts.time = EventTime::At(at);
    }
    let (pressure, schedule) = admission::schedule_floor(p, now, pressure);
    let device = match device_history(args, now) {
        Ok(d) => d,
        Err(msg) => return fail(msg),
    };
    // An idle floor budget: the floor of the stream's `max_silence`, if the fix names a device.
    let max_silence = stream
        .filter(|_| device.is_some())
        .and_then(|id| p.max_silence(id, None));
    let load = admission::Load {
        floor: max_silence.map_or(admission::Floor::OFF, |max| {
            admission::Floor::idle(max, p.freshness_share(), admission::Load::IDLE.capacity)
        }),
        ..admission::Load::IDLE
    };
    let mut decision =
        admission::decide(p, stream, &facts, now, pressure, args.draw, &load, device);
    decision.schedule = schedule;
    let name = stream.map(|id| p.stream_policy(id).name.as_str());
    let explanation = Explanation::new(p, name, upstream, &decision);
    if args.json {
        match serde_json::to_string_pretty(&explanation) {
            Ok(s) => println!("{s}"),
            Err(e) => return fail(e.to_string()),
        }
        return ExitCode::SUCCESS;
    }
    let e = &explanation;
    println!(
        "decision:    {}{}",
        e.decision,
        e.would_shed
            .map(|r| format!(" (warn mode: would shed, {r})"))
            .unwrap_or_default()
    );
    println!("rule:        {}", e.reason);
    match stream {
        Some(id) => {
            let s = p.stream_policy(id);
            println!(
                "stream:      {} ({:?}, {:?}, stale after {:?})",
                s.name, s.supersession, s.mode, s.stale_after
            );
        }
        None => println!(
            "stream:      {:?} is not in the policy: never shed",
            args.stream
        ),
    }
    println!(
        "upstream:    {}{}",
        e.upstream,
        match route.filter(|&i| p.routes()[i].upstream.is_some()) {
            Some(i) => format!(" (route {}'s: --pressure is its)", p.routes()[i].prefix),
            None if stream.is_some_and(|id| p.stream_policy(id).upstream.is_some()) => {
                " (the stream's: --pressure is its)".to_owned()
            }
            None => " (--upstream: neither route nor stream names another)".to_owned(),
        }
    );
    println!("coordinates: {:?}", facts.coordinates);
    println!("area:        {} (rank {})", e.area, e.rank);
    if let Some(age) = e.age_seconds {
        println!("age:         {age:.1} s");
    }
    println!(
        "pressure:    {} (rank threshold {:.1}, band {}, ramp {})",
        e.pressure,
        policy::Curve::threshold(pressure),
        p.curve().band(),
        p.curve().ramp()
    );
    if let Some(name) = &e.schedule {
        println!(
            "schedule:    {name} is open: pressure raised from {} to its floor {}",
            args.pressure, e.pressure
        );
    }
    if let Some(d) = &e.device {
        let secs = |ms: i64| shedgate::clock::millis_to_secs(ms);
        println!(
            "device:      last admitted {} ago, reports every {}, credit {:.3}{}{}",
            d.since_admitted_ms
                .map_or("never".into(), |ms| format!("{:.1} s", secs(ms))),
            d.interval_ms
                .map_or("?".into(), |ms| format!("{:.1} s", secs(ms))),
            d.credit,
            decision
                .credit
                .map_or(String::new(), |c| format!(" -> {c:.3}")),
            d.newest_delivered.map_or(String::new(), |t| format!(
                ", newest delivered {:.1} s ago",
                secs(now.since(t))
            )),
        );
        if let Some(max) = load.floor.max_silence_ms {
            println!(
                "floor:       max_silence {:.1} s, silent {}{}",
                secs(max),
                d.since_delivered_ms
                    .map_or("since never delivered".into(), |ms| format!(
                        "{:.1} s",
                        secs(ms)
                    )),
                match decision.floor {
                    Some(admission::FloorVerdict::Admitted) => ": admitted by the floor",
                    Some(admission::FloorVerdict::Denied) => ": past it, but its budget is spent",
                    None => "",
                }
            );
        }
    }
    println!("probability: {:.3} (draw {})", e.probability, args.draw);
    println!("policy:      {}", e.policy_version);
    ExitCode::SUCCESS
}
