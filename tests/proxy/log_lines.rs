//! What the access log holds, line by line: no torn line when the disk fills, whatever a
//! write managed, and the counts are what a reader can parse; every answered request has a
//! line, heads hyper refused included; a sender's message id is kept, or cut with a hash, never
//! made equal to another; lines are in the order the requests were answered.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use shedgate::config::{Config, ServeArgs};
use shedgate::record::sink::{OpenSink, Sink};
use shedgate::record::writer::Target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::access_log::{STREAMS, lines};
use super::support::*;

/// A file on a disk with `room` bytes left: a write takes what fits (a short write), the
/// next one fails with `ENOSPC`, as Linux does; cutting the file back frees its bytes.
struct SmallDisk {
    file: std::fs::File,
    room: Arc<AtomicU64>,
}

impl std::io::Write for SmallDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.room.load(Ordering::SeqCst);
        if room == 0 {
            return Err(std::io::ErrorKind::StorageFull.into());
        }
        let take = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.file.write(&buf[..take])?;
        self.room.fetch_sub(n as u64, Ordering::SeqCst);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink for SmallDisk {
    fn end(&mut self) -> Option<u64> {
        self.file.end()
    }

    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        let before = self.file.metadata()?.len();
        self.file.truncate(len)?;
        self.room
            .fetch_add(before.saturating_sub(len), Ordering::SeqCst);
        Ok(())
    }
}

/// A proxy whose access log goes to `target`.
async fn proxy_logging_to(
    upstream: &str,
    policies: &Path,
    target: Target,
) -> shedgate::app::Running {
    let args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.to_owned()),
        policies: Some(policies.to_owned()),
        access_log: Some("-".into()),
        replica: Some("replica-a".into()),
        ..ServeArgs::default()
    };
    let mut config = Config::from_args(args).expect("valid test config");
    config.access_log.as_mut().expect("a log").target = target;
    shedgate::app::start(config, sources())
        .await
        .expect("proxy starts")
        .0
}

/// Posts a `geofence.transition` event with `webhook-id: id`.
async fn post_with_id(proxy: &shedgate::app::Running, id: &str) {
    let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .header("x-stream", "geofence.transition")
        .header("webhook-id", id)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(send(req).await.status, 200);
}

/// Waits until every line submitted so far is written or dropped (the writer sweeps every
/// 20 ms; the bound is only against a hang).
async fn settled(proxy: &shedgate::app::Running) {
    let log = proxy.parts.records.log.as_ref().expect("a log");
    log.drain(Duration::from_secs(20)).await;
}

/// stellar-core#2288, logrotate PR #16: with 2,500 bytes left on the disk a write stopped
/// mid-line, the next line was glued to the fragment, lines in the file were counted as
/// dropped and `replay` failed from then on. Now after every write, whatever it managed, the
/// file ends on a whole line; the lines counted as written are exactly the file's lines, the
/// rest are counted `write_error`; once there is room again, writing resumes; and `replay`
/// reads every line.
#[tokio::test]
async fn a_full_disk_leaves_no_torn_line_and_writing_resumes() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let room = Arc::new(AtomicU64::new(u64::MAX));
    let open = {
        let (path, room) = (path.clone(), Arc::clone(&room));
        OpenSink(Arc::new(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            let disk = SmallDisk {
                file,
                room: Arc::clone(&room),
            };
            Ok(Box::new(disk) as Box<dyn Sink>)
        }))
    };
    let proxy = proxy_logging_to(&upstream.url(), policy.path(), Target::Sink(open)).await;
    let ends_whole = || {
        let bytes = std::fs::read(&path).unwrap();
        bytes.is_empty() || bytes.ends_with(b"\n")
    };
    for i in 0..3 {
        post_with_id(&proxy, &format!("msg_before_{i:03}")).await;
        settled(&proxy).await;
    }
    room.store(2500, Ordering::SeqCst);
    for i in 0..12 {
        // One line per write: each write is short or fails.
        post_with_id(&proxy, &format!("msg_full_{i:03}")).await;
        settled(&proxy).await;
        assert!(ends_whole(), "a torn line after write {i}");
    }
    let on_full_disk = lines(&path).len() - 3;
    room.store(u64::MAX, Ordering::SeqCst);
    for i in 0..4 {
        post_with_id(&proxy, &format!("msg_after_{i:03}")).await;
        settled(&proxy).await;
    }
    let metrics = scrape(&proxy).await;
    proxy.shutdown().await;
    // Every line parses (`lines` panics on one that does not), in order.
    let lines = lines(&path);
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["message_id"].as_str().unwrap())
        .collect();
    let mut expected: Vec<String> = (0..3).map(|i| format!("msg_before_{i:03}")).collect();
    expected.extend((0..on_full_disk).map(|i| format!("msg_full_{i:03}")));
    expected.extend((0..4).map(|i| format!("msg_after_{i:03}")));
    assert_eq!(ids, expected);
    assert!(
        (1..12).contains(&on_full_disk),
        "2,500 bytes hold some lines, not all: {on_full_disk}"
    );
    let written = metric(&metrics, "shedgate_access_log_lines_total", &[]);
    let failed = metric(
        &metrics,
        "shedgate_access_log_dropped_total",
        &[("reason", "write_error")],
    );
    #[expect(clippy::cast_precision_loss, reason = "small counts")]
    let (in_file, lost) = (lines.len() as f64, (12 - on_full_disk) as f64);
    assert_eq!(written, in_file, "written is what a reader can parse");
    assert_eq!(failed, lost, "the rest are write errors");
    let (code, text, _) = super::replay::replay_command(&path, policy.path());
    assert_eq!(code, Some(0), "replay reads every line: {text}");
}

