//! Upstreams changed by a reload, over real sockets: an added upstream serves at once and
//! starts cold; a removed one's requests in flight each end with their answer, then its
//! connections close and its series go; a new URL sends new requests to the new address
//! while the old pool drains, the pressure carried over; an unchanged upstream keeps its
//! pressure and pin; a new latency target's controller counts the requests in flight under
//! the old one against its cap and budgets; a reload whose upstream would loop to the
//! proxy's own address is refused and changes nothing; and an upstream removed under a
//! steady stream of requests loses none that was acknowledged.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use shedgate::app::Running;

use crate::support::*;

/// How long a condition that follows from requests ending may take to show (connections
/// closing): a bound against a hang, not a measure.
const SETTLE: Duration = Duration::from_secs(10);

/// The seed policy with `vehicle.position` and `geofence.transition` sent to `tracking`
/// at `url` (its table given `extra` keys), and `more` appended.
fn with_tracking(url: &str, extra: &str, more: &str) -> String {
    format!(
        "{}\n[upstreams.tracking]\nurl = \"{url}\"\n{extra}\n{more}",
        SEED_STREAMS
            .replace(
                "[streams.\"vehicle.position\"]\n",
                "[streams.\"vehicle.position\"]\nupstream = \"tracking\"\n",
            )
            .replace(
                "[streams.\"geofence.transition\"]\n",
                "[streams.\"geofence.transition\"]\nupstream = \"tracking\"\n",
            )
    )
}

/// Writes `streams` as the policy's `streams.toml` (a rename, as editors save) and asks the
/// proxy to reload.
async fn reload(proxy: &Running, policy: &PolicyDir, streams: &str) -> Answer {
    let tmp = policy.path().join(".streams.tmp");
    std::fs::write(&tmp, streams).unwrap();
    std::fs::rename(&tmp, policy.path().join("streams.toml")).unwrap();
    let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(req).await
}

/// A `geofence.transition` (never shed) request carrying `id` in its body.
fn never(proxy: &Running, id: u64) -> Request<Full<Bytes>> {
    Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .header("x-stream", "geofence.transition")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"id\":{id}}}"))))
        .unwrap()
}

async fn pressure_of(proxy: &Running, upstream: &str) -> Answer {
    admin_get(proxy, &format!("/pressure?upstream={upstream}")).await
}

async fn pin_upstream(proxy: &Running, upstream: &str, pressure: f64) {
    let req = Request::put(format!(
        "http://{}/pressure?upstream={upstream}",
        proxy.admin_addr
    ))
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from(format!("{{\"pin\":{pressure}}}"))))
    .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
}

