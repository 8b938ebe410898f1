//! `shedgate device-hash` against the access log a real proxy wrote: a secret file saved with
//! LF, with CRLF, or with none keys one hash, and the command prints the `device` field the
//! log holds for each id, spelled exactly as the request stated it.

use std::path::Path;

use super::access_log::{BERLIN_LOW, STREAMS, fix, lines};
use super::support::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// The ids sent, as the body states them, and as the log's hash is of them (a string's
/// content, a number as written).
const IDS: [(&str, &str); 3] = [
    (r#""truck-7""#, "truck-7"),
    (r#""Truck-7""#, "Truck-7"),
    ("1001", "1001"),
];

/// The `device` field of each line a proxy keyed with `secret_file` logs for [`IDS`], in
/// order.
async fn logged(secret_file: &Path, dir: &Path) -> Vec<String> {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_LOW));
    let log = dir.join("access.log");
    let file = secret_file.to_owned();
    let proxy = super::access_log::logged(&upstream.url(), policy.path(), &log, Some(file)).await;
    for (stated, _) in IDS {
        let body = fix("veh-1", BERLIN, 2).replace(r#""veh-1""#, stated);
        assert_eq!(post(&proxy, "vehicle.position", body).await.status, 200);
    }
    proxy.shutdown().await;
    lines(&log)
        .iter()
        .map(|l| {
            l["device"]
                .as_str()
                .unwrap_or_else(|| panic!("no device: {l}"))
                .to_owned()
        })
        .collect()
}

fn device_hash(secret_file: &Path, ids: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("device-hash")
        .arg("--access-log-secret-file")
        .arg(secret_file)
        .args(ids)
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_command_prints_the_logged_hash_whatever_the_secret_files_line_ending() {
    let mut logs = Vec::new();
    for (name, ending) in [("lf", "\n"), ("crlf", "\r\n"), ("bare", "")] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(format!("secret-{name}"));
        std::fs::write(&file, format!("{SECRET}{ending}")).unwrap();
        let logged = logged(&file, dir.path()).await;
        let ids: Vec<&str> = IDS.iter().map(|(_, id)| *id).collect();
        let out = device_hash(&file, &ids);
        assert!(out.status.success(), "{out:?}");
        let printed: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(printed, logged, "secret file with {name:?} line ending");
        logs.push(logged);
    }
    assert!(logs.windows(2).all(|w| w[0] == w[1]), "{logs:?}");
    // Ids compare exactly as written: a case apart is another device.
    let hashes = &logs[0];
    assert_ne!(hashes[0], hashes[1]);
    assert!(hashes.iter().all(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }));
}

/// A secret the proxy would refuse, or an empty id, is exit 2 with the reason.
#[test]
fn the_command_refuses_what_the_proxy_would_not_hash() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "fifteen bytes..\r\n").unwrap();
    let out = device_hash(&short, &["truck-7"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("15 bytes") && err.contains("short"), "{err}");
    let missing = device_hash(&dir.path().join("missing"), &["truck-7"]);
    assert_eq!(missing.status.code(), Some(2));
    let good = dir.path().join("good");
    std::fs::write(&good, SECRET).unwrap();
    let empty = device_hash(&good, &[""]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("empty id"));
}
