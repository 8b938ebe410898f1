//! Live policy: the real file watcher against a temporary directory, ConfigMap symlink swaps,
//! rename saves, truncate-then-write saves, broken files, and replacement under load.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use shedgate::app::Running;

use super::support::*;

/// How long to wait for the watcher to pick a change up before calling it missed. The
/// periodic re-check is set to an hour in these tests, so only the watcher can do it.
pub(super) const WATCH_DEADLINE: Duration = Duration::from_secs(20);

pub(super) fn areas_with_default(rank: u8) -> String {
    format!(
        "default_rank = {rank}\n{}",
        BERLIN_AREA.replace("default_rank = 50", "")
    )
}

pub(super) async fn spawn_watched(upstream: &MockUpstream, dir: &Path) -> Running {
    spawn_proxy_with(&upstream.url(), dir, |a| {
        a.policy_recheck = Some(Duration::from_secs(3600).into())
    })
    .await
}

pub(super) async fn live_policy(proxy: &Running) -> serde_json::Value {
    admin_get(proxy, "/policy").await.json()
}

/// Polls `GET /policy` until `pred` holds; panics after the deadline.
pub(super) async fn wait_for(
    proxy: &Running,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WATCH_DEADLINE;
    loop {
        let p = live_policy(proxy).await;
        if pred(&p) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "watcher missed: {what}; live: {p}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn default_rank(p: &serde_json::Value) -> u64 {
    p["default_rank"].as_u64().unwrap()
}

pub(super) async fn failures(proxy: &Running) -> f64 {
    metric(
        &scrape(proxy).await,
        "shedgate_policy_reloads_total",
        &[("outcome", "failure")],
    )
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_configmap_symlink_swaps_each_take_effect() {
    use std::os::unix::fs::symlink;
    // The layout the kubelet writes: files are symlinks into `..data`, itself a symlink to a
    // timestamped directory, swapped atomically by renaming a new `..data_tmp` over it.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let write_version = |n: u32, rank: u8| {
        let v = dir.join(format!("..2026_11_30_00_00_0{n}"));
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("streams.toml"), SEED_STREAMS).unwrap();
        std::fs::write(v.join("areas.toml"), areas_with_default(rank)).unwrap();
        v
    };
    let first = write_version(0, 50);
    symlink(first.file_name().unwrap(), dir.join("..data")).unwrap();
    symlink("..data/streams.toml", dir.join("streams.toml")).unwrap();
    symlink("..data/areas.toml", dir.join("areas.toml")).unwrap();
    let upstream = MockUpstream::start().await;
    let proxy = spawn_watched(&upstream, dir).await;
    assert_eq!(default_rank(&live_policy(&proxy).await), 50);
    let mut old = first;
    for (n, rank) in [(1, 41u8), (2, 42), (3, 43)] {
        let new = write_version(n, rank);
        symlink(new.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        std::fs::remove_dir_all(&old).unwrap();
        old = new;
        wait_for(&proxy, &format!("swap {n}"), |p| {
            default_rank(p) == u64::from(rank)
        })
        .await;
    }
    assert_eq!(failures(&proxy).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rename_saves_each_take_effect() {
    let policy = PolicyDir::seed();
    let upstream = MockUpstream::start().await;
    let proxy = spawn_watched(&upstream, policy.path()).await;
    for rank in [61u8, 62] {
        // An editor's save: write a temporary file, rename it over the original.
        let tmp = policy.path().join(".areas.toml.swp");
        std::fs::write(&tmp, areas_with_default(rank)).unwrap();
        std::fs::rename(&tmp, policy.path().join("areas.toml")).unwrap();
        wait_for(&proxy, &format!("rename save {rank}"), |p| {
            default_rank(p) == u64::from(rank)
        })
        .await;
    }
    assert_eq!(failures(&proxy).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_then_write_never_exposes_the_empty_state() {
    let policy = PolicyDir::seed();
    let upstream = MockUpstream::start().await;
    let proxy = Arc::new(spawn_watched(&upstream, policy.path()).await);
    let before = live_policy(&proxy).await["version"]
        .as_str()
        .unwrap()
        .to_owned();
    // Watch the live version while the save happens.
    let seen = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let stop = Arc::new(AtomicU64::new(0));
    let observer = {
        let (proxy, seen, stop) = (Arc::clone(&proxy), Arc::clone(&seen), Arc::clone(&stop));
        tokio::spawn(async move {
            while stop.load(Ordering::Relaxed) == 0 {
                let p = live_policy(&proxy).await;
                seen.lock()
                    .unwrap()
                    .insert(p["version"].as_str().unwrap().to_owned());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // A save that truncates in place, then writes (the new content in two writes).
    let path = policy.path().join("streams.toml");
    let new = SEED_STREAMS.replace(
        "[streams.\"dlq.replay\"]",
        "[streams.\"dlq.replay2\"]\nsupersession = \"never\"\n[streams.\"dlq.replay\"]",
    );
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let (a, b) = new.split_at(new.len() / 2);
        f.write_all(a.as_bytes()).unwrap();
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        f.write_all(b.as_bytes()).unwrap();
    }
    wait_for(&proxy, "truncate-then-write", |p| {
        p["streams"].as_array().unwrap().len() == 7
    })
    .await;
    stop.store(1, Ordering::Relaxed);
    observer.await.unwrap();
    let after = live_policy(&proxy).await["version"]
        .as_str()
        .unwrap()
        .to_owned();
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|v| *v == before || *v == after), "{seen:?}");
    assert_eq!(
        failures(&proxy).await,
        0.0,
        "the empty file was never even compiled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_leave_the_previous_policy_live() {
    let policy = PolicyDir::seed();
    let upstream = MockUpstream::start().await;
    let proxy = spawn_watched(&upstream, policy.path()).await;
    let good = live_policy(&proxy).await["version"]
        .as_str()
        .unwrap()
        .to_owned();
    let broken: [(&str, String, &str); 4] = [
        (
            "streams.toml",
            "[streams.\"vehicle.position\"\nsupersession = ".into(),
            "streams.toml:1",
        ),
        (
            "areas.toml",
            BERLIN_AREA.replace("\nrank = 5\n", "\nrank = 0\n"),
            "rank",
        ),
        (
            "streams.toml",
            SEED_STREAMS.replacen("self-superseding", "sometimes", 1),
            "supersession",
        ),
        // A resolution-5 cell: finer than the area key.
        (
            "areas.toml",
            BERLIN_AREA.replace("841f1d5ffffffff", "851f1d4bfffffff"),
            "resolution 5",
        ),
    ];
    for (i, (file, text, expect)) in broken.iter().enumerate() {
        let prev = failures(&proxy).await;
        let tmp = policy.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, policy.path().join(file)).unwrap();
        // The watcher tries it, fails, and counts it.
        let deadline = tokio::time::Instant::now() + WATCH_DEADLINE;
        while failures(&proxy).await <= prev {
            assert!(
                tokio::time::Instant::now() < deadline,
                "failure {i} not counted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let p = live_policy(&proxy).await;
        assert_eq!(
            p["version"],
            good.as_str(),
            "the last good policy stays live"
        );
        let err = p["last_error"].as_str().unwrap();
        assert!(err.contains(file) && err.contains(expect), "{err}");
        // It still decides: Munich shed, Berlin kept at 0.75.
        pin(&proxy, 0.75).await;
        assert_eq!(
            post(&proxy, "vehicle.position", event(BERLIN, 0))
                .await
                .status,
            StatusCode::OK
        );
        assert_eq!(
            post(&proxy, "vehicle.position", event(MUNICH, 0))
                .await
                .status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // POST /reload answers the error too.
        let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let a = send(req).await;
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
        // Restore the good file.
        let good_text = if *file == "streams.toml" {
            SEED_STREAMS.to_owned()
        } else {
            BERLIN_AREA.to_owned()
        };
        std::fs::write(&tmp, good_text).unwrap();
        std::fs::rename(&tmp, policy.path().join(file)).unwrap();
        wait_for(&proxy, "restore", |p| p["last_error"].is_null()).await;
        assert_eq!(live_policy(&proxy).await["version"], good.as_str());
    }
    let m = scrape(&proxy).await;
    assert_eq!(metric(&m, "shedgate_policy_reload_success", &[]), 1.0);
}

/// Policies A and B rank the default area differently; both shed Munich at 0.9, so every
/// shed response names its policy version and the rank that version gives. Many swaps
/// happen during the load: no request fails, and no response mixes the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_the_policy_under_load_fails_no_request() {
    let a_areas = areas_with_default(50);
    let b_areas = areas_with_default(70);
    let policy = PolicyDir::new(SEED_STREAMS, Some(&a_areas));
    let dir = policy.path().to_owned();
    let version_of = |areas: &str| {
        let tmp = PolicyDir::new(SEED_STREAMS, Some(areas));
        shedgate::policy::PolicyFiles::read(tmp.path())
            .unwrap()
            .version()
    };
    let (va, vb) = (version_of(&a_areas), version_of(&b_areas));
    let upstream = MockUpstream::start().await;
    let proxy = Arc::new(spawn_proxy(&upstream.url(), &dir).await);
    pin(&proxy, 0.9).await;

    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 250;
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let proxy = Arc::clone(&proxy);
        let (va, vb) = (va.clone(), vb.clone());
        clients.push(tokio::spawn(async move {
            let mut counts = [0usize; 3];
            for i in 0..PER_CLIENT {
                let (stream, at) = match (c + i) % 3 {
                    0 => ("geofence.transition", MUNICH),
                    1 => ("vehicle.position", BERLIN),
                    _ => ("vehicle.position", MUNICH),
                };
                let a = post(&proxy, stream, event(at, 0)).await;
                match a.status {
                    StatusCode::OK => counts[0] += 1,
                    StatusCode::SERVICE_UNAVAILABLE => {
                        let p = a.json();
                        let (v, rank) = (
                            p["policy_version"].as_str().unwrap(),
                            p["rank"].as_u64().unwrap(),
                        );
                        assert!(
                            (v == va && rank == 50) || (v == vb && rank == 70),
                            "mixed response: version {v} with rank {rank}"
                        );
                        counts[1 + usize::from(v == vb)] += 1;
                    }
                    other => panic!("request failed: {other} {:?}", a.body),
                }
            }
            counts
        }));
    }
    // Meanwhile: swap A and B back and forth, each swap by rename and an explicit reload.
    let mut swaps = 0;
    while !clients.iter().all(tokio::task::JoinHandle::is_finished) && swaps < 200 {
        let areas = if swaps % 2 == 0 { &b_areas } else { &a_areas };
        let tmp = dir.join(".areas.tmp");
        std::fs::write(&tmp, areas).unwrap();
        std::fs::rename(&tmp, dir.join("areas.toml")).unwrap();
        let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(send(req).await.status, StatusCode::OK);
        swaps += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut total = [0usize; 3];
    for c in clients {
        let counts = c.await.unwrap();
        for (t, n) in total.iter_mut().zip(counts) {
            *t += n;
        }
    }
    assert_eq!(total.iter().sum::<usize>(), CLIENTS * PER_CLIENT);
    assert!(swaps >= 10, "only {swaps} swaps happened");
    assert!(
        total[1] > 0 && total[2] > 0,
        "both policies were seen: {total:?}"
    );
    assert_eq!(failures(&proxy).await, 0.0);
}

/// The country-outline policy and a 100,000-cell policy compile and swap in while traffic
/// flows: no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_policies_swap_under_load_without_failures() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let countries_text = std::fs::read_to_string(root.join("data/countries.geojson")).unwrap();
    let doc: geojson::FeatureCollection = countries_text.parse().unwrap();
    let mut countries = String::from("default_rank = 50\n");
    for (i, f) in doc.features.iter().enumerate() {
        let name = f.property("name").and_then(|v| v.as_str()).unwrap();
        countries.push_str(&format!(
            "[[areas]]\nname = \"c{i}\"\nrank = {}\ngeojson = \"countries.geojson\"\nfeature = {name:?}\n",
            1 + i % 100
        ));
    }
    // ~100,000 resolution-4 cells, written as 2,041 resolution-2 cells (49 children each).
    let res2: Vec<String> = h3o::CellIndex::base_cells()
        .flat_map(|b| b.children(h3o::Resolution::Two))
        .take(2041)
        .map(|c| format!("\"{c}\""))
        .collect();
    let big = format!(
        "[[areas]]\nname = \"big\"\nrank = 30\ncells = [{}]\n",
        res2.join(",")
    );
    let policy = PolicyDir::seed();
    std::fs::write(policy.path().join("countries.geojson"), countries_text).unwrap();
    let upstream = MockUpstream::start().await;
    let proxy = Arc::new(spawn_proxy(&upstream.url(), policy.path()).await);
    pin(&proxy, 0.9).await;
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..3 {
        let (proxy, done) = (Arc::clone(&proxy), Arc::clone(&done));
        clients.push(tokio::spawn(async move {
            let mut n = 0u32;
            // Bounded: stops when the swaps are done, or after 3,000 requests.
            while done.load(Ordering::Relaxed) == 0 && n < 3000 {
                let stream = if (c + n).is_multiple_of(2) {
                    "geofence.transition"
                } else {
                    "vehicle.position"
                };
                let a = post(&proxy, stream, event(MUNICH, 0)).await;
                assert!(
                    a.status == StatusCode::OK || a.status == StatusCode::SERVICE_UNAVAILABLE,
                    "request failed: {} {:?}",
                    a.status,
                    a.body
                );
                if stream == "geofence.transition" {
                    assert_eq!(a.status, StatusCode::OK);
                }
                n += 1;
            }
            n
        }));
    }
    for areas in [&countries, &big, BERLIN_AREA, &countries] {
        let tmp = policy.path().join(".areas.tmp");
        std::fs::write(&tmp, areas).unwrap();
        std::fs::rename(&tmp, policy.path().join("areas.toml")).unwrap();
        let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let a = send(req).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    }
    assert!(live_policy(&proxy).await["cells"].as_u64().unwrap() > 50_000);
    done.store(1, Ordering::Relaxed);
    let mut total = 0;
    for c in clients {
        total += c.await.unwrap();
    }
    assert!(total > 0);
    assert_eq!(failures(&proxy).await, 0.0);
}

/// An area renamed by a reload: the old name's series disappear from `/metrics` at that
/// reload, the new name's appear, and the stream's series stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_of_names_that_left_the_policy_disappear() {
    let policy = PolicyDir::seed();
    let upstream = MockUpstream::start().await;
    let proxy = spawn_watched(&upstream, policy.path()).await;
    pin(&proxy, 0.99).await;
    post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    let m = scrape(&proxy).await;
    assert!(m.contains("area=\"berlin\""), "{m}");
    std::fs::write(
        policy.path().join("areas.toml"),
        BERLIN_AREA.replace("\"berlin\"", "\"berlin-mitte\""),
    )
    .unwrap();
    let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
    post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    let m = scrape(&proxy).await;
    assert!(
        !m.contains("area=\"berlin\""),
        "the old name's series are gone: {m}"
    );
    assert!(m.contains("area=\"berlin-mitte\""), "{m}");
    assert!(m.contains("stream=\"vehicle.position\""));
    assert_eq!(
        m.lines()
            .filter(|l| l.starts_with("shedgate_policy_info{"))
            .count(),
        1,
        "only the live version: {m}"
    );
}
