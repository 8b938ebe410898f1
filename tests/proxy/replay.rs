//! `shedgate replay` on logs the proxy wrote over real sockets: every decision comes out the
//! same under its own policy; another areas file gives the deltas worked out by hand; bodies
//! never read are undecidable under a policy that needs them.

use std::path::Path;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use shedgate::record::replay::Run;

use super::access_log::{BERLIN_LOW, STREAMS, fix, lines, logged, secret};
use super::support::*;

/// Places spread over Europe: Berlin, Munich and a few dozen points around them, so that
/// several cells, both areas and both bands are decided.
fn places() -> Vec<(f64, f64)> {
    let mut places = vec![BERLIN, MUNICH];
    for i in 0..40 {
        let f = f64::from(i);
        places.push((48.0 + (f * 0.37) % 6.0, 8.0 + (f * 0.53) % 9.0));
    }
    places
}

fn compiled(dir: &Path) -> shedgate::policy::Policy {
    shedgate::policy::load_dir(dir)
        .expect("policy compiles")
        .policy
}

/// An overload run under the live policy (pressure pinned at 0.6, 0.75 and 0.9 in turn,
/// devices reporting, stale and superseded fixes, `never` events), then its log replayed:
/// every decision made again identically, through the library and through the command.
#[tokio::test]
async fn a_recorded_overload_replays_exactly_under_its_own_policy() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_LOW));
    let dir = tempfile::tempdir().unwrap();
    let (secret_file, _) = secret(dir.path());
    let log = dir.path().join("access.log");
    let proxy = logged(&upstream.url(), policy.path(), &log, Some(secret_file)).await;
    let places = places();
    let mut sent = 0;
    for (round, pressure) in [0.6, 0.75, 0.9].into_iter().enumerate() {
        pin(&proxy, pressure).await;
        for (i, at) in places.iter().enumerate() {
            let device = format!("truck-{}", i % 12);
            let age = [5, 2, 400, 1][(i + round) % 4];
            post(&proxy, "vehicle.position", fix(&device, *at, age)).await;
            post(&proxy, "geofence.transition", r#"{"lat":1,"lon":2}"#).await;
            sent += 2;
            if i % 7 == 0 {
                // A sender without an id of its own: decided as naming no device.
                post(&proxy, "vehicle.position", fix("unknown", *at, age)).await;
                sent += 1;
            }
        }
    }
    proxy.shutdown().await;
    let written = lines(&log);
    assert_eq!(written.len(), sent);
    let decided = written.iter().filter(|l| l.get("draw").is_some()).count();
    for reason in ["pressure", "stale"] {
        assert!(
            written.iter().any(|l| l["reason"] == reason),
            "no {reason} shed in the run"
        );
    }
    // A truck's fixes hop across Europe seconds apart: another sender on its id, each time
    // decided without its history, as the placeholder's are; replay takes the line's word.
    for why in ["placeholder", "implausible"] {
        let untrusted: Vec<_> = written
            .iter()
            .filter(|l| l["device_untrusted"] == why)
            .collect();
        assert!(!untrusted.is_empty(), "no {why} id in the run");
        assert!(
            untrusted.iter().all(|l| l.get("device_history").is_none()),
            "{why}"
        );
    }

    let live = compiled(policy.path());
    let file = std::fs::File::open(&log).unwrap();
    let run = Run::read(std::io::BufReader::new(file), &live).unwrap();
    assert!(run.errors.is_empty(), "{:?}", run.errors);
    let stats = run.replay.stats;
    assert_eq!(stats.mismatched, 0, "{:#?}", run.replay.mismatches);
    assert_eq!(usize::try_from(stats.reproduced).unwrap(), decided);
    assert_eq!(
        usize::try_from(stats.unread).unwrap(),
        written
            .iter()
            .filter(|l| l["stream"] == "geofence.transition")
            .count()
    );
    assert_eq!(stats.compared, 0);

    // The command says the same, and exits 0; a line changed by hand fails it, by number.
    let (code, text, _) = replay_command(&log, policy.path());
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("{decided} reproduced, 0 mismatched")),
        "{text}"
    );
    let mut tampered: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let at = tampered
        .iter()
        .position(|l| l.contains("\"rule\":\"pressure\""))
        .unwrap();
    tampered[at] = tampered[at].replace("\"rule\":\"pressure\"", "\"rule\":\"kept\"");
    let bad = dir.path().join("tampered.log");
    std::fs::write(&bad, tampered.join("\n")).unwrap();
    let (code, text, _) = replay_command(&bad, policy.path());
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!("line {}: mismatch", at + 1)),
        "{text}"
    );
}

