//! `POST|GET|DELETE /policy/preview` and `shedgate preview` against a running proxy: the
//! candidate's decisions counted beside the live ones, the live ones untouched.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use super::access_log::{BERLIN_LOW, STREAMS, fix};
use super::support::*;

async fn admin(proxy: &shedgate::app::Running, method: http::Method, body: &str) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}/policy/preview", proxy.admin_addr))
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
    assert_eq!(
        admin(&proxy, http::Method::DELETE, "").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        admin(&proxy, http::Method::GET, "").await.status,
        StatusCode::NOT_FOUND
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
