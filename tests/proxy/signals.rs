//! Signals during start-up (prometheus#14917, consul#677): the binary, with a policy whose
//! region file takes seconds to compile, gets signals before it serves. Before, a SIGHUP then
//! killed it (exit 129), and a SIGTERM to PID 1 was lost; now every handler exists from the
//! first line of `main`: an early SIGTERM exits at once, early SIGHUPs are one reload after
//! start, a storm of them coalesces, and a SIGUSR1 never kills.

#![cfg(unix)]

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use crate::support::*;

/// A policy directory whose one area is a ring of 480,000 positions (about 2 s to compile in a
/// debug build): a start-up long enough to signal into.
fn slow_policy() -> PolicyDir {
    use std::fmt::Write as _;
    let dir = PolicyDir::new(
        SEED_STREAMS,
        Some(
            "default_rank = 50\n[[areas]]\nname = \"slow\"\nrank = 10\ngeojson = \"slow.geojson\"\n",
        ),
    );
    const N: usize = 480_000;
    let mut ring = String::with_capacity(N * 24);
    for i in 0..=N {
        #[expect(clippy::cast_precision_loss, reason = "i < 2^20")]
        let a = 2.0 * std::f64::consts::PI * (i % N) as f64 / N as f64;
        let sep = if i == 0 { "" } else { "," };
        write!(
            ring,
            "{sep}[{:.6},{:.6}]",
            11.0 + 8.0 * a.cos(),
            48.0 + 8.0 * a.sin()
        )
        .unwrap();
    }
    std::fs::write(
        dir.path().join("slow.geojson"),
        format!(
            r#"{{"type":"FeatureCollection","features":[{{"type":"Feature","properties":{{"name":"slow"}},"geometry":{{"type":"Polygon","coordinates":[[{ring}]]}}}}]}}"#
        ),
    )
    .unwrap();
    dir
}

fn serve(policy: &PolicyDir) -> Spawned {
    Spawned::start(&[
        OsStr::new("serve"),
        OsStr::new("--listen"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--admin-listen"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--upstream"),
        OsStr::new("http://127.0.0.1:9"),
        OsStr::new("--shutdown-delay"),
        OsStr::new("0"),
        OsStr::new("--policies"),
        policy.path().as_os_str(),
    ])
}

/// SIGHUPs from 50 ms to 1.5 s into start-up, and a SIGUSR1: the process lives, serves, and
/// reloads once for all of them; a SIGTERM then stops it gracefully (exit 0).
#[test]
fn signals_before_serving_are_remembered_not_fatal() {
    let policy = slow_policy();
    let mut p = serve(&policy);
    std::thread::sleep(Duration::from_millis(50));
    p.signal("USR1");
    for _ in 0..15 {
        p.signal("HUP");
        std::thread::sleep(Duration::from_millis(100));
    }
    #[expect(clippy::disallowed_methods, reason = "the child logs this clock")]
    let last_hup = std::time::SystemTime::now();
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "killed by a signal during start-up: {:#?}",
        p.log
    );
    p.wait_for("shedgate serving", Duration::from_secs(120));
    p.wait_for("policy reload on SIGHUP", Duration::from_secs(120));
    // Long enough for a second reload of the same 2 s policy, had one been queued.
    p.drain_log(Duration::from_secs(6));
    let reloads = p
        .log
        .iter()
        .filter(|l| l.contains("policy reload on SIGHUP"))
        .count();
    // Every SIGHUP before serving is one reload. Start-up usually outlasts the 1.5 s of
    // signals, but on a fast or idle machine it may not: then the SIGHUPs after serving
    // began are one more reload at most (one during the first queues one), as in the storm
    // below. When serving began is read from the log line's own timestamp (same clock).
    let serving_at = p
        .log
        .iter()
        .find(|l| l.contains("shedgate serving"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
        .expect("the serving line starts with its RFC 3339 timestamp");
    let most = if serving_at < last_hup { 2 } else { 1 };
    assert!(
        (1..=most).contains(&reloads),
        "{reloads} reloads, at most {most}: {:#?}",
        p.log
    );
    // A storm while serving (twenty SIGHUPs from one `kill`, microseconds apart) is one
    // more reload, or two if the first began between them.
    let pid = p.child.id().to_string();
    let storm = std::process::Command::new("kill")
        .arg("-HUP")
        .args(std::iter::repeat_n(pid.as_str(), 20))
        .status()
        .unwrap();
    assert!(storm.success());
    p.wait_for("policy reload on SIGHUP", Duration::from_secs(120));
    p.signal("USR1");
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status}: {:#?}", p.log);
    let reloads = p
        .log
        .iter()
        .filter(|l| l.contains("policy reload on SIGHUP"))
        .count();
    assert!(
        reloads <= 3,
        "twenty SIGHUPs while serving were {reloads} reloads"
    );
}

/// A SIGTERM while the policy compiles exits at once, with the code a shell gives a process
/// SIGTERM killed (143), without waiting to serve.
#[test]
fn sigterm_before_serving_exits_at_once() {
    let policy = slow_policy();
    let mut p = serve(&policy);
    std::thread::sleep(Duration::from_millis(300));
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(120));
    assert_eq!(
        status.signal(),
        None,
        "killed by the default action: {status}"
    );
    assert_eq!(status.code(), Some(143), "{:#?}", p.log);
    assert!(
        !p.log.iter().any(|l| l.contains("shedgate serving")),
        "it served first: {:#?}",
        p.log
    );
}

/// For a command other than `serve`, a SIGHUP is a terminal hanging up: it exits (129), as the
/// default action did, but through the handler.
#[test]
fn sighup_ends_a_command_that_does_not_serve() {
    let policy = slow_policy();
    let mut p = Spawned::start(&[OsStr::new("check"), policy.path().as_os_str()]);
    std::thread::sleep(Duration::from_millis(300));
    p.signal("HUP");
    let status = p.wait_exit(Duration::from_secs(120));
    assert_eq!(status.code(), Some(129), "{status}");
}
