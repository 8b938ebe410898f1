//! The upstream connection pool (`upstream::pool`, docs/responses.md "Proxying"): one
//! connection carries request after request; idle past the pool's idle timeout it is closed
//! and the next request opens a new one; `--pool-idle-timeout`, `--pool-max-idle` and an
//! upstream's own `pool_idle_timeout` and `pool_max_idle` bound the idle connections kept;
//! a pooled connection the upstream closed is not used for a request; an HTTP/1.0 request
//! without `Host` reaches the upstream with one.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// Waits, in steps of real time, until `done` holds (the test harness bounds the wait).
async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sequential requests share one upstream connection.
#[tokio::test]
async fn one_upstream_connection_carries_sequential_requests() {
    let (up, _policy, proxy) = seeded().await;
    for _ in 0..20 {
        let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    assert_eq!(up.count(), 20);
    assert_eq!(up.connections().0, 1, "a connection per request");
}

/// An idle pooled connection is closed after the pool's idle timeout (4 s), and the next
/// request opens a new one.
#[tokio::test]
async fn an_idle_upstream_connection_is_closed_after_the_pool_idle_timeout() {
    let (up, _policy, proxy) = seeded().await;
    let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
    assert_eq!(a.status, 200);
    assert_eq!(up.connections(), (1, 1));
    tokio::time::pause();
    tokio::time::advance(shedgate::upstream::POOL_IDLE_TIMEOUT + Duration::from_secs(1)).await;
    tokio::time::resume();
    until(|| up.connections().1 == 0).await;
    let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
    assert_eq!(a.status, 200);
    assert_eq!(up.connections(), (2, 1));
}

/// Waits until `done` holds, failing after 10 s (a bound against a hang, not a measure).
async fn within(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `--pool-idle-timeout`: an idle connection past it is not reused (the default, 4 s, would
/// reuse it after the 1.5 s waited here), and the reaper closes it.
#[tokio::test]
async fn an_idle_connection_past_pool_idle_timeout_is_not_reused() {
    let (up, _policy, proxy) = seeded_with(Behaviour::default(), |a| {
        a.pool_idle_timeout = Some(Duration::from_secs(1).into());
    })
    .await;
    let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
    assert_eq!(a.status, 200);
    assert_eq!(up.connections(), (1, 1));
    tokio::time::pause();
    tokio::time::advance(Duration::from_millis(1500)).await;
    tokio::time::resume();
    let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        up.connections().0,
        2,
        "the expired connection was not reused"
    );
    within("the expired connection closed", || {
        up.connections() == (2, 1)
    })
    .await;
}

/// `--pool-max-idle`: three requests at once take three connections; once they have ended
/// one is kept idle and the least recently used two are closed; the next request reuses the
/// one kept. The upstream holds the three until all three have reached it, so they are at
/// once however slowly the machine runs them (one after another, they would share one
/// connection).
#[tokio::test]
async fn the_pool_keeps_at_most_pool_max_idle_connections() {
    let hold = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = Behaviour {
        hold: Some(std::sync::Arc::clone(&hold)),
        ..Behaviour::default()
    };
    let (up, _policy, proxy) = seeded_with(held, |a| a.pool_max_idle = Some(1)).await;
    let proxy = std::sync::Arc::new(proxy);
    let at_once: Vec<_> = (0..3)
        .map(|_| {
            let proxy = std::sync::Arc::clone(&proxy);
            tokio::spawn(async move {
                post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await
            })
        })
        .collect();
    within("three requests held at the upstream", || up.count() == 3).await;
    assert_eq!(up.connections(), (3, 3), "one connection per request held");
    hold.add_permits(3);
    for a in at_once {
        assert_eq!(a.await.unwrap().status, 200);
    }
    within("two of three closed", || up.connections() == (3, 1)).await;
    hold.add_permits(1);
    let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
    assert_eq!(a.status, 200);
    assert_eq!(up.connections(), (3, 1), "the kept connection reused");
}

/// An upstream's own `pool_max_idle = 0` closes each of its connections after its answer,
/// while `default` (the flags' 1024) keeps its connection.
#[tokio::test]
async fn an_upstreams_table_sets_its_own_pool_limits() {
    let (default, tracking) = (MockUpstream::start().await, MockUpstream::start().await);
    let streams = format!(
        "{}\n[upstreams.tracking]\nurl = \"{}\"\npool_max_idle = 0\n",
        SEED_STREAMS.replace(
            "[streams.\"geofence.transition\"]\n",
            "[streams.\"geofence.transition\"]\nupstream = \"tracking\"\n",
        ),
        tracking.url()
    );
    let policy = PolicyDir::new(&streams, Some(BERLIN_AREA));
    let proxy = spawn_proxy(&default.url(), policy.path()).await;
    for _ in 0..2 {
        let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
        assert_eq!(a.status, 200);
        let a = post(&proxy, "dlq.replay", "{}").await;
        assert_eq!(a.status, 200);
    }
    assert_eq!((default.count(), tracking.count()), (2, 2));
    within("tracking's connections closed", || {
        tracking.connections() == (2, 0)
    })
    .await;
    assert_eq!(
        default.connections(),
        (1, 1),
        "default's connection kept and reused"
    );
}

/// A pooled connection the upstream closed while it was idle is not given a request: the
/// request goes on a new connection and is answered, not failed with a 502.
#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_not_used() {
    let mut up = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let proxy = spawn_proxy(&up.url(), policy.path()).await;
    let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
    assert_eq!(a.status, 200);
    // The upstream restarts on the same port: its connections close.
    let addr = up.addr;
    drop(up);
    up = MockUpstream::on(addr).await;
    for _ in 0..5 {
        let a = post(&proxy, "geofence.transition", event((52.52, 13.40), 0)).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    assert_eq!(up.count(), 5);
}

/// An HTTP/1.0 request without `Host` reaches the upstream with the upstream's authority as
/// `Host` (HTTP/1.1 requires one, RFC 9112 section 3.2).
#[tokio::test]
async fn a_request_without_host_gets_the_upstreams() {
    let (up, _policy, proxy) = seeded().await;
    let body = event((52.52, 13.40), 0);
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(
        format!(
            "POST /ingest HTTP/1.0\r\nX-Stream: geofence.transition\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    let host = up.last().headers["host"].to_str().unwrap().to_owned();
    assert_eq!(host, up.addr.to_string());
}

/// An upstream that answers as soon as it has a request head, without reading the body
/// (as a 401 or 413 would), and keeps every connection open.
async fn early_answering_upstream() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut open = Vec::new();
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                continue;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match tcp.read(&mut byte).await {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let _ = tcp
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await;
            open.push(tcp);
        }
    });
    (addr, task)
}

/// A connection whose request body is still being sent when its answer has come is not
/// given to the next request: that request gets a connection of its own and its answer,
/// while the first client is still sending.
#[tokio::test]
async fn a_connection_still_sending_is_not_given_to_the_next_request() {
    let (addr, upstream) = early_answering_upstream().await;
    let policy = PolicyDir::seed();
    let proxy = spawn_proxy(&format!("http://{addr}"), policy.path()).await;
    // A never-shed stream: its body is streamed to the upstream as it arrives.
    let mut slow = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    slow.write_all(
        b"POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\n\
          Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"lat\":",
    )
    .await
    .unwrap();
    let mut head = [0u8; 12];
    slow.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let second = tokio::time::timeout(
        Duration::from_secs(30),
        post(&proxy, "geofence.transition", event((52.52, 13.40), 0)),
    )
    .await
    .expect("the next request waited for a connection still sending");
    assert_eq!(second.status, 200);
    drop(slow);
    upstream.abort();
}