/// Lines handed over one after another from four threads (four shards, formatted apart, as
/// a multi-threaded runtime's workers do) were written grouped by shard within each 20 ms
/// batch; now the file holds them in the order they were handed over, within a batch and
/// across batches.
#[test]
fn lines_are_in_the_order_requests_were_answered() {
    use shedgate::record::{AccessLog, Entry, LogConfig, Note, Sampling};
    let policy = PolicyDir::new(STREAMS, None);
    let metrics = Arc::new(shedgate::metrics::Metrics::new());
    let compiled = shedgate::policy::load_dir(policy.path()).unwrap().policy;
    let snapshot = Arc::new(shedgate::live::store::Snapshot::new(&metrics, compiled));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let config = LogConfig {
        target: Target::File(path.clone()),
        sampling: Sampling::default(),
        format: shedgate::record::format::Format {
            replica: "replica-a".into(),
            full_peer: false,
            device_key: None,
        },
        queue: 1 << 20,
    };
    let log = AccessLog::start(&config, &metrics, &shedgate::signals::Signals::none()).unwrap();
    let (threads, n): (u64, u64) = (4, 2000);
    let turn = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (log, turn, snapshot) =
                (Arc::clone(&log), Arc::clone(&turn), Arc::clone(&snapshot));
            std::thread::spawn(move || {
                for i in (t..n).step_by(usize::try_from(threads).unwrap()) {
                    while turn.load(Ordering::Acquire) != i {
                        std::thread::yield_now();
                    }
                    log.submit(&Entry {
                        id: i,
                        at: shedgate::clock::UnixMillis(1_800_000_000_000),
                        peer: None,
                        method: Some(http::Method::POST),
                        target: Some(http::Uri::from_static("/ingest")),
                        message_id: Some(format!("msg_{i:04}").parse().unwrap()),
                        snapshot: Arc::clone(&snapshot),
                        note: Note::default(),
                        status: 200,
                        upstream: None,
                        response_bytes: None,
                        sample: 1.0,
                    });
                    turn.store(i + 1, Ordering::Release);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(log.drain(Duration::from_secs(20)));
    let ids: Vec<String> = lines(&path)
        .iter()
        .map(|l| l["message_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..n).map(|i| format!("msg_{i:04}")).collect();
    assert_eq!(ids.len(), expected.len());
    let first = ids.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(first, None, "the first line out of order");
}

/// A policy with a route, so that a refused head's line can name it.
const ROUTED: &str = r#"
[streams."geofence.transition"]
supersession = "never"
[[routes]]
prefix = "/ingest/traccar"
format = "traccar"
"#;

/// Sends `head` on a new connection and reads the answer to its end.
async fn raw(proxy: &shedgate::app::Running, head: &[u8]) -> String {
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    // A head over the limit may be answered before all of it is written.
    let _ = tcp.write_all(head).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Requests hyper's parser refused (obs-fold, a control byte in the message id, a head over
/// `--max-head`, a request line that is not one) were answered 400 or 431 with no line; now
/// each has its line with what the head told: the peer, the method, route and message id
/// when they could be read, the status and the reason.
#[tokio::test]
async fn heads_hyper_refuses_have_their_line() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(ROUTED, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let proxy = proxy_logging_to(&upstream.url(), policy.path(), Target::File(path.clone())).await;
    let folded = raw(
        &proxy,
        b"POST /ingest/traccar/x?k=v HTTP/1.1\r\nHost: x\r\nX-Stream: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(folded.starts_with("HTTP/1.1 400"), "{folded}");
    let escape = raw(
        &proxy,
        b"POST /ingest/traccar HTTP/1.1\r\nHost: x\r\nwebhook-id: msg_4\x1b[31mred\r\n\r\n",
    )
    .await;
    assert!(escape.starts_with("HTTP/1.1 400"), "{escape}");
    let big = format!(
        "GET /elsewhere HTTP/1.1\r\nHost: x\r\n{}\r\n\r\n",
        (0..40)
            .map(|i| format!("x-filler-{i}: {}", "f".repeat(2000)))
            .collect::<Vec<_>>()
            .join("\r\n")
    );
    let too_large = raw(&proxy, big.as_bytes()).await;
    assert!(too_large.starts_with("HTTP/1.1 431"), "{too_large}");
    let garbage = raw(&proxy, b"\x01\x02 nonsense\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    // hyper answers before the connection's task ends and writes the line: wait for the
    // lines (the bound is only against a hang). Their order is the order the connections
    // ended, which a lingering close can change.
    for _ in 0..1000 {
        let text = scrape(&proxy).await;
        if metric(&text, "shedgate_access_log_lines_total", &[]) >= 4.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.shutdown().await;
    let lines = lines(&path);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let summary = |l: &serde_json::Value| {
        assert_eq!(l["outcome"], "rejected", "{l}");
        assert_eq!(l["peer"], "127.0.0.0/24", "{l}");
        assert_eq!(l["body"], "unread", "{l}");
        assert!(!l.to_string().contains("k=v"), "no query string: {l}");
        format!(
            "{} {} {} {}",
            l["status"],
            l["reason"].as_str().unwrap_or("-"),
            l["method"].as_str().unwrap_or("-"),
            l["route"].as_str().unwrap_or("-"),
        )
    };
    let mut seen: Vec<String> = lines.iter().map(summary).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "400 malformed-head - -",
            "400 malformed-head POST /ingest/traccar",
            "400 malformed-head POST /ingest/traccar",
            "431 head-too-large GET -",
        ]
    );
    let (code, text, _) = super::replay::replay_command(&path, policy.path());
    assert_eq!(code, Some(0), "replay reads every line: {text}");
}

/// A `webhook-id` in raw UTF-8 was dropped, and two ids that differ after byte 128 were
/// written alike; now UTF-8 is kept (escaped as JSON) and a long id is cut with a hash of
/// the whole, so two different ids never read the same.
#[tokio::test]
async fn message_ids_are_kept_and_never_made_equal() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let proxy = proxy_logging_to(&upstream.url(), policy.path(), Target::File(path.clone())).await;
    let ids: [&[u8]; 5] = [
        "msg_5_caf\u{e9}_\u{2028}_\u{202e}".as_bytes(),
        b"msg_1\",\"status\":200,\"x\":\"\\\ttab",
        &[b"msg_7_".as_slice(), &[b'B'; 130], b"1"].concat(),
        &[b"msg_7_".as_slice(), &[b'B'; 130], b"2"].concat(),
        b"msg_latin1_caf\xe9",
    ];
    for id in ids {
        let head = [
            b"POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\nwebhook-id: "
                .as_slice(),
            id,
            b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        ]
        .concat();
        let answer = raw(&proxy, &head).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    proxy.shutdown().await;
    let text = std::fs::read(&path).unwrap();
    assert!(
        !text.iter().any(|&b| b < 0x20 && b != b'\n'),
        "no raw control byte"
    );
    let lines = lines(&path);
    let written: Vec<&str> = lines
        .iter()
        .map(|l| l["message_id"].as_str().expect("every id kept"))
        .collect();
    assert_eq!(written.len(), 5);
    assert_eq!(written[0], "msg_5_caf\u{e9}_\u{2028}_\u{202e}");
    assert_eq!(written[1], "msg_1\",\"status\":200,\"x\":\"\\\ttab");
    assert_ne!(written[2], written[3], "ids differing at byte 137");
    assert!(
        written[2].len() <= 128 && written[2].contains("…#"),
        "{}",
        written[2]
    );
    assert!(
        written[4].starts_with("msg_latin1_caf\u{fffd}…#"),
        "{}",
        written[4]
    );
}
