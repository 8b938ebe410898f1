//! `POST|GET|DELETE /policy/preview` and `shedgate preview` against a running proxy: the
//! candidate's decisions counted beside the live ones, the live ones untouched.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use super::access_log::{BERLIN_LOW, STREAMS, fix};
use super::support::*;

async fn admin(proxy: &shedgate::app::Running, method: http::Method, body: &str) -> Answer {
    admin_at(proxy, method, "", body).await
}

/// `/policy/preview` with a query (`?id=...`).
async fn admin_at(
    proxy: &shedgate::app::Running,
    method: http::Method,
    query: &str,
    body: &str,
) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}/policy/preview{query}", proxy.admin_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(req).await
}

fn start_body(streams: &str, areas: &str, seconds: u64) -> String {
    serde_json::json!({
        "files": {"streams.toml": streams, "areas.toml": areas},
        "seconds": seconds,
    })
    .to_string()
}

/// At pressure 0.9 the live policy (Berlin at rank 5) keeps Berlin's fixes and sheds Munich's;
/// a candidate with Berlin at rank 90 would shed both, and makes the `never` stream sheddable,
/// which is undecidable on bodies that streamed through. The answers are the live policy's.
#[tokio::test]
async fn a_candidate_is_decided_in_shadow_beside_the_live_policy() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.9).await;
    let candidate_streams = STREAMS.replace(
        "[streams.\"geofence.transition\"]\nsupersession = \"never\"",
        "[streams.\"geofence.transition\"]\nsupersession = \"self-superseding\"",
    );
    let started = admin(
        &proxy,
        http::Method::POST,
        &start_body(&candidate_streams, BERLIN_LOW, 600),
    )
    .await;
    assert_eq!(started.status, StatusCode::OK, "{:?}", started.body);
    let id = started.json()["id"].as_str().unwrap().to_owned();
    let (berlin, munich, never) = (12, 8, 5);
    for i in 0..berlin {
        let a = post(&proxy, "vehicle.position", fix(&format!("b{i}"), BERLIN, 3)).await;
        assert_eq!(a.status, StatusCode::OK, "the live policy decides");
    }
    for i in 0..munich {
        let a = post(&proxy, "vehicle.position", fix(&format!("m{i}"), MUNICH, 3)).await;
        assert_eq!(a.header("x-shed-reason"), Some("pressure"));
    }
    for _ in 0..never {
        assert_eq!(post(&proxy, "geofence.transition", "{}").await.status, 200);
    }
    let report = admin(&proxy, http::Method::GET, "").await.json();
    assert_eq!(report["running"], true);
    let rows = report["rows"].as_array().unwrap();
    let row = |stream: &str, area: &str| {
        rows.iter()
            .find(|r| r["stream"] == stream && r["area"] == area)
            .unwrap_or_else(|| panic!("no row {stream} {area}: {rows:#?}"))
    };
    let b = row("vehicle.position", "berlin");
    assert_eq!(
        (b["then_admitted"].as_f64(), b["now_shed"].as_f64()),
        (Some(12.0), Some(12.0))
    );
    assert_eq!(b["band"], "51-100");
    let m = row("vehicle.position", "-");
    assert_eq!(
        (m["then_shed"].as_f64(), m["now_shed"].as_f64()),
        (Some(8.0), Some(8.0))
    );
    let g = row("geofence.transition", "-");
    assert_eq!(
        (g["then_admitted"].as_f64(), g["undecidable"].as_f64()),
        (Some(5.0), Some(5.0))
    );

    let text = scrape(&proxy).await;
    let counted =
        |labels: &[(&str, &str)]| metric(&text, "shedgate_preview_decisions_total", labels);
    assert_eq!(
        counted(&[
            ("candidate_area", "berlin"),
            ("live", "admitted"),
            ("candidate", "shed")
        ]),
        12.0
    );
    assert_eq!(
        counted(&[("live", "admitted"), ("candidate", "undecidable")]),
        5.0
    );

    // Stopped: the counts are gone, and the live decisions never changed.
    let query = format!("?id={id}");
    let stopped = admin_at(&proxy, http::Method::DELETE, &query, "").await;
    assert_eq!(stopped.status, StatusCode::OK);
    assert_eq!(stopped.json()["stopped"]["id"], id.as_str());
    assert_eq!(
        admin(&proxy, http::Method::GET, "").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        admin_at(&proxy, http::Method::GET, &query, "").await.status,
        StatusCode::GONE
    );
    let a = post(&proxy, "vehicle.position", fix("b0", BERLIN, 1)).await;
    assert_eq!(a.status, StatusCode::OK);
}

