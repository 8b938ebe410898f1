//! Replay speed (docs/operations.md "Replay and preview"): one million access-log lines, as the
//! proxy's writer formats them, replayed on one thread under the policy they were decided with
//! (every decision checked to the bit) and under another (compared by stream, area and band).
//!
//! The lines: the repository's `policies/`, points spread over Europe, pressures 0.5–1.0,
//! devices with histories, a fifth of them `never` bodies streamed through unread, one in fifty
//! a rejection. Written to a temporary file first (about 0.5 GB), then read back through the
//! page cache as `shedgate replay` reads it.
//!
//! Run: `cargo bench --bench replay` (about half a minute once built). One core:
//! `taskset -c 0 cargo bench --bench replay`.

#![allow(missing_docs, reason = "a bench binary: its items are not an API")]
#![allow(clippy::cast_precision_loss, reason = "counts below 2^52")]
#![allow(clippy::disallowed_methods, reason = "a bench measures wall time")]

use std::io::Write as _;
use std::sync::Arc;

use shedgate::admission::{DeviceHistory, Load, decide};
use shedgate::clock::UnixMillis;
use shedgate::extract::{BodyState, Coordinates, EventTime, Facts};
use shedgate::live::store::Snapshot;
use shedgate::metrics::{Metrics, Outcome};
use shedgate::pressure::Pressure;
use shedgate::record::format::{Format, Formatter};
use shedgate::record::replay::Run;
use shedgate::record::{Decided, Entry, Note};

const LINES: usize = 1_000_000;

