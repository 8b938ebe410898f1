//! What the access log holds, line by line: no torn line when the disk fills, whatever a
//! write managed, and the counts are what a reader can parse; every answered request has a
//! line, heads hyper refused included; a sender's message id is kept, or cut with a hash, never
//! made equal to another; lines are in the order the requests were answered.

use std::path::Path;
use std::time::Duration;

use shedgate::config::{Config, ServeArgs};
use shedgate::record::writer::Target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::access_log::{STREAMS, lines};
use super::support::*;

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

/// Sends `head` on a new connection and reads the answer to its end.
async fn raw(proxy: &shedgate::app::Running, head: &[u8]) -> String {
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    // A head over the limit may be answered before all of it is written.
    let _ = tcp.write_all(head).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
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
