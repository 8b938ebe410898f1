//! Named upstreams (`[upstreams.NAME]`, `upstream = "NAME"`): `shedgate check` accepts them
//! and warns about one nothing names; serving them is refused, at start and at reload, until
//! the proxy routes by them.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::processes::Spawned;
use crate::support::*;

/// What serving a policy with upstreams is told.
const REFUSED: &str = "routing to several upstreams is not available in this version";

/// Two upstreams: `tracking`, which a stream names, and `events`, which nothing names.
fn two_upstreams() -> String {
    format!(
        "{}\n[upstreams.tracking]\nurl = \"http://127.0.0.1:3001\"\nlatency_target = \"50ms\"\n\
         \n[upstreams.events]\nurl = \"http://127.0.0.1:3002\"\n",
        SEED_STREAMS.replace(
            "[streams.\"vehicle.position\"]\n",
            "[streams.\"vehicle.position\"]\nupstream = \"tracking\"\n",
        )
    )
}

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/examples/several-upstreams")
}

fn check(dir: &Path) -> (std::process::ExitStatus, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("check")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_upstreams_and_warns_about_one_nothing_names() {
    let policy = PolicyDir::new(&two_upstreams(), Some(BERLIN_AREA));
    let (status, out, err) = check(policy.path());
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains(
            "streams.toml: warning: upstream \"events\" is defined but no route or stream \
             names it"
        ),
        "{out}"
    );
    assert!(out.contains("1 warning(s)"), "{out}");
    // The worked example in the repository checks clean.
    let (status, out, err) = check(&example());
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(out.contains("0 warning(s)"), "{out}");
    // An unknown name is an error naming its line and field.
    let unknown = two_upstreams().replace("upstream = \"tracking\"", "upstream = \"trackng\"");
    let policy = PolicyDir::new(&unknown, Some(BERLIN_AREA));
    let (status, _, err) = check(policy.path());
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("streams.toml:3:12: field `streams.\"vehicle.position\".upstream`: no upstream \"trackng\" (defined: default, events, tracking)"),
        "{err}"
    );
}

/// `shedgate serve` exits 2 on a policy that names upstreams, saying why and where.
#[tokio::test]
async fn serving_upstreams_is_refused_at_start() {
    let upstream = MockUpstream::start().await;
    let dir = example();
    let url = upstream.url();
    let mut p = Spawned::start(&[
        OsStr::new("serve"),
        OsStr::new("--upstream"),
        OsStr::new(&url),
        OsStr::new("--listen"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--admin-listen"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--policies"),
        dir.as_os_str(),
    ]);
    let status = p.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "{:#?}", p.log);
    let line = p.log.iter().find(|l| l.contains(REFUSED));
    let line = line.unwrap_or_else(|| panic!("{:#?}", p.log));
    // The example's first upstream in name order, at its table's header.
    assert!(
        line.contains("streams.toml:12:1: field `upstreams.\"alerting\"`"),
        "{line}"
    );
    assert_eq!(upstream.count(), 0);
}

/// A reload to a policy that names upstreams fails as any bad edit does: the last good
/// policy stays live and keeps deciding, and the error says why.
#[tokio::test]
async fn a_reload_to_upstreams_keeps_the_live_policy() {
    let (upstream, policy, proxy) = seeded().await;
    let live = admin_get(&proxy, "/policy").await.json()["version"].clone();
    let tmp = policy.path().join(".streams.tmp");
    std::fs::write(&tmp, two_upstreams()).unwrap();
    std::fs::rename(&tmp, policy.path().join("streams.toml")).unwrap();
    let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let a = send(req).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let body = String::from_utf8_lossy(&a.body).into_owned();
    assert!(body.contains(REFUSED), "{body}");
    let p = admin_get(&proxy, "/policy").await.json();
    assert_eq!(p["version"], live);
    let err = p["last_error"].as_str().unwrap();
    assert!(
        err.contains(REFUSED) && err.contains("field `upstreams.\"events\"`"),
        "{err}"
    );
    let a = post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(upstream.count(), 1);
}