#[expect(clippy::too_many_lines, reason = "one bench, start to end")]
fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let policy = shedgate::policy::load_dir(&dir)
        .expect("policies/ compiles")
        .policy;
    let snapshot = Arc::new(Snapshot::new(&Arc::new(Metrics::new()), policy));
    let policy = &snapshot.policy;
    let sheddable = policy
        .streams()
        .iter()
        .position(|s| s.supersession == shedgate::policy::Supersession::SelfSuperseding)
        .and_then(|i| policy.stream(&policy.streams()[i].name))
        .expect("a sheddable stream");
    let never = policy
        .streams()
        .iter()
        .position(|s| s.supersession == shedgate::policy::Supersession::Never)
        .and_then(|i| policy.stream(&policy.streams()[i].name));
    let format_of = |with_key: bool| Format {
        replica: "bench".into(),
        full_peer: false,
        device_key: shedgate::record::privacy::DeviceKey::new(b"a bench secret of 32 bytes......")
            .ok()
            .filter(|_| with_key),
    };
    let mut formatter = Formatter::new(format_of(true));
    let format_only = std::env::var_os("FORMAT_ONLY").is_some();
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file.reopen().unwrap());
    let mut rng = fastrand::Rng::with_seed(7);
    let start = UnixMillis(1_780_000_000_000);
    let mut buf = Vec::with_capacity(1024);
    let written = std::time::Instant::now();
    let mut formatted = std::time::Duration::ZERO;
    for i in 0..if format_only { 0 } else { LINES } {
        let at = UnixMillis(start.0 + i as i64 / 10);
        let kind = rng.u32(0..100);
        let mut note = Note::default();
        if kind < 2 {
            note.outcome = Some(Outcome::Rejected);
            note.reason = Some("payload-too-large");
        } else if kind < 22 {
            note.stream = never;
            note.rule = Some(shedgate::admission::Rule::NeverShed);
        } else {
            let facts = Facts {
                body: BodyState::Json,
                coordinates: Coordinates::new(rng.f64() * 20.0 + 40.0, rng.f64() * 30.0 - 5.0),
                time: EventTime::At(UnixMillis(at.0 - i64::from(rng.u32(0..90_000)))),
                ambiguous: false,
                device: None,
            };
            let pressure = Pressure::new(0.5 + rng.f64() / 2.0).unwrap();
            let history = DeviceHistory {
                credit: rng.f64(),
                since_admitted_ms: Some(i64::from(rng.u32(0..60_000))),
                interval_ms: Some(5_000),
                newest_delivered: Some(UnixMillis(at.0 - 60_000)),
                newest_position: None,
                since_delivered_ms: Some(i64::from(rng.u32(0..60_000))),
            };
            let (draw, load) = (rng.f64(), Load::IDLE);
            let decision = decide(
                policy,
                Some(sheddable),
                &facts,
                at,
                pressure,
                draw,
                &load,
                Some(history),
            );
            note.stream = Some(sheddable);
            note.rule = Some(decision.rule);
            note.facts = Some(facts);
            note.device = Some(format!("truck-{}", rng.u32(0..100_000)).into_boxed_str());
            note.decided = Some(Decided {
                decision,
                now: at,
                local: at,
                pressure_raw: pressure,
                pinned: true,
                draw,
                load,
                buffered: 0,
                history: Some(history),
            });
        }
        let entry = Entry {
            id: i as u64,
            at,
            peer: Some(std::net::IpAddr::from([10, 1, 2, 3])),
            method: Some(http::Method::POST),
            target: Some(http::Uri::from_static("/ingest")),
            message_id: None,
            snapshot: Arc::clone(&snapshot),
            note,
            status: 200,
            upstream: Some(std::time::Duration::from_millis(12)),
            response_bytes: Some(0),
            sample: 1.0,
        };
        buf.clear();
        let formatting = std::time::Instant::now();
        formatter.write(&entry, &mut buf);
        formatted += formatting.elapsed();
        out.write_all(&buf).unwrap();
    }
    out.flush().unwrap();
    drop(out);
    let bytes = std::fs::metadata(file.path()).unwrap().len();
    println!(
        "wrote {LINES} lines ({:.0} MB, {:.0} bytes a line) in {:.2} s: {:.2} µs a line to \
         format (the writer thread's work per request)",
        bytes as f64 / 1e6,
        bytes as f64 / LINES as f64,
        written.elapsed().as_secs_f64(),
        formatted.as_secs_f64() * 1e6 / LINES as f64
    );

    let replay = |policy: &shedgate::policy::Policy, what: &str| {
        let started = std::time::Instant::now();
        let reader =
            std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file.path()).unwrap());
        let run = Run::read(reader, policy).expect("the log reads");
        let secs = started.elapsed().as_secs_f64();
        assert!(run.passed(), "{}", run.text("bench"));
        println!(
            "replayed {} lines {what} in {secs:.2} s: {:.0} lines/s, {:.2} µs a line \
             ({} reproduced, {} compared, {} unread, {} outside)",
            run.replay.stats.lines,
            run.replay.stats.lines as f64 / secs,
            secs * 1e6 / run.replay.stats.lines as f64,
            run.replay.stats.reproduced,
            run.replay.stats.compared,
            run.replay.stats.unread,
            run.replay.stats.outside,
        );
    };
    // One shed line, the commonest under overload, formatted over and over.
    let shed = {
        let facts = Facts {
            body: BodyState::Json,
            coordinates: Coordinates::new(48.1372, 11.5756),
            time: EventTime::At(UnixMillis(start.0 - 1000)),
            ambiguous: false,
            device: None,
        };
        let pressure = Pressure::new(0.8).unwrap();
        let history = DeviceHistory::new(0.3);
        let decision = decide(
            policy,
            Some(sheddable),
            &facts,
            start,
            pressure,
            0.5,
            &Load::IDLE,
            Some(history),
        );
        Entry {
            id: 42,
            at: start,
            peer: Some(std::net::IpAddr::from([10, 1, 2, 3])),
            method: Some(http::Method::POST),
            target: Some(http::Uri::from_static("/ingest")),
            message_id: None,
            snapshot: Arc::clone(&snapshot),
            note: Note {
                stream: Some(sheddable),
                upstream: Some(shedgate::policy::UpstreamId::DEFAULT),
                outcome: Some(Outcome::Shed),
                reason: Some("pressure"),
                rule: Some(decision.rule),
                facts: Some(facts),
                decided: Some(Decided {
                    decision,
                    now: start,
                    local: start,
                    pressure_raw: pressure,
                    pinned: true,
                    draw: 0.5,
                    load: Load::IDLE,
                    buffered: 0,
                    history: Some(history),
                }),
                device: Some("veh-0042".into()),
                device_untrusted: None,
                request_bytes: Some(312),
            },
            status: 503,
            upstream: None,
            response_bytes: Some(250),
            sample: 1.0,
        }
    };
    for (with_key, what) in [(true, "with a device key"), (false, "without")] {
        let mut formatter = Formatter::new(format_of(with_key));
        let started = std::time::Instant::now();
        let n = if format_only { 5_000_000 } else { 200_000 };
        for _ in 0..n {
            buf.clear();
            formatter.write(&shed, &mut buf);
        }
        println!(
            "one shed line ({} bytes), {what}: {:.3} µs to format",
            buf.len(),
            started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
    }
    if format_only {
        return;
    }
    replay(policy, "under their own policy");
    let mut other = shedgate::policy::PolicyFiles::read(&dir).unwrap().files();
    let areas = other.get("areas.toml").cloned().unwrap_or_default();
    other.insert("areas.toml".into(), areas + "\n# another version\n");
    let other = shedgate::policy::compile(
        &shedgate::policy::PolicyFiles::from_files(&dir, &other).unwrap(),
    )
    .unwrap()
    .policy;
    replay(&other, "under another policy");
}
