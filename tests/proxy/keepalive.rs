//! Idle keep-alive connections are parked (`edge::keepalive`, docs/responses.md
//! "Connections"): after a second between requests the connection lets go of hyper's
//! buffers, and the client sees no difference. A connection with a request part-way, an
//! answer pending or an answer's body still streaming is never parked.
//!
//! Driven with paused tokio time; the requests answered while time is paused are ones the
//! proxy answers itself (`OPTIONS *`) or ones whose upstream round trip is awaited in small
//! steps of paused time.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

const PROBE: &[u8] = b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n";

/// Reads one whole response with a `Content-Length` body: its head and body.
async fn read_response(tcp: &mut TcpStream) -> (String, Vec<u8>) {
    let head = read_head(tcp).await;
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
    let mut body = vec![0u8; length];
    tcp.read_exact(&mut body).await.unwrap();
    (head, body)
}

async fn parked(proxy: &shedgate::app::Running) -> f64 {
    metric(
        &scrape(proxy).await,
        "shedgate_client_connections_parked",
        &[],
    )
}

fn post(body: &str) -> Vec<u8> {
    format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A connection idle for longer than a second is parked, and serves its next requests as
/// before: kept alive (no `Connection: close`), a pipelined pair included, and parked again
/// once idle.
#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_parked_and_serves_its_next_requests() {
    let (_up, _policy, proxy) = seeded().await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(PROBE).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
    assert_eq!(parked(&proxy).await, 0.0, "parked at once");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(parked(&proxy).await, 1.0, "not parked after 2 s idle");
    // Two pipelined requests in one write wake it.
    tcp.write_all(&[PROBE, PROBE].concat()).await.unwrap();
    for _ in 0..2 {
        let head = read_head(&mut tcp).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
    }
    assert_eq!(parked(&proxy).await, 0.0, "still counted as parked");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(parked(&proxy).await, 1.0, "not parked again");
    tcp.write_all(PROBE).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
}

/// A connection whose next head has started is not parked, however long the head takes
/// within the header read timeout; the head, finished, is answered.
#[tokio::test(start_paused = true)]
async fn a_connection_with_a_head_part_way_is_not_parked() {
    let (_up, _policy, proxy) = seeded().await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(&PROBE[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(parked(&proxy).await, 0.0);
    tcp.write_all(&PROBE[10..]).await.unwrap();
    assert!(read_head(&mut tcp).await.starts_with("HTTP/1.1 200"));
}

/// A connection waiting for its answer, or streaming an answer's body, is not parked: the
/// upstream takes 3 s to answer and 3 s more before the body; the answer arrives whole and
/// the connection stays alive, then parks once idle.
#[tokio::test(start_paused = true)]
async fn a_connection_with_an_answer_pending_is_not_parked() {
    let (up, _policy, proxy) = seeded_with(
        Behaviour {
            delay: Duration::from_secs(3),
            body_delay: Duration::from_secs(3),
            ..Behaviour::default()
        },
        |_| {},
    )
    .await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(&post(&event((52.52, 13.40), 0)))
        .await
        .unwrap();
    // Small steps of paused time, so that no timer of the proxy's comes due meanwhile.
    while up.count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..250 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        parked(&proxy).await,
        0.0,
        "parked while its answer was pending"
    );
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    for _ in 0..250 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        parked(&proxy).await,
        0.0,
        "parked while its body was streaming"
    );
    let length = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("content-length: ")
            .map(str::to_owned)
    });
    if let Some(length) = length {
        let mut body = vec![0u8; length.trim().parse().unwrap()];
        tcp.read_exact(&mut body).await.unwrap();
    }
    assert!(!head.contains("connection: close"), "{head}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(parked(&proxy).await, 1.0, "not parked once idle");
    tcp.write_all(PROBE).await.unwrap();
    let (head, _) = read_response(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// Parked connections close at the start of the drain, and shutdown does not wait for them.
#[tokio::test(start_paused = true)]
async fn parked_connections_close_at_the_drain() {
    let (_up, _policy, proxy) = seeded().await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(PROBE).await.unwrap();
    read_head(&mut tcp).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(parked(&proxy).await, 1.0);
    let metrics = std::sync::Arc::clone(&proxy.parts.metrics);
    let stopped = tokio::time::timeout(Duration::from_secs(60), proxy.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown still waiting after 60 s");
    let mut byte = [0u8; 1];
    assert!(
        matches!(tcp.read(&mut byte).await, Ok(0) | Err(_)),
        "still open"
    );
    assert_eq!(
        metric(&metrics.render(), "shedgate_client_connections_parked", &[]),
        0.0
    );
}