/// A candidate that does not compile is refused with file, line and field (422); a window out
/// of range with 400; neither starts a preview.
#[tokio::test]
async fn a_bad_candidate_is_refused_precisely() {
    let (_upstream, _policy, proxy) = seeded().await;
    let bad = start_body(SEED_STREAMS, "default_rank = 500\n", 60);
    let a = admin(&proxy, http::Method::POST, &bad).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("areas.toml") && detail.contains("default_rank"),
        "{detail}"
    );
    let long = start_body(SEED_STREAMS, BERLIN_AREA, 90_000);
    assert_eq!(
        admin(&proxy, http::Method::POST, &long).await.status,
        StatusCode::BAD_REQUEST
    );
    let missing = serde_json::json!({"files": {"areas.toml": BERLIN_AREA}}).to_string();
    let a = admin(&proxy, http::Method::POST, &missing).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        a.json()["detail"]
            .as_str()
            .unwrap()
            .contains("streams.toml")
    );
    assert_eq!(
        admin(&proxy, http::Method::GET, "").await.status,
        StatusCode::NOT_FOUND
    );
}

/// `shedgate preview DIR --for 1s` sends the directory, waits out the window and prints the
/// rows: here every Munich fix would be kept by a candidate with Munich's cell at rank 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_a_preview_and_prints_its_rows() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.9).await;
    let munich_cell = h3o::LatLng::new(MUNICH.0, MUNICH.1)
        .unwrap()
        .to_cell(h3o::Resolution::Four)
        .to_string();
    let candidate = PolicyDir::new(
        STREAMS,
        Some(&format!(
            "default_rank = 50\n[[areas]]\nname = \"munich\"\nrank = 5\ncells = [\"{munich_cell}\"]\n"
        )),
    );
    let admin_addr = proxy.admin_addr.to_string();
    let dir = candidate.path().to_owned();
    let command = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
            .args(["preview", "--for", "2s", "--admin", &admin_addr])
            .arg(&dir)
            .output()
            .unwrap()
    });
    // The preview starts within the command's first second.
    let mut started = false;
    for _ in 0..100 {
        if admin(&proxy, http::Method::GET, "").await.status == StatusCode::OK {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(started, "no preview started");
    for i in 0..6 {
        let a = post(&proxy, "vehicle.position", fix(&format!("m{i}"), MUNICH, 3)).await;
        assert_eq!(a.header("x-shed-reason"), Some("pressure"));
    }
    let out = command.await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("vehicle.position") && l.contains("munich"))
        .unwrap_or_else(|| panic!("{text}"));
    let numbers: Vec<&str> = row.split_whitespace().skip(3).collect();
    assert_eq!(numbers[..4], ["0", "6", "6", "0"], "{row}");
}

fn start_by(by: &str, seconds: u64) -> String {
    serde_json::json!({
        "files": {"streams.toml": STREAMS, "areas.toml": BERLIN_LOW},
        "seconds": seconds,
        "by": by,
    })
    .to_string()
}

/// One preview at a time: a second `POST` while one runs is refused 409 naming the holder; a
/// `DELETE` must name the preview it stops (none without an id, none with another's); the
/// counts asked for by id are that preview's.
#[tokio::test]
async fn a_second_preview_is_refused_with_its_holder() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.9).await;
    let a = admin(&proxy, http::Method::POST, &start_by("alice@ops", 600)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let a = a.json();
    let id = a["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 12, "{a}");
    assert_eq!(a["by"], "alice@ops");

    let b = admin(&proxy, http::Method::POST, &start_by("bob@ops", 60)).await;
    assert_eq!(b.status, StatusCode::CONFLICT);
    assert_eq!(b.header("content-type"), Some("application/problem+json"));
    let b = b.json();
    assert_eq!(b["holder"]["id"], id.as_str());
    assert_eq!(b["holder"]["by"], "alice@ops");
    let detail = b["detail"].as_str().unwrap();
    assert!(
        detail.contains(&id) && detail.contains("alice@ops") && detail.contains("DELETE"),
        "{detail}"
    );
    let control = serde_json::json!({"files": {}, "by": "bob\u{1b}[2J"}).to_string();
    assert_eq!(
        admin(&proxy, http::Method::POST, &control).await.status,
        StatusCode::BAD_REQUEST
    );

    for i in 0..3 {
        post(&proxy, "vehicle.position", fix(&format!("b{i}"), BERLIN, 3)).await;
    }
    let query = format!("?id={id}");
    let report = admin_at(&proxy, http::Method::GET, &query, "").await.json();
    assert_eq!((&report["id"], &report["by"]), (&a["id"], &a["by"]));
    let rows = report["rows"].as_array().unwrap();
    let total: f64 = rows.iter().map(|r| r["now_shed"].as_f64().unwrap()).sum();
    assert_eq!(total, 3.0, "{rows:#?}");

    // A DELETE that names nothing, or another preview, stops nothing.
    let blind = admin(&proxy, http::Method::DELETE, "").await;
    assert_eq!(blind.status, StatusCode::BAD_REQUEST);
    assert!(blind.json()["detail"].as_str().unwrap().contains(&id));
    let other = admin_at(&proxy, http::Method::DELETE, "?id=000000000000", "").await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert!(other.json()["detail"].as_str().unwrap().contains(&id));
    let still = admin_at(&proxy, http::Method::GET, &query, "").await.json();
    assert_eq!(still["running"], true);

    let stopped = admin_at(&proxy, http::Method::DELETE, &query, "").await;
    assert_eq!(stopped.status, StatusCode::OK);
    assert_eq!(stopped.json()["stopped"]["by"], "alice@ops");
    assert_eq!(
        admin_at(&proxy, http::Method::DELETE, &query, "")
            .await
            .status,
        StatusCode::GONE
    );
    let b = admin(&proxy, http::Method::POST, &start_by("bob@ops", 60)).await;
    assert_eq!(b.status, StatusCode::OK);
    assert_ne!(b.json()["id"], id.as_str());
}

/// A preview that ran its window out is replaced by the next `POST`, and its owner still
/// reads its own final counts by id, never the next one's. The proxy's clock is a test's.
#[tokio::test]
async fn an_ended_preview_keeps_its_counts_under_its_id() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let clock = Arc::new(AtomicI64::new(NOW.0));
    let read = Arc::clone(&clock);
    let args = shedgate::config::ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.url()),
        policies: Some(policy.path().to_owned()),
        ..shedgate::config::ServeArgs::default()
    };
    let config = shedgate::config::Config::from_args(args).unwrap();
    let sources =
        sources().with_clock(move || shedgate::clock::UnixMillis(read.load(Ordering::SeqCst)));
    let proxy = shedgate::app::start(config, sources).await.unwrap().0;
    pin(&proxy, 0.9).await;

    let a = admin(&proxy, http::Method::POST, &start_by("alice", 60))
        .await
        .json();
    let a_id = a["id"].as_str().unwrap().to_owned();
    for i in 0..4 {
        post(&proxy, "vehicle.position", fix(&format!("b{i}"), BERLIN, 3)).await;
    }
    clock.fetch_add(61_000, Ordering::SeqCst);
    let b = admin(&proxy, http::Method::POST, &start_by("bob", 60)).await;
    assert_eq!(b.status, StatusCode::OK, "an ended preview holds nothing");
    let b_id = b.json()["id"].as_str().unwrap().to_owned();
    post(&proxy, "vehicle.position", fix("m0", MUNICH, 3)).await;

    let shed = |report: &serde_json::Value| -> f64 {
        report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["now_shed"].as_f64().unwrap())
            .sum()
    };
    let a = admin_at(&proxy, http::Method::GET, &format!("?id={a_id}"), "")
        .await
        .json();
    assert_eq!(
        (a["running"].as_bool(), shed(&a)),
        (Some(false), 4.0),
        "{a}"
    );
    assert_eq!(a["seconds"], 60.0);
    let current = admin(&proxy, http::Method::GET, "").await.json();
    assert_eq!(current["id"], b_id.as_str());
    assert_eq!(shed(&current), 1.0, "{current}");
}

