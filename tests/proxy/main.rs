//! Integration tests: the proxy over real loopback sockets in front of a real mock upstream.

mod access_log;
mod admin;
mod admin_guard;
mod cases;
mod classes;
mod clock;
#[cfg(target_os = "linux")]
mod descriptors;
mod device_hash;
mod devices;
mod docs;
mod faults;
mod freshness;
mod fuzz;
mod geography;
mod h2;
mod h2_frames;
#[cfg(feature = "demo")]
mod harness;
mod held;
mod http10;
mod keepalive;
mod layering;
mod lifecycle;
mod load_report;
mod log_lines;
#[cfg(feature = "demo")]
mod low_signal;
mod memory;
mod operator;
mod pool;
mod preview;
mod processes;
mod reload;
mod reload_links;
mod replay;
#[cfg(feature = "demo")]
mod replicas;
#[cfg(feature = "demo")]
mod scenarios;
mod schedules;
mod signals;
#[cfg(feature = "demo")]
mod stream_costs;
mod support;
mod tls;
mod tls_edges;
mod upstream_accounts;
mod upstream_records;
mod upstream_reload;
mod upstreams;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// === The geographic seed's five verification properties, through the proxy ===

#[tokio::test]
async fn boundary_edits_are_never_shed_at_any_pressure() {
    let (upstream, _policy, proxy) = seeded().await;
    for (i, pressure) in [0.0, 0.5, 0.9, 1.0].into_iter().enumerate() {
        pin(&proxy, pressure).await;
        let a = post(&proxy, "feature.boundary_edit", event(BERLIN, 0)).await;
        assert_eq!(a.status, StatusCode::OK, "pressure {pressure}");
        assert_eq!(upstream.count(), 2 * i + 1);
        // Even a stale one in an unconfigured area.
        let a = post(&proxy, "feature.boundary_edit", event(MUNICH, 3600)).await;
        assert_eq!(a.status, StatusCode::OK, "pressure {pressure}");
    }
}