/// At pressure 0.9 the curve sheds rank 50 and 90 whole and keeps rank 5 whole (threshold 10,
/// band narrowed to 10 ranks). Recorded with Berlin at rank 90: Berlin's and Munich's fixes all
/// shed. Replayed with Berlin at rank 5: Berlin's all admitted, Munich's all still shed, in
/// rows of their own; the `never` stream made sheddable is undecidable, its bodies unread.
#[tokio::test]
async fn a_changed_areas_file_gives_the_hand_computed_deltas() {
    let upstream = MockUpstream::start().await;
    let recorded = PolicyDir::new(STREAMS, Some(BERLIN_LOW));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let proxy = logged(&upstream.url(), recorded.path(), &log, None).await;
    pin(&proxy, 0.9).await;
    let (berlin, munich, never) = (30, 20, 7);
    for i in 0..berlin {
        let a = post(&proxy, "vehicle.position", fix(&format!("b{i}"), BERLIN, 3)).await;
        assert_eq!(a.header("x-shed-reason"), Some("pressure"));
    }
    for i in 0..munich {
        let a = post(&proxy, "vehicle.position", fix(&format!("m{i}"), MUNICH, 3)).await;
        assert_eq!(a.header("x-shed-reason"), Some("pressure"));
    }
    for _ in 0..never {
        let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
            .header("x-stream", "geofence.transition")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        assert_eq!(send(req).await.status, 200);
    }
    proxy.shutdown().await;

    let streams = STREAMS.replace(
        "[streams.\"geofence.transition\"]\nsupersession = \"never\"",
        "[streams.\"geofence.transition\"]\nsupersession = \"self-superseding\"",
    );
    let changed = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let policy = compiled(changed.path());
    let file = std::fs::File::open(&log).unwrap();
    let run = Run::read(std::io::BufReader::new(file), &policy).unwrap();
    assert!(run.passed(), "{}", run.text("log"));
    let stats = run.replay.stats;
    assert_eq!(stats.compared, berlin + munich);
    assert_eq!(stats.undecidable, never);
    let rows = run.replay.tally.rows(&policy, run.replay.seconds());
    let row = |stream: &str, area: &str| {
        rows.iter()
            .find(|r| r.stream == stream && r.area == area)
            .unwrap_or_else(|| panic!("no row {stream} {area}: {rows:#?}"))
            .counts
    };
    #[expect(clippy::cast_precision_loss, reason = "small counts")]
    let n = |x: u64| x as f64;
    let b = row("vehicle.position", "berlin");
    assert_eq!(
        (b.then_shed, b.now_admitted, b.now_shed),
        (n(berlin), n(berlin), 0.0)
    );
    let m = row("vehicle.position", "-");
    assert_eq!(
        (m.then_shed, m.now_shed, m.now_admitted),
        (n(munich), n(munich), 0.0)
    );
    let g = row("geofence.transition", "-");
    assert_eq!((g.then_admitted, g.undecidable), (n(never), n(never)));
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let text = run.text("log");
    assert!(text.contains("open-loop"), "{text}");
}

/// `shedgate replay --log FILE` on `file`: exit code, standard output, standard error.
pub(crate) fn replay_command(log: &Path, policies: &Path) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .args(["replay", "--log"])
        .arg(log)
        .arg("--policies")
        .arg(policies)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// Logs as operators hand them over, against a real log: one still being written (a torn