/// Two operators at once through the command: the second is refused and told who holds the
/// slot; the first prints its own counts. An interrupted command stops its own preview, and
/// only it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commands_never_cross_and_an_interrupt_stops_only_its_own() {
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::new(STREAMS, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    pin(&proxy, 0.9).await;
    let candidate = PolicyDir::new(STREAMS, Some(BERLIN_LOW));
    let admin_addr = proxy.admin_addr.to_string();
    let command = |window: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
            .args(["preview", "--for", window, "--admin", &admin_addr])
            .arg(candidate.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let running = async || {
        for _ in 0..200 {
            let current = admin(&proxy, http::Method::GET, "").await;
            if current.status == StatusCode::OK && current.json()["running"] == true {
                return current.json();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no preview started");
    };

    let first = command("2s");
    let held = running().await;
    let first_id = held["id"].as_str().unwrap().to_owned();
    let second = command("2s");
    let second = tokio::task::spawn_blocking(move || second.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let err = String::from_utf8_lossy(&second.stderr);
    let by = held["by"].as_str().unwrap();
    assert!(by.contains(&format!("pid {}", first.id())), "{by}");
    assert!(
        err.contains("runs another preview")
            && err.contains(held["id"].as_str().unwrap())
            && err.contains(by),
        "{err}"
    );
    for i in 0..5 {
        post(&proxy, "vehicle.position", fix(&format!("b{i}"), BERLIN, 3)).await;
    }
    let first = tokio::task::spawn_blocking(move || first.wait_with_output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("vehicle.position") && l.contains("berlin"))
        .unwrap_or_else(|| panic!("{text}"));
    let numbers: Vec<&str> = row.split_whitespace().skip(3).collect();
    assert_eq!(numbers[..4], ["5", "0", "0", "5"], "{row}");

    // The test proxy's clock stands still, so the first preview never ends: stopped by id.
    let stop = admin_at(&proxy, http::Method::DELETE, &format!("?id={first_id}"), "").await;
    assert_eq!(stop.status, StatusCode::OK);

    // Interrupted, a command stops its own preview (and says so), exit 130.
    let third = command("10m");
    let held = running().await;
    let kill = std::process::Command::new("kill")
        .args(["-INT", &third.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let third = tokio::task::spawn_blocking(move || third.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(third.status.code(), Some(130), "{third:?}");
    let id = held["id"].as_str().unwrap();
    assert!(String::from_utf8_lossy(&third.stderr).contains(&format!("preview {id} stopped")));
    assert_eq!(
        admin_at(&proxy, http::Method::GET, &format!("?id={id}"), "")
            .await
            .status,
        StatusCode::GONE
    );
}
