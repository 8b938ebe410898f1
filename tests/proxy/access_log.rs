//! The access log over real sockets: one line per answer with its fields, for every outcome;
//! nothing of the sender that the log must not hold; SIGUSR1 reopens; sampling within binomial
//! bounds; a pipe nobody reads drops lines, never requests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use shedgate::config::{Config, ServeArgs};
use shedgate::signals::Signals;
use tokio::io::AsyncWriteExt;

use super::support::*;

/// A device stream with a one-minute `stale_after`, a disabled stream, a `never` stream;
/// Berlin's cell at rank 5, everything else at 50.
pub(crate) const STREAMS: &str = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
stale_after = "60s"
device = "/device_id"
[streams."sensor.reading"]
supersession = "self-superseding"
enabled = false
[streams."geofence.transition"]
supersession = "never"
"#;

/// Berlin's cell at rank 90 (shed first), everything else at 50.
pub(crate) const BERLIN_LOW: &str = r#"
default_rank = 50
[[areas]]
name = "berlin"
rank = 90
cells = ["841f1d5ffffffff"]
"#;

/// A 32-byte secret in a file, and the key it makes.
pub(crate) fn secret(dir: &Path) -> (PathBuf, shedgate::record::privacy::DeviceKey) {
    let path = dir.join("secret");
    std::fs::write(&path, "an access-log secret of 32 bytes\n").unwrap();
    let key =
        shedgate::record::privacy::DeviceKey::new(b"an access-log secret of 32 bytes").unwrap();
    (path, key)
}

/// The lines of an access-log file, parsed.
pub(crate) fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// An event of `device` at `at`, `age_secs` old.
pub(crate) fn fix(device: &str, at: (f64, f64), age_secs: i64) -> String {
    event(at, age_secs).replace("veh-1", device)
}

/// A proxy logging to `log` with `tweak`'s settings, started with `signals`.
pub(crate) async fn logging(
    upstream: &str,
    policies: &Path,
    log: &Path,
    signals: &Signals,
    tweak: impl FnOnce(&mut ServeArgs),
) -> shedgate::app::Running {
    let mut args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.to_owned()),
        policies: Some(policies.to_owned()),
        access_log: Some(log.display().to_string()),
        replica: Some("replica-a".into()),
        ..ServeArgs::default()
    };
    tweak(&mut args);
    let config = Config::from_args(args).expect("valid test config");
    shedgate::app::start_with(config, sources(), signals)
        .await
        .expect("proxy starts")
        .0
}

/// A proxy logging to `log` with no signals, keying device ids with `secret` if given.
pub(crate) async fn logged(
    upstream: &str,
    policies: &Path,
    log: &Path,
    secret: Option<PathBuf>,
) -> shedgate::app::Running {
    logging(upstream, policies, log, &Signals::none(), |a| {
        a.access_log_secret_file = secret;
    })
    .await
}

fn the<'a>(
    lines: &'a [serde_json::Value],
    what: &str,
    pick: impl Fn(&serde_json::Value) -> bool,
) -> &'a serde_json::Value {
    let found: Vec<_> = lines.iter().filter(|l| pick(l)).collect();
    assert_eq!(found.len(), 1, "{what}: {found:#?}\nall lines: {lines:#?}");
    found[0]
}