/// last line, or a zero-filled tail), a CRLF copy and a logrotate-compressed one (gzip, by its
/// bytes, in two members) reproduce with exit 0, the torn tail warned about; a torn line in the
/// middle, corrupt gzip or another compression cannot be read (2); decisions that differ are 1,
/// even beside an unreadable line; an empty log replays nothing (3).
#[tokio::test]
async fn replay_inputs_as_operators_hand_them_over() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_LOW));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let proxy = logged(&upstream.url(), policy.path(), &log, None).await;
    pin(&proxy, 0.9).await;
    for (i, at) in places().iter().take(16).enumerate() {
        post(&proxy, "vehicle.position", fix(&format!("t{i}"), *at, 2)).await;
    }
    proxy.shutdown().await;
    let good = std::fs::read(&log).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let whole: Vec<&str> = text.lines().collect();
    assert_eq!(whole.len(), 16);
    let reproduced = "16 reproduced, 0 mismatched";
    let write = |name: &str, data: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        path
    };
    let run = |name: &str, data: &[u8]| replay_command(&write(name, data), policy.path());

    let (code, out, err) = run("as-written.log", &good);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(reproduced) && err.is_empty(), "{out}{err}");

    // A log being written: its last line torn, no newline. Skipped, warned about, 0.
    let torn = [good.as_slice(), &whole[0].as_bytes()[..150]].concat();
    let (code, out, err) = run("torn.log", &torn);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(reproduced), "{out}");
    assert!(
        err.starts_with("warning:") && err.contains("line 17: a torn last line, 150 bytes"),
        "{err}"
    );
    let zeros = [good.as_slice(), &[0; 4096]].concat();
    let (code, out, err) = run("zeros.log", &zeros);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(err.contains("line 17: 4096 zero bytes at the end"), "{err}");

    let (code, out, err) = run("crlf.log", text.replace('\n', "\r\n").as_bytes());
    assert_eq!(
        (code, out.contains(reproduced)),
        (Some(0), true),
        "{out}{err}"
    );

    // logrotate's `compress`, read as zcat reads it: whatever its name, in two members.
    let half = whole[..8].join("\n") + "\n";
    let rest = whole[8..].join("\n") + "\n";
    let members = [gzip(half.as_bytes()), gzip(rest.as_bytes())].concat();
    let (code, out, err) = run("access.log.1", &members);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(reproduced) && out.contains("(gzip-compressed)"),
        "{out}"
    );
    let stdin = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .args(["replay", "--log", "-", "--policies"])
        .arg(policy.path())
        .stdin(std::fs::File::open(write("stdin.gz", &members)).unwrap())
        .output()
        .unwrap();
    assert!(stdin.status.success(), "{stdin:?}");

    // What cannot be read as a log: 2, and why.
    let mut corrupt = gzip(&good);
    let middle = corrupt.len() / 2;
    corrupt.truncate(middle);
    let (code, out, err) = run("corrupt.log.gz", &corrupt);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("gzip-compressed, but it does not decompress"),
        "{err}"
    );
    let zstd = [&[0x28, 0xb5, 0x2f, 0xfd][..], b"anything"].concat();
    let (code, _, err) = run("access.log.zst", &zstd);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("zstd-compressed") && err.contains("zstdcat"),
        "{err}"
    );
    let mut cut: Vec<String> = whole.iter().map(|l| (*l).to_owned()).collect();
    cut[5].truncate(100);
    let (code, out, err) = run("cut.log", (cut.join("\n") + "\n").as_bytes());
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        out.contains("line 6: not a shedgate access-log line"),
        "{out}"
    );
    assert!(err.contains("1 line is not an access-log line"), "{err}");

    // Decisions that differ are 1, whatever else the log holds.
    let at = cut
        .iter()
        .position(|l| l.contains("\"rule\":\"pressure\""))
        .expect("a pressure shed at 0.9");
    cut[at] = cut[at].replace("\"rule\":\"pressure\"", "\"rule\":\"kept\"");
    let (code, out, _) = run("cut-and-changed.log", (cut.join("\n") + "\n").as_bytes());
    assert_eq!(code, Some(1), "{out}");

    // Nothing to replay: 3, said so; so is a log that is only a torn line.
    for (name, data) in [
        ("empty.log", &b""[..]),
        ("only-torn.log", &whole[0].as_bytes()[..90]),
    ] {
        let (code, out, err) = run(name, data);
        assert_eq!(code, Some(3), "{name}: {out}{err}");
        assert!(err.contains("holds no access-log line"), "{name}: {err}");
    }
}