#[tokio::test]
async fn unknown_stream_defaults_to_never_shed() {
    let (upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 1.0).await;
    let a = post(&proxy, "some.new.topic", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    // And a request naming no stream at all.
    let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .body(Full::new(Bytes::from(event(MUNICH, 120))))
        .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn stale_pings_are_shed_even_at_zero_pressure() {
    let (upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 0.0).await;
    let a = post(&proxy, "vehicle.position", event(BERLIN, 120)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert_eq!(a.header("x-shed-reason"), Some("stale"));
    assert_eq!(a.json()["reason"], "stale");
    assert_eq!(
        upstream.count(),
        0,
        "a shed request never reaches the upstream"
    );
    // A time in the future (clock skew) is not stale.
    let a = post(&proxy, "vehicle.position", event(BERLIN, -300)).await;
    assert_eq!(a.status, StatusCode::OK);
    let m = scrape(&proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_shed_total",
            &[
                ("stream", "vehicle.position"),
                ("reason", "stale"),
                ("area", "berlin")
            ]
        ),
        1.0
    );
    assert_eq!(
        metric(&m, "shedgate_shed_total", &[("reason", "pressure")]),
        0.0
    );
}

#[tokio::test]
async fn priority_areas_survive_longer_than_default_ones() {
    let (upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 0.75).await;
    let kept = post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
    assert_eq!(kept.status, StatusCode::OK);
    assert_eq!(upstream.count(), 1);
    let shed = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        upstream.count(),
        1,
        "a shed request never reaches the upstream"
    );
    let m = scrape(&proxy).await;
    assert_eq!(
        metric(
            &m,
            "shedgate_shed_total",
            &[("area", "unconfigured"), ("reason", "pressure")]
        ),
        1.0
    );
}

#[tokio::test]
async fn nothing_is_shed_below_the_pressure_floor() {
    let (upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 0.4).await;
    for at in [BERLIN, MUNICH] {
        let a = post(&proxy, "vehicle.position", event(at, 0)).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    assert_eq!(upstream.count(), 2);
}

// === Responses ===

#[tokio::test]
async fn shed_answers_503_with_retry_after_and_problem_json() {
    let (upstream, _policy, proxy) = seeded().await;
    pin(&proxy, 0.9).await;
    let mut seconds = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let a = post(&proxy, "sensor.reading", event(MUNICH, 0)).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        let retry = a.header("retry-after").expect("Retry-After");
        assert!(
            !retry.is_empty()
                && retry.bytes().all(|b| b.is_ascii_digit())
                && !retry.starts_with('0'),
            "Retry-After {retry:?} is not ^[1-9][0-9]*$"
        );
        seconds.insert(retry.parse::<u32>().unwrap());
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
        assert_eq!(a.header("x-shed-reason"), Some("pressure"));
        let p = a.json();
        assert_eq!(p["status"], 503);
        assert_eq!(p["stream"], "sensor.reading");
        assert_eq!(p["reason"], "pressure");
        assert_eq!(p["area"], "unconfigured");
        assert_eq!(p["rank"], 50);
        assert!(p["policy_version"].as_str().is_some_and(|v| v.len() == 12));
    }
    assert!(seconds.len() >= 2, "Retry-After is jittered: {seconds:?}");
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn upstream_down_is_502() {
    let policy = PolicyDir::seed();
    let dead = closed_port().await;
    let proxy = spawn_proxy(&format!("http://{dead}"), policy.path()).await;
    for stream in ["vehicle.position", "feature.boundary_edit"] {
        let a = post(&proxy, stream, event(BERLIN, 0)).await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{stream}");
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
        assert_eq!(a.json()["status"], 502);
    }
    let m = scrape(&proxy).await;
    assert_eq!(proxy_errors(&m, "bad_gateway"), 2.0);
}

#[tokio::test]
async fn upstream_too_slow_is_504() {
    let (_upstream, _policy, proxy) = seeded_with(
        Behaviour {
            delay: Duration::from_secs(5),
            ..Behaviour::default()
        },
        |a| {
            a.upstream_timeout = Some(Duration::from_millis(300).into());
            a.latency_target = Some(Duration::from_millis(100).into());
        },
    )
    .await;
    let a = post(&proxy, "geofence.transition", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let m = scrape(&proxy).await;
    assert_eq!(proxy_errors(&m, "gateway_timeout"), 1.0);
}

#[tokio::test]
async fn declared_body_over_the_limit_is_413() {
    let (upstream, _policy, proxy) =
        seeded_with(Behaviour::default(), |a| a.max_body = Some(1000)).await;
    for stream in ["vehicle.position", "feature.boundary_edit"] {
        let a = post(&proxy, stream, vec![b' '; 1001]).await;
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{stream}");
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
    }
    // At the limit is fine.
    let body = format!("{:<1000}", event(BERLIN, 0));
    assert_eq!(
        post(&proxy, "vehicle.position", body).await.status,
        StatusCode::OK
    );
    assert_eq!(upstream.count(), 1);
    // Refused before an upstream was chosen for them: counted at `upstream="none"`; the one
    // forwarded at the upstream it went to.
    let m = scrape(&proxy).await;
    for stream in ["vehicle.position", "feature.boundary_edit"] {
        let labels = [
            ("stream", stream),
            ("outcome", "rejected"),
            ("upstream", "none"),
        ];
        assert_eq!(metric(&m, "shedgate_requests_total", &labels), 1.0, "{m}");
    }
    let forwarded = [
        ("stream", "vehicle.position"),
        ("outcome", "forwarded"),
        ("upstream", "default"),
    ];
    assert_eq!(
        metric(&m, "shedgate_requests_total", &forwarded),
        1.0,
        "{m}"
    );
}

/// A chunked body (no Content-Length) that streams past the limit.
#[tokio::test]
async fn streamed_body_over_the_limit_is_413() {
    let (_upstream, _policy, proxy) =
        seeded_with(Behaviour::default(), |a| a.max_body = Some(1000)).await;
    for stream in ["vehicle.position", "feature.boundary_edit"] {
        let body = Chunks {
            left: 10,
            size: 200,
        };
        let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
            .header("x-stream", stream)
            .body(body)
            .unwrap();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{stream}");
    }
    let m = scrape(&proxy).await;
    assert_eq!(proxy_errors(&m, "payload_too_large"), 2.0);
}

/// A body of `n` chunks of `size` bytes, without a known length (sent chunked).
struct Chunks {
    left: usize,
    size: usize,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        self.left -= 1;
        let chunk = Bytes::from(vec![b' '; self.size]);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
    }
}

/// A body that drips for longer than the body read timeout: 408, and the upstream never
/// sees it.
#[tokio::test]
async fn slow_body_is_408_and_never_reaches_the_upstream() {
    let (upstream, _policy, proxy) = seeded_with(Behaviour::default(), |a| {
        a.body_read_timeout = Some(Duration::from_millis(300).into());
    })
    .await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    let body = event(BERLIN, 0);
    let head = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: vehicle.position\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body.as_bytes()[..5]).await.unwrap();
    // Never send the rest; the proxy answers on its own.
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    response.extend_from_slice(&buf[..n]);
                    if response.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(upstream.count(), 0);
    assert_eq!(
        proxy.parts.pressure.inflight(),
        0,
        "it never held an upstream slot"
    );
}

// === Proxying ===

#[tokio::test]
async fn forwarding_headers_and_path_reach_the_upstream() {
    let (upstream, _policy, proxy) = seeded().await;
    let req = Request::post(format!("http://{}/ingest/v1?src=test", proxy.proxy_addr))
        .header("x-stream", "geofence.transition")
        .header("x-forwarded-for", "203.0.113.9")
        .header("host", "ingest.example.test")
        .body(Full::new(Bytes::from(event(BERLIN, 0))))
        .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
    let r = upstream.last();
    assert_eq!(
        r.uri.path_and_query().unwrap().as_str(),
        "/ingest/v1?src=test"
    );
    // The test client is no trusted proxy (none is by default): its claim is replaced.
    assert_eq!(r.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(r.headers["x-forwarded-proto"], "http");
    assert_eq!(r.headers["forwarded"], "for=127.0.0.1;proto=http");
    assert_eq!(r.headers["host"], "ingest.example.test");
}

#[tokio::test]
async fn expect_continue_and_chunked_bodies_work() {
    let (upstream, _policy, proxy) = seeded().await;
    let body = event(BERLIN, 0);
    for stream in ["vehicle.position", "dlq.replay"] {
        let mut tcp = tokio::net::TcpStream::connect(proxy.proxy_addr)
            .await
            .unwrap();
        let head = format!(
            "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: {stream}\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"),
            "{stream}"
        );
        let (a, b) = body.split_at(10);
        let chunked = format!("{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n", a.len(), b.len());
        tcp.write_all(chunked.as_bytes()).await.unwrap();
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "{stream}"
        );
        let r = upstream.last();
        assert_eq!(r.body, body.as_bytes());
        assert!(!r.headers.contains_key("expect"));
    }
}