/// Waits until `cond` holds, panicking with `what` after [`SETTLE`].
async fn settle(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + SETTLE;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `upstream` has seen `n` requests (clock probes aside).
async fn seen(upstream: &MockUpstream, n: usize) {
    settle(&format!("{n} requests at {}", upstream.addr), || {
        upstream.count() >= n
    })
    .await;
}

/// An upstream a reload adds serves the next request bound there, cold: its pressure at 0,
/// not pinned, listed in `/stats`; before the reload the admin listener knew no such name.
#[tokio::test]
async fn a_reload_adds_an_upstream_that_serves_at_once_and_starts_cold() {
    let (default, tracking) = (MockUpstream::start().await, MockUpstream::start().await);
    let policy = PolicyDir::seed();
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    assert_eq!(
        pressure_of(&proxy, "tracking").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post(&proxy, "geofence.transition", "{}").await.status,
        StatusCode::OK
    );
    assert_eq!((default.count(), tracking.count()), (1, 0));
    let added = with_tracking(&tracking.url(), "", "");
    assert_eq!(reload(&proxy, &policy, &added).await.status, StatusCode::OK);
    assert_eq!(
        post(&proxy, "geofence.transition", "{}").await.status,
        StatusCode::OK
    );
    assert_eq!((default.count(), tracking.count()), (1, 1));
    let p = pressure_of(&proxy, "tracking").await.json();
    assert_eq!(
        (
            p["upstream"].as_str(),
            p["value"].as_f64(),
            p["pinned"].as_bool()
        ),
        (Some("tracking"), Some(0.0), Some(false)),
        "{p}"
    );
    let stats = admin_get(&proxy, "/stats").await.json();
    let names: Vec<&str> = stats["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "tracking"]);
}

/// Requests in flight to an upstream a reload removes each end with its upstream's answer;
/// the next request of their stream goes to `default`; once they have ended the removed
/// upstream's connections close, the pressure it counted them in falls back to 0, and its
/// series leave the exposition.
#[tokio::test]
async fn a_removed_upstreams_requests_in_flight_each_end_with_their_answer() {
    let default = MockUpstream::start().await;
    let tracking = MockUpstream::with(Behaviour {
        delay: Duration::from_millis(300),
        ..Behaviour::default()
    })
    .await;
    let policy = PolicyDir::new(&with_tracking(&tracking.url(), "", ""), Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    let gauge = std::sync::Arc::clone(
        &proxy
            .parts
            .upstreams
            .table()
            .named("tracking")
            .unwrap()
            .pressure,
    );
    let in_flight: Vec<_> = (0..5)
        .map(|i| tokio::spawn(send(never(&proxy, i))))
        .collect();
    seen(&tracking, 5).await;
    assert_eq!(gauge.inflight(), 5);
    let removed = reload(&proxy, &policy, SEED_STREAMS).await;
    assert_eq!(removed.status, StatusCode::OK, "{:?}", removed.body);
    assert_eq!(
        pressure_of(&proxy, "tracking").await.status,
        StatusCode::NOT_FOUND
    );
    for answer in in_flight {
        let a = answer.await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        assert_eq!(a.body, Bytes::from_static(b"{\"ok\":true}"));
    }
    assert_eq!((default.count(), tracking.count()), (0, 5));
    assert_eq!(send(never(&proxy, 5)).await.status, StatusCode::OK);
    assert_eq!((default.count(), tracking.count()), (1, 5));
    assert_eq!(
        gauge.inflight(),
        0,
        "each request ended where it was counted"
    );
    settle("the removed upstream's connections closed", || {
        tracking.connections().1 == 0
    })
    .await;
    let text = scrape(&proxy).await;
    assert!(
        !text.contains("upstream=\"tracking\""),
        "a removed upstream's series are left out:\n{text}"
    );
    assert!(
        text.contains("shedgate_pressure{upstream=\"default\"}"),
        "{text}"
    );
}

/// A new URL: the request in flight to the old address ends there with its answer, new
/// requests go to the new address, the old address's connections close once the request on
/// them has ended; the pressure (its pin, its in-flight count) carries on.
#[tokio::test]
async fn a_new_url_drains_the_old_pool_and_keeps_the_pressure() {
    let default = MockUpstream::start().await;
    let old = MockUpstream::with(Behaviour {
        delay: Duration::from_millis(300),
        ..Behaviour::default()
    })
    .await;
    let new = MockUpstream::start().await;
    let policy = PolicyDir::new(&with_tracking(&old.url(), "", ""), Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    pin_upstream(&proxy, "tracking", 0.25).await;
    let in_flight = tokio::spawn(send(never(&proxy, 0)));
    seen(&old, 1).await;
    assert_eq!(old.connections(), (1, 1));
    let moved = reload(&proxy, &policy, &with_tracking(&new.url(), "", "")).await;
    assert_eq!(moved.status, StatusCode::OK, "{:?}", moved.body);
    assert_eq!(send(never(&proxy, 1)).await.status, StatusCode::OK);
    assert_eq!((old.count(), new.count()), (1, 1));
    let p = pressure_of(&proxy, "tracking").await.json();
    assert_eq!(
        (p["value"].as_f64(), p["pinned"].as_bool()),
        (Some(0.25), Some(true)),
        "the pin carried over: {p}"
    );
    let a = in_flight.await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    settle("the old address's connections closed", || {
        old.connections() == (1, 0)
    })
    .await;
    let stats = admin_get(&proxy, "/stats").await.json();
    let tracking = stats["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "tracking")
        .unwrap()
        .clone();
    assert_eq!(
        tracking["inflight"], 0,
        "counted and ended on one gauge: {stats}"
    );
    assert_eq!(new.connections().0, 1);
    assert_eq!((default.count(), old.count(), new.count()), (0, 1, 1));
}

/// A reload that leaves an upstream's settings as they were keeps it as it was (its pin
/// here); one that changes its latency target gives it a new controller, cold (the pin,
/// the controller's, is gone).
#[tokio::test]
async fn an_unchanged_upstream_keeps_its_pressure_and_a_new_target_starts_cold() {
    let (default, tracking, events) = (
        MockUpstream::start().await,
        MockUpstream::start().await,
        MockUpstream::start().await,
    );
    let policy = PolicyDir::new(&with_tracking(&tracking.url(), "", ""), Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    pin_upstream(&proxy, "tracking", 0.7).await;
    let before = proxy.parts.upstreams.table();
    let more = format!(
        "[upstreams.events]\nurl = \"{}\"\n\n[[routes]]\nprefix = \"/events\"\nstream = \"dlq.replay\"\nupstream = \"events\"\n",
        events.url()
    );
    let a = reload(&proxy, &policy, &with_tracking(&tracking.url(), "", &more)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let after = proxy.parts.upstreams.table();
    assert!(
        std::sync::Arc::ptr_eq(
            before.named("tracking").unwrap(),
            after.named("tracking").unwrap()
        ),
        "the same upstream"
    );
    let p = pressure_of(&proxy, "tracking").await.json();
    assert_eq!(
        (p["value"].as_f64(), p["pinned"].as_bool()),
        (Some(0.7), Some(true)),
        "{p}"
    );
    assert_eq!(pressure_of(&proxy, "default").await.json()["pinned"], false);
    let target = with_tracking(&tracking.url(), "latency_target = \"40ms\"\n", &more);
    let a = reload(&proxy, &policy, &target).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let p = pressure_of(&proxy, "tracking").await.json();
    assert_eq!(
        (p["value"].as_f64(), p["pinned"].as_bool()),
        (Some(0.0), Some(false)),
        "{p}"
    );
    assert_eq!(send(never(&proxy, 0)).await.status, StatusCode::OK);
    assert_eq!((default.count(), tracking.count()), (0, 1));
}

/// A new latency target gives `tracking` a new controller, but the requests still in flight
/// under the old one stay counted by the new one: its in-flight cap (2, both taken by held
/// requests) and its class budgets (best-effort's half of it, taken) still bind, so a third
/// best-effort request is shed for the budget, not sent on; once the held ones have ended
/// the count falls back to 0 (each counted once) and the next request is admitted.
#[tokio::test]
async fn a_new_controller_keeps_counting_the_requests_in_flight_under_the_old_one() {
    let default = MockUpstream::start().await;
    let hold = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let tracking = MockUpstream::with(Behaviour {
        hold: Some(std::sync::Arc::clone(&hold)),
        ..Behaviour::default()
    })
    .await;
    let capped = |target: &str| {
        with_tracking(
            &tracking.url(),
            &format!("max_inflight = 2\nlatency_target = \"{target}\"\n"),
            "[classes.best-effort]\nbudget = 0.5\n",
        )
        .replace(
            "[streams.\"vehicle.position\"]\n",
            "[streams.\"vehicle.position\"]\nclass = \"best-effort\"\n",
        )
    };
    let streams = capped("100ms");
    assert!(streams.contains("class = \"best-effort\""), "{streams}");
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = std::sync::Arc::new(spawn_proxy(&default.url(), policy.path()).await);
    // Pressure pinned at 0 on each controller: only the budgets shed here.
    pin_upstream(&proxy, "tracking", 0.0).await;
    let held: Vec<_> = ["vehicle.position", "geofence.transition"]
        .into_iter()
        .map(|stream| {
            let proxy = std::sync::Arc::clone(&proxy);
            tokio::spawn(async move { post(&proxy, stream, event(MUNICH, 0)).await })
        })
        .collect();
    seen(&tracking, 2).await;
    let a = reload(&proxy, &policy, &capped("80ms")).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    pin_upstream(&proxy, "tracking", 0.0).await;
    let p = pressure_of(&proxy, "tracking").await.json();
    assert_eq!(
        (
            p["inflight"].as_u64(),
            p["controller"]["latency_target_ms"].as_f64()
        ),
        (Some(2), Some(80.0)),
        "the new controller counts the two in flight: {p}"
    );
    let third = tokio::select! {
        a = post(&proxy, "vehicle.position", event(MUNICH, 0)) => a,
        () = seen(&tracking, 3) => panic!("a third request went to an upstream capped at 2"),
    };
    assert_eq!(
        third.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        third.body
    );
    assert_eq!(third.header("x-shed-reason"), Some("budget"));
    hold.add_permits(2);
    for a in held {
        assert_eq!(a.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        pressure_of(&proxy, "tracking").await.json()["inflight"],
        0,
        "each request counted once, and ended"
    );
    hold.add_permits(1);
    let next = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(next.status, StatusCode::OK, "{:?}", next.body);
    assert_eq!((default.count(), tracking.count()), (0, 3));
}

/// `shedgate_shedding_seconds_total` of an upstream a reload removes and a later one adds back
/// under its name continues from its count: once it sheds again its count rises with the
/// seconds it sheds, measured against `default` shedding over the same ticks, not only once
/// the new seconds pass the old count.
#[tokio::test]
async fn an_upstream_that_comes_back_continues_its_shedding_seconds() {
    let (default, tracking) = (MockUpstream::start().await, MockUpstream::start().await);
    let added = with_tracking(&tracking.url(), "", "");
    let policy = PolicyDir::new(&added, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    let shed = |text: &str, upstream: &str| {
        metric(
            text,
            "shedgate_shedding_seconds_total",
            &[("upstream", upstream)],
        )
    };
    // `default` sheds throughout: its count says how many seconds of ticks have passed.
    pin_upstream(&proxy, "default", 0.9).await;
    let past_default = |seconds: f64| {
        let proxy = &proxy;
        async move {
            let deadline = tokio::time::Instant::now() + SETTLE;
            while shed(&scrape(proxy).await, "default") < seconds {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "default never shed {seconds} s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    pin_upstream(&proxy, "tracking", 0.9).await;
    past_default(shed(&scrape(&proxy).await, "default") + 2.0).await;
    // Stopped, then read once a second of ticks has passed: its count no longer moves.
    pin_upstream(&proxy, "tracking", 0.0).await;
    past_default(shed(&scrape(&proxy).await, "default") + 1.0).await;
    let before = shed(&scrape(&proxy).await, "tracking");
    assert!(before >= 2.0, "{before}");
    let a = reload(&proxy, &policy, SEED_STREAMS).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    // Ticks without it, so the tick forgets whatever it kept of it.
    past_default(shed(&scrape(&proxy).await, "default") + 1.0).await;
    let a = reload(&proxy, &policy, &added).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    pin_upstream(&proxy, "tracking", 0.9).await;
    past_default(shed(&scrape(&proxy).await, "default") + 2.0).await;
    // At least one whole second shed since it came back (pinned before `default` moved on
    // by two), at most about two: without continuing, the count would still read `before`.
    let after = shed(&scrape(&proxy).await, "tracking");
    assert!(
        after >= before + 1.0,
        "shedding seconds of tracking: {before} before its removal, {after} after a second \
         and more of shedding since it came back"
    );
}

/// A reload whose upstream's URL is the proxy's own address would send requests round in a
/// loop: refused as a broken policy is, with the file and field, and nothing changes: the
/// live version, the routing, the pin.
#[tokio::test]
async fn a_reload_looping_to_the_proxys_own_address_is_refused_and_changes_nothing() {
    let (default, tracking) = (MockUpstream::start().await, MockUpstream::start().await);
    let policy = PolicyDir::new(&with_tracking(&tracking.url(), "", ""), Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    pin_upstream(&proxy, "tracking", 0.4).await;
    let live = admin_get(&proxy, "/policy").await.json()["version"].clone();
    let looping = with_tracking(&format!("http://{}", proxy.proxy_addr), "", "");
    let a = reload(&proxy, &policy, &looping).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("streams.toml:")
            && detail.contains("field `upstreams.\"tracking\".url`")
            && detail.contains("the proxy's own --listen address: requests would loop"),
        "{detail}"
    );
    assert_eq!(admin_get(&proxy, "/policy").await.json()["version"], live);
    let p = pressure_of(&proxy, "tracking").await.json();
    assert_eq!(
        (p["value"].as_f64(), p["pinned"].as_bool()),
        (Some(0.4), Some(true)),
        "{p}"
    );
    assert_eq!(send(never(&proxy, 0)).await.status, StatusCode::OK);
    assert_eq!((default.count(), tracking.count()), (0, 1));
}

/// Acknowledged ⇒ delivered while an upstream is removed under load: four senders post
/// never-shed requests, each with its own id, to `tracking`; after a third of them have
/// been answered a reload removes `tracking` (its stream falls back to `default`). Every
/// request is answered 2xx (none reset, none lost), and each id answered reached an
/// upstream: the removed one or `default`, and both took some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_upstream_under_load_loses_no_acknowledged_request() {
    const REQUESTS: u64 = 300;
    const SENDERS: u64 = 4;
    let default = MockUpstream::start().await;
    let tracking = MockUpstream::with(Behaviour {
        delay: Duration::from_millis(5),
        ..Behaviour::default()
    })
    .await;
    let policy = PolicyDir::new(&with_tracking(&tracking.url(), "", ""), Some(BERLIN_AREA));
    let proxy = std::sync::Arc::new(spawn_proxy(&default.url(), policy.path()).await);
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for s in 0..SENDERS {
        let (proxy, answered) = (
            std::sync::Arc::clone(&proxy),
            std::sync::Arc::clone(&answered),
        );
        senders.spawn(async move {
            let c = client();
            let mut acknowledged = Vec::new();
            for id in (s..REQUESTS).step_by(usize::try_from(SENDERS).unwrap()) {
                let response = c.request(never(&proxy, id)).await;
                let response = response.unwrap_or_else(|e| panic!("request {id} failed: {e}"));
                let status = response.status();
                let body = http_body_util::BodyExt::collect(response.into_body())
                    .await
                    .unwrap_or_else(|e| panic!("answer {id} cut: {e}"));
                assert!(status.is_success(), "request {id}: {status}");
                assert_eq!(body.to_bytes(), Bytes::from_static(b"{\"ok\":true}"));
                acknowledged.push(id);
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            acknowledged
        });
    }
    settle("a third of the requests answered", || {
        answered.load(std::sync::atomic::Ordering::SeqCst) >= REQUESTS / 3
    })
    .await;
    let a = reload(&proxy, &policy, SEED_STREAMS).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let mut acknowledged = Vec::new();
    while let Some(done) = senders.join_next().await {
        acknowledged.extend(done.unwrap());
    }
    acknowledged.sort_unstable();
    assert_eq!(
        acknowledged,
        (0..REQUESTS).collect::<Vec<_>>(),
        "every request answered 2xx"
    );
    let ids = |upstream: &MockUpstream| -> Vec<u64> {
        upstream
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| !r.is_clock_probe())
            .map(|r| {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                v["id"].as_u64().unwrap()
            })
            .collect()
    };
    let (at_tracking, at_default) = (ids(&tracking), ids(&default));
    assert!(
        !at_tracking.is_empty() && !at_default.is_empty(),
        "the removal came mid-run: {} at tracking, {} at default",
        at_tracking.len(),
        at_default.len()
    );
    let mut delivered: Vec<u64> = at_tracking.iter().chain(&at_default).copied().collect();
    delivered.sort_unstable();
    assert_eq!(
        delivered, acknowledged,
        "each acknowledged id delivered, once"
    );
}
