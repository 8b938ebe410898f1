//! The upstream connection pool (`upstream::pool`, docs/responses.md "Proxying"): one
//! connection carries request after request; idle past the pool's idle timeout it is closed
//! and the next request opens a new one; a pooled connection the upstream closed is not used
//! for a request; an HTTP/1.0 request without `Host` reaches the upstream with one.

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