#[tokio::test]
async fn in_flight_is_held_until_the_response_body_ends() {
    // The upstream sends its headers at once and its body 500 ms later.
    let (_upstream, _policy, proxy) = seeded_with(
        Behaviour {
            body_delay: Duration::from_millis(500),
            ..Behaviour::default()
        },
        |_| {},
    )
    .await;
    let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .header("x-stream", "dlq.replay")
        .body(Full::new(Bytes::from(event(BERLIN, 0))))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    // Headers arrived; the body has not ended: still in flight.
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(proxy.parts.pressure.inflight(), 1);
    let _ = resp.into_body().collect().await.unwrap();
    // The proxy releases the guard when its body ends, just before the client sees the end.
    for _ in 0..100 {
        if proxy.parts.pressure.inflight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(proxy.parts.pressure.inflight(), 0);
}

#[tokio::test]
async fn graceful_shutdown_drains_in_flight_requests() {
    let (upstream, _policy, proxy) = seeded_with(
        Behaviour {
            delay: Duration::from_millis(400),
            ..Behaviour::default()
        },
        |_| {},
    )
    .await;
    let addr = proxy.proxy_addr;
    let req = Request::post(format!("http://{addr}/ingest"))
        .header("x-stream", "feature.boundary_edit")
        .body(Full::new(Bytes::from(event(BERLIN, 0))))
        .unwrap();
    let pending = tokio::spawn(send(req));
    while upstream.count() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopping = tokio::spawn(proxy.shutdown());
    let answer = pending.await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "the in-flight request finished"
    );
    stopping.await.unwrap();
    // After shutdown, nothing is accepted.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// A never-stream client that stalls mid-body longer than the upstream timeout gets 408
/// (its own fault), not 504, and its upload time is no upstream latency sample.
#[tokio::test]
async fn slow_never_stream_body_is_408_not_504() {
    let (_upstream, _policy, proxy) = seeded_with(Behaviour::default(), |a| {
        a.body_read_timeout = Some(Duration::from_secs(1).into());
        a.upstream_timeout = Some(Duration::from_millis(200).into());
        a.latency_target = Some(Duration::from_millis(50).into());
    })
    .await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    let head = "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: feature.boundary_edit\r\nContent-Length: 100\r\n\r\n";
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(b"{\"lat\":").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let m = scrape(&proxy).await;
    assert_eq!(proxy_errors(&m, "gateway_timeout"), 0.0);
    assert_eq!(proxy_errors(&m, "body_timeout"), 1.0);
    assert_eq!(
        metric(
            &m,
            "shedgate_upstream_latency_seconds_count",
            &[("upstream", "default")]
        ),
        0.0
    );
}

#[tokio::test]
async fn host_header_can_be_the_upstreams() {
    let (upstream, _policy, proxy) = seeded_with(Behaviour::default(), |a| {
        a.host_header = Some(shedgate::upstream::HostHeader::Upstream);
    })
    .await;
    let req = Request::post(format!("http://{}/ingest", proxy.proxy_addr))
        .header("x-stream", "dlq.replay")
        .header("host", "ingest.example.test")
        .body(Full::new(Bytes::from(event(BERLIN, 0))))
        .unwrap();
    assert_eq!(send(req).await.status, StatusCode::OK);
    assert_eq!(
        upstream.last().headers["host"],
        upstream.addr.to_string().as_str()
    );
}

#[tokio::test]
async fn every_arrival_is_observed_once_never_streams_included() {
    // The controller's offered rate counts arrivals: once per request, whether it is decided
    // (a sheddable body, pinned or not) or streams through unread (a `never` or unknown
    // stream), as the simulator counts every event once.
    let (upstream, _policy, proxy) = seeded().await;
    let gauge = &proxy.parts.pressure;
    let before = gauge.arrivals();
    let sent = [
        ("vehicle.position", 3),
        ("geofence.transition", 2),
        ("some.unknown.stream", 2),
    ];
    for (stream, n) in sent {
        for _ in 0..n {
            let a = post(&proxy, stream, event(BERLIN, 0)).await;
            assert_eq!(a.status, StatusCode::OK, "{stream}");
        }
    }
    assert_eq!(gauge.arrivals() - before, 7, "unpinned");
    // Pinned: the decision reads the pin, and the arrival is still counted once.
    pin(&proxy, 0.8).await;
    let before = gauge.arrivals();
    let shed = post(&proxy, "vehicle.position", event(MUNICH, 0)).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    let kept = post(&proxy, "dlq.replay", event(MUNICH, 0)).await;
    assert_eq!(kept.status, StatusCode::OK);
    assert_eq!(gauge.arrivals() - before, 2, "pinned");
    assert_eq!(upstream.count(), 8);
}