/// Every outcome writes one line with the decision's fields: forwarded (a fresh fix, a
/// `never` body streamed through, an unknown stream), shed by pressure, stale, superseded,
/// disabled and memory, rejected (413) and an upstream error (502).
#[tokio::test]
async fn every_outcome_writes_one_line_with_its_fields() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let dir = tempfile::tempdir().unwrap();
    let (secret_file, key) = secret(dir.path());
    let log = dir.path().join("access.log");
    let proxy = logging(
        &upstream.url(),
        policy.path(),
        &log,
        &Signals::none(),
        |a| {
            a.access_log_secret_file = Some(secret_file.clone());
            a.max_body = Some(2048);
            a.max_buffered_bytes = Some(2048);
        },
    )
    .await;
    let ok = post(&proxy, "vehicle.position", fix("truck-7", BERLIN, 5)).await;
    assert_eq!(ok.status, StatusCode::OK);
    let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .header("x-stream", "geofence.transition")
        .header("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
        .body(Full::new(Bytes::from(r#"{"lat":1,"lon":2}"#)))
        .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
    assert_eq!(
        post(&proxy, "no.such.stream", "{}").await.status,
        StatusCode::OK
    );
    let stale = post(&proxy, "vehicle.position", fix("truck-8", BERLIN, 3600)).await;
    assert_eq!(stale.header("x-shed-reason"), Some("stale"));
    let disabled = post(&proxy, "sensor.reading", event(BERLIN, 5)).await;
    assert_eq!(disabled.header("x-shed-reason"), Some("disabled"));
    pin(&proxy, 0.9).await;
    let shed = post(&proxy, "vehicle.position", fix("truck-9", MUNICH, 5)).await;
    assert_eq!(shed.header("x-shed-reason"), Some("pressure"));
    // Older than truck-7's delivered fix: its successor came already.
    let superseded = post(&proxy, "vehicle.position", fix("truck-7", BERLIN, 30)).await;
    assert_eq!(superseded.header("x-shed-reason"), Some("superseded"));
    let big = post(&proxy, "vehicle.position", "x".repeat(3000)).await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    // A body held half-sent takes 1,500 of the 2,048 buffered bytes: the next is shed.
    let mut held = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    held.write_all(
        format!(
            "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: vehicle.position\r\n\
             Content-Length: 2000\r\n\r\n{}",
            " ".repeat(1500)
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let memory = post(
        &proxy,
        "vehicle.position",
        fix("truck-10", BERLIN, 5) + &" ".repeat(900),
    )
    .await;
    assert_eq!(memory.header("x-shed-reason"), Some("memory"));
    drop(held);
    let version = admin_get(&proxy, "/policy").await.json()["version"]
        .as_str()
        .unwrap()
        .to_owned();
    proxy.shutdown().await;

    let lines = lines(&log);
    for l in &lines {
        assert_eq!(l["replica"], "replica-a");
        assert_eq!(l["peer"], "127.0.0.0/24");
        assert_eq!(l["method"], "POST");
        assert_eq!(l["policy"], version.as_str());
        assert_eq!(l["sample"], 1.0);
        assert_eq!(l["id"].as_str().unwrap().len(), 16, "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    }
    let ids: std::collections::BTreeSet<_> = lines.iter().map(|l| l["id"].to_string()).collect();
    assert_eq!(ids.len(), lines.len(), "request ids are unique");

    let kept = the(&lines, "the fresh fix", |l| l["rule"] == "kept");
    assert_eq!(kept["outcome"], "forwarded");
    assert_eq!(kept["status"], 200);
    assert_eq!(kept["upstream_status"], 200);
    assert!(kept["upstream_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(kept["stream"], "vehicle.position");
    assert_eq!(kept["class"], "important");
    assert_eq!(kept["cell"], "841f1d5ffffffff");
    assert_eq!(kept["area"], "berlin");
    assert_eq!(kept["rank"], 5);
    assert!(
        kept.get("points").is_none() && kept.get("event_time").is_none(),
        "{kept}"
    );
    assert_eq!(kept["event_ms"], 1_780_000_000_000_i64 - 5000);
    assert_eq!(kept["age_ms"], 5000);
    assert_eq!(kept["pressure"], 0.0);
    assert!(kept["draw"].as_f64().is_some());
    assert_eq!(kept["probability"], 0.0);
    assert!(
        kept.get("clock_offset_ms").is_none(),
        "no correction, no field: {kept}"
    );
    assert!(kept["load"]["capacity"].as_u64().is_some());
    assert!(kept["buffered_bytes"].as_u64().is_some());
    assert_eq!(kept["device"], key.hash("truck-7").as_str());
    assert!(kept["device_history"]["credit"].as_f64().is_some());
    assert!(kept["credit_after"].as_f64().is_some());
    assert_eq!(kept["body"], "json");
    assert!(kept["request_bytes"].as_u64().unwrap() > 50);

    let never = the(&lines, "the never body", |l| l["rule"] == "never-shed");
    assert_eq!(never["outcome"], "forwarded");
    assert_eq!(never["body"], "unread");
    assert_eq!(never["message_id"], "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W");
    assert_eq!(never["class"], "important");
    assert!(never.get("draw").is_none(), "{never}");
    let unknown = the(&lines, "the unknown stream", |l| {
        l["rule"] == "unknown-stream"
    });
    assert!(unknown.get("stream").is_none(), "{unknown}");
    assert_eq!(unknown["class"], "critical");

    let stale = the(&lines, "the stale fix", |l| l["reason"] == "stale");
    assert_eq!(
        (&stale["outcome"], &stale["rule"]),
        (&"shed".into(), &"stale".into())
    );
    assert_eq!(stale["age_ms"], 3_600_000);
    let disabled = the(&lines, "the disabled stream", |l| l["reason"] == "disabled");
    assert_eq!(disabled["status"], 503);
    assert!(disabled.get("upstream_status").is_none(), "{disabled}");
    let shed = the(&lines, "the pressure shed", |l| l["reason"] == "pressure");
    assert_eq!(shed["pressure"], 0.9);
    assert_eq!(shed["probability"], 1.0);
    assert_eq!(shed["rank"], 50);
    assert!(shed.get("area").is_none(), "{shed}");
    assert_eq!(shed["device"], key.hash("truck-9").as_str());
    let superseded = the(&lines, "the superseded fix", |l| {
        l["reason"] == "superseded"
    });
    assert_eq!(superseded["rule"], "superseded");
    assert!(
        superseded["device_history"]["newest_delivered_ms"]
            .as_i64()
            .is_some()
    );
    let too_big = the(&lines, "the 413", |l| l["status"] == 413);
    assert_eq!(
        (&too_big["outcome"], &too_big["reason"]),
        (&"rejected".into(), &"payload-too-large".into())
    );
    let memory = the(&lines, "the memory shed", |l| l["reason"] == "memory");
    assert_eq!(
        (&memory["outcome"], &memory["rule"]),
        (&"shed".into(), &"memory".into())
    );

    // The upstream down: 502, an upstream error.
    let down = closed_port().await;
    let log2 = dir.path().join("down.log");
    let proxy = logging(
        &format!("http://{down}"),
        policy.path(),
        &log2,
        &Signals::none(),
        |_| {},
    )
    .await;
    let failed = post(&proxy, "geofence.transition", r#"{"lat":1,"lon":2}"#).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    proxy.shutdown().await;
    let lines = super::access_log::lines(&log2);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["outcome"], "upstream_error");
    assert_eq!(lines[0]["reason"], "bad_gateway");
    assert_eq!(lines[0]["status"], 502);
}

/// Nothing of the sender a log must not hold: no coordinates, no query string, no body, no
/// device id (only its keyed hash, and none at all without a secret), no whole peer address.
#[tokio::test]
async fn no_coordinate_query_or_id_appears_in_any_line() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let proxy = logged(&upstream.url(), policy.path(), &log, None).await;
    let body = r#"{"device_id":"veh-secret-42","lat":52.520123,"lon":13.404987,"occurred_at":"2026-05-28T20:26:35Z","note":"body-secret"}"#;
    for stream in ["vehicle.position", "geofence.transition"] {
        let req = Request::post(format!(
            "http://{}/ingest/veh-secret-42?token=query-s3cret",
            proxy.proxy_addr
        ))
        .header("x-stream", stream)
        .header("authorization", "Bearer header-s3cret")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
        assert_eq!(send(req).await.status, StatusCode::OK);
    }
    proxy.shutdown().await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    for secret in [
        "52.52",
        "13.40",
        "query-s3cret",
        "token",
        "header-s3cret",
        "veh-secret-42",
        "body-secret",
        "127.0.0.1",
        "/ingest",
    ] {
        assert!(!text.contains(secret), "{secret:?} in the log: {text}");
    }
    assert!(
        !text.contains("\"device\""),
        "no secret, no device field: {text}"
    );
    assert!(text.contains("841f1d5ffffffff"), "{text}");
}

/// logrotate's way: the file is renamed, SIGUSR1 arrives, and the next lines go to a new file
/// at the configured path; the renamed one keeps what was written before.
#[tokio::test]
async fn sigusr1_reopens_the_file() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let signals = Signals::none();
    let proxy = logging(&upstream.url(), policy.path(), &log, &signals, |_| {}).await;
    for _ in 0..3 {
        post(&proxy, "geofence.transition", "{}").await;
    }
    // Written before the rename: the writer has taken every line when its count says so.
    let written = || async {
        metric(
            &scrape(&proxy).await,
            "shedgate_access_log_lines_total",
            &[],
        )
    };
    for _ in 0..200 {
        if written().await >= 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    signals.deliver(10); // SIGUSR1
    for _ in 0..2 {
        post(&proxy, "geofence.transition", "{}").await;
    }
    proxy.shutdown().await;
    assert_eq!(lines(&rotated).len(), 3);
    assert_eq!(
        lines(&log).len(),
        2,
        "the new file has the lines after SIGUSR1"
    );
}

/// `forwarded=0.1,shed=1`: about a tenth of forwarded requests are written (each saying so),
/// every shed one; 2,000 forwarded requests keep 200 ± 5 standard deviations (± 67).
#[tokio::test]
async fn sampling_rates_hold_within_binomial_bounds() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let proxy = logging(
        &upstream.url(),
        policy.path(),
        &log,
        &Signals::none(),
        |a| {
            a.access_log_sample = Some("forwarded=0.1,shed=1".into());
        },
    )
    .await;
    let client = client();
    let send_one = |stream: &'static str| {
        let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
            .header("x-stream", stream)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        client.request(req)
    };
    for _ in 0..2000 {
        assert_eq!(send_one("geofence.transition").await.unwrap().status(), 200);
    }
    for _ in 0..50 {
        assert_eq!(send_one("sensor.reading").await.unwrap().status(), 503);
    }
    proxy.shutdown().await;
    let lines = lines(&log);
    let forwarded: Vec<_> = lines
        .iter()
        .filter(|l| l["outcome"] == "forwarded")
        .collect();
    let shed = lines.iter().filter(|l| l["outcome"] == "shed").count();
    assert!(forwarded.iter().all(|l| l["sample"] == 0.1));
    assert_eq!(shed, 50);
    let n = forwarded.len();
    assert!(
        (133..=267).contains(&n),
        "{n} of 2000 forwarded lines at rate 0.1"
    );
}

/// `--access-log -` into a pipe nobody reads, a queue of 64 lines: all 2,000 requests are
/// answered and some lines are counted as dropped. Once a reader drains the pipe, the lines
/// counted as written plus those counted as dropped are every request, and the reader got
/// exactly the lines counted as written.
#[test]
fn a_pipe_nobody_reads_drops_lines_not_requests() {
    use std::io::Read as _;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = rt.block_on(MockUpstream::start());
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let mut p = super::processes::Spawned::start_piped(&[
        "serve".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--admin-listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--upstream".as_ref(),
        upstream.url().as_ref(),
        "--policies".as_ref(),
        policy.path().as_os_str(),
        "--access-log".as_ref(),
        "-".as_ref(),
        "--access-log-queue".as_ref(),
        "64".as_ref(),
        "--shutdown-delay".as_ref(),
        "0".as_ref(),
    ]);
    let serving = p.wait_for("shedgate serving", Duration::from_secs(60));
    let addr = |key: &str| -> std::net::SocketAddr {
        let at = serving.find(key).unwrap_or_else(|| panic!("{serving}")) + key.len();
        serving[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (proxy, admin) = (addr("proxy_addr="), addr("admin_addr="));
    let n = 2000;
    let client = client();
    let dropped = rt.block_on(async {
        for _ in 0..n {
            let req = Request::post(format!("http://{proxy}/ingest"))
                .header("x-stream", "geofence.transition")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let status = client.request(req).await.expect("answered").status();
            assert_eq!(status, 200);
        }
        let text = scrape_admin(&admin).await;
        metric(
            &text,
            "shedgate_access_log_dropped_total",
            &[("reason", "behind")],
        )
    });
    assert!(dropped > 0.0, "nothing dropped behind a pipe nobody reads");
    // Now a reader: the writer unblocks and sweeps what the shards still hold.
    let mut stdout = p.child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        out
    });
    let (written, dropped) = rt.block_on(async {
        let mut counted = (0.0, 0.0);
        for _ in 0..200 {
            let text = scrape_admin(&admin).await;
            counted = (
                metric(&text, "shedgate_access_log_lines_total", &[]),
                metric(
                    &text,
                    "shedgate_access_log_dropped_total",
                    &[("reason", "behind")],
                ),
            );
            if counted.0 + counted.1 >= f64::from(n) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        counted
    });
    assert_eq!(
        written + dropped,
        f64::from(n),
        "{written} written, {dropped} dropped"
    );
    p.signal("TERM");
    p.wait_exit(Duration::from_secs(30));
    let out = reader.join().unwrap();
    #[expect(clippy::cast_precision_loss, reason = "small counts")]
    let read = out.lines().count() as f64;
    assert_eq!(
        read, written,
        "the reader got every line counted as written"
    );
}

async fn scrape_admin(admin: &std::net::SocketAddr) -> String {
    let req = Request::get(format!("http://{admin}/metrics"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    String::from_utf8_lossy(&send(req).await.body).into_owned()
}
