//! Schedules end to end (docs/decision.md "Schedules"): a window open at the test clock's
//! instant (Thursday 2026-05-28, 22:26 in Berlin) raises pressure to its floor, the answer
//! says which schedule did it, the gauge shows it, a pin overrides it, and `explain --at` and
//! `check` say the same offline.

use std::time::Duration;

use http::StatusCode;

use crate::support::*;

const SCHEDULES: &str = r#"
[[schedules]]
name = "thursday-night"
days = ["thu"]
start = "22:00"
end = "23:00"
timezone = "Europe/Berlin"
pressure_floor = 0.9

[[schedules]]
name = "friday-evening"
days = ["fri"]
start = "17:00"
end = "19:30"
timezone = "Europe/Berlin"
pressure_floor = 0.6
"#;

fn policy() -> PolicyDir {
    PolicyDir::new(&format!("{SEED_STREAMS}{SCHEDULES}"), Some(BERLIN_AREA))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_window_raises_pressure_to_its_floor() {
    let upstream = MockUpstream::start().await;
    let policy = policy();
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    // Default rank 50 at 0.9 is always shed; Berlin (rank 5) never is.
    let munich = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(munich.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(munich.header("x-shed-reason"), Some("pressure"));
    let why = munich.json();
    assert_eq!(why["schedule"], "thursday-night");
    assert_eq!(why["pressure"], 0.9);
    let berlin = post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    assert_eq!(berlin.status, StatusCode::OK);
    // The gauge, exported with the disabled list about once a second.
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(&proxy).await;
        if metric(
            &text,
            "shedgate_schedule_active",
            &[("schedule", "thursday-night")],
        ) == 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(
            &text,
            "shedgate_schedule_active",
            &[("schedule", "thursday-night")]
        ),
        1.0
    );
    assert!(text.contains("shedgate_schedule_active{schedule=\"friday-evening\"} 0"));
    assert!(metric(&text, "shedgate_pressure", &[("upstream", "default")]) >= 0.9);
    // An operator's pin wins over the schedule.
    pin(&proxy, 0.0).await;
    let pinned = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(pinned.status, StatusCode::OK);
}

#[test]
fn explain_at_a_time_shows_the_schedule_floor() {
    let policy = policy();
    let run = |at: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
            .args(["explain", "--stream", "vehicle.position"])
            .args(["--lat", "48.137", "--lon", "11.575", "--pressure", "0.3"])
            .args(["--at", at])
            .arg("--policies")
            .arg(policy.path())
            .output()
            .unwrap()
    };
    let open = run("2026-05-28T22:30:00+02:00");
    let text = String::from_utf8_lossy(&open.stdout);
    assert!(open.status.success(), "{text}");
    assert!(
        text.contains(
            "schedule:    thursday-night is open: pressure raised from 0.3 to its floor 0.9"
        ),
        "{text}"
    );
    assert!(text.contains("decision:    shed"), "{text}");
    let closed = run("2026-05-28T23:30:00+02:00");
    let text = String::from_utf8_lossy(&closed.stdout);
    assert!(!text.contains("schedule:"), "{text}");
    assert!(text.contains("decision:    admit"), "{text}");
}

#[test]
fn check_refuses_a_window_in_a_daylight_saving_gap() {
    let gap = SCHEDULES.replace(
        "days = [\"fri\"]\nstart = \"17:00\"",
        "days = [\"sun\"]\nstart = \"02:15\"",
    );
    let policy = PolicyDir::new(&format!("{SEED_STREAMS}{gap}"), Some(BERLIN_AREA));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .arg("check")
        .arg(policy.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("streams.toml:"), "{err}");
    assert!(err.contains("schedules[1].start"), "{err}");
    assert!(err.contains("gap on"), "{err}");
}
