//! HTTP/1.0 clients (ApacheBench `-k`, old embedded senders), over raw sockets: an answer of
//! unknown length is delimited by closing the connection and says `Connection: close` (never
//! `keep-alive`, never chunked framing); a known-length answer keeps hyper's HTTP/1.0
//! keep-alive; an early answer says `close` alone.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

/// The chunked upstream's body, and its chunks on the wire.
const CHUNKED_BODY: &str = "{\"ok\":1}";
const CHUNKED_WIRE: &[u8] = b"7\r\n{\"ok\":1\r\n1\r\n}\r\n0\r\n\r\n";

/// An upstream that answers every request `200` with a chunked body, keeping its connection
/// (many application servers do); returns its URL and how many requests it answered.
async fn chunked_upstream() -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&count);
    let task = tokio::spawn(async move {
        let mut served = tokio::task::JoinSet::new();
        while let Ok((mut tcp, _)) = listener.accept().await {
            let counted = std::sync::Arc::clone(&counted);
            served.spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: its head, then its `Content-Length` body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    while buf.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + length);
                    let mut answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                                       Transfer-Encoding: chunked\r\n\r\n"
                        .to_vec();
                    answer.extend_from_slice(CHUNKED_WIRE);
                    if tcp.write_all(&answer).await.is_err() {
                        return;
                    }
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    (url, count, task)
}

/// An HTTP/1.0 POST of `stream` with `connection` as its `Connection` header, if any.
fn post10(stream: &str, body: &str, connection: Option<&str>) -> Vec<u8> {
    let connection = connection.map_or(String::new(), |c| format!("Connection: {c}\r\n"));
    format!(
        "POST /ingest HTTP/1.0\r\nHost: x\r\nX-Stream: {stream}\r\n{connection}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Everything the proxy sends until it closes the connection (a failsafe bound of a minute
/// against a proxy that never does).
async fn read_to_close(tcp: &mut TcpStream) -> String {
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut all))
        .await
        .expect("the proxy closed the connection")
        .unwrap();
    String::from_utf8(all).unwrap()
}

/// The `Connection` header's value in a response head (lowercase), if any.
fn connection(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("connection: ")
            .map(str::to_owned)
    })
}

/// A chunked upstream answer to an HTTP/1.0 client, forwarded buffered (a sheddable stream)
/// or streamed (a `never` stream), the client asking for keep-alive or not: one answer,
/// HTTP/1.0, `Connection: close`, no `Transfer-Encoding` and no chunk framing, the body up to
/// the close; a second request sent behind the first on the connection is not served.
#[tokio::test]
async fn an_http10_answer_of_unknown_length_is_close_delimited_and_says_so() {
    let (url, answered, _upstream) = chunked_upstream().await;
    let policy = PolicyDir::seed();
    let proxy = spawn_proxy(&url, policy.path()).await;
    let body = event(BERLIN, 0);
    let mut sent = 0;
    for stream in ["vehicle.position", "geofence.transition"] {
        for asked in [None, Some("keep-alive")] {
            let what = format!("{stream}, Connection: {asked:?}");
            let one = post10(stream, &body, asked);
            let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
            tcp.write_all(&[one.clone(), one].concat()).await.unwrap();
            let all = read_to_close(&mut tcp).await;
            sent += 1;
            let (head, rest) = all.split_once("\r\n\r\n").expect("a head");
            assert!(head.starts_with("HTTP/1.0 200 "), "{what}: {all}");
            assert_eq!(connection(head).as_deref(), Some("close"), "{what}: {head}");
            assert!(
                !head.to_ascii_lowercase().contains("transfer-encoding"),
                "{what}: {head}"
            );
            assert_eq!(rest, CHUNKED_BODY, "{what}: the body, up to the close");
            assert_eq!(
                answered.load(std::sync::atomic::Ordering::SeqCst),
                sent,
                "{what}: the request behind the first is not served"
            );
        }
    }
}

/// Known-length answers, forwarded and the proxy's own (a 503 shed, a 202 stale answer), to
/// an HTTP/1.0 client asking for keep-alive: each says `keep-alive` and the connection serves
/// the next request.
#[tokio::test]
async fn an_http10_keep_alive_client_keeps_its_connection_for_known_length_answers() {
    let (_up, _policy, proxy) = seeded().await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    for (what, stream, body, pressure, status) in [
        (
            "forwarded",
            "vehicle.position",
            event(BERLIN, 0),
            0.0,
            "200",
        ),
        ("shed", "vehicle.position", event(MUNICH, 0), 1.0, "503"),
        ("stale", "vehicle.position", event(BERLIN, 600), 0.0, "202"),
        (
            "forwarded, streamed",
            "geofence.transition",
            event(BERLIN, 0),
            0.0,
            "200",
        ),
    ] {
        pin(&proxy, pressure).await;
        tcp.write_all(&post10(stream, &body, Some("keep-alive")))
            .await
            .unwrap();
        let head = read_head(&mut tcp).await;
        assert!(
            head.starts_with(&format!("HTTP/1.0 {status} ")),
            "{what}: {head}"
        );
        assert_eq!(
            connection(&head).as_deref(),
            Some("keep-alive"),
            "{what}: {head}"
        );
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| panic!("{what}: no Content-Length: {head}"));
        let mut body = vec![0u8; length.trim().parse().unwrap()];
        tcp.read_exact(&mut body).await.unwrap();
    }
}

/// An answer given from the head (a body over `--max-body`) to an HTTP/1.0 client asking for
/// keep-alive says `Connection: close` alone, and the connection closes.
#[tokio::test]
async fn an_early_answer_to_an_http10_keep_alive_client_says_close_alone() {
    let (_up, _policy, proxy) = seeded().await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let head = "POST /ingest HTTP/1.0\r\nHost: x\r\nX-Stream: vehicle.position\r\n\
                Connection: keep-alive\r\nContent-Type: application/json\r\n\
                Content-Length: 3145728\r\n\r\n";
    tcp.write_all(head.as_bytes()).await.unwrap();
    let answer = read_head(&mut tcp).await;
    assert!(answer.starts_with("HTTP/1.0 413 "), "{answer}");
    assert_eq!(connection(&answer).as_deref(), Some("close"), "{answer}");
}
