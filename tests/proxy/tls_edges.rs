//! TLS on the proxy listener, its edges: a leaf expired or not yet valid refused (at start
//! and on reload), a reload's answer naming a refused pair beside a policy error, plain HTTP
//! with a large body still answered 400 without a reset, and requests pipelined in one TLS
//! write all answered, and the server's cipher suite order chosen over the client's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use shedgate::config::{Config, ServeArgs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;
use crate::tls::{Ca, connect, handshakes, install, install_files, reloads, served, tls_proxy};

/// POST /reload, its answer.
async fn post_reload(proxy: &shedgate::app::Running) -> Answer {
    send(
        Request::post(format!("http://{}/reload", proxy.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

/// A leaf that ended a day before the proxy's clock ([`NOW`]) never replaces the serving
/// pair, nor does one that begins a day after it: each refused, counted, and named with its
/// file and dates.
#[tokio::test]
async fn an_expired_or_not_yet_valid_pair_is_refused_and_the_old_one_keeps_serving() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let good = ca.leaf(90);
    install(dir.path(), &good);
    let (_upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    let day = time::Duration::days(1);
    let expired = ca.leaf_between(now_utc() - 90 * day, now_utc() - day);
    install(dir.path(), &expired);
    let a = post_reload(&proxy).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    let date = |t: time::OffsetDateTime| {
        t.replace_nanosecond(0)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    for part in [
        "tls.crt",
        "expired",
        &date(now_utc() - day),
        &date(now_utc()),
    ] {
        assert!(detail.contains(part), "{part} in {detail}");
    }
    assert_eq!(served(&connect(&proxy, &ca).await), good.der);
    assert_eq!(reloads(&scrape(&proxy).await, "refused"), 1.0);

    let early = ca.leaf_between(now_utc() + day, now_utc() + 90 * day);
    install(dir.path(), &early);
    let a = post_reload(&proxy).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("tls.crt")
            && detail.contains("not yet valid")
            && detail.contains(&date(now_utc() + day)),
        "{detail}"
    );
    assert_eq!(served(&connect(&proxy, &ca).await), good.der);
    let text = scrape(&proxy).await;
    assert_eq!(reloads(&text, "refused"), 2.0);
    assert_eq!(reloads(&text, "swapped"), 0.0);
}

/// At start, an expired leaf is refused as a broken pair is (a `StartError::Tls`, exit
/// status 2): the proxy does not start serving a certificate every client rejects.
#[tokio::test]
async fn an_expired_pair_at_start_is_refused_naming_the_file_and_dates() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let day = time::Duration::days(1);
    install(
        dir.path(),
        &ca.leaf_between(now_utc() - 90 * day, now_utc() - day),
    );
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let config = Config::from_args(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.url()),
        policies: Some(policy.path().to_owned()),
        tls_cert: Some(dir.path().join("tls.crt")),
        tls_key: Some(dir.path().join("tls.key")),
        ..ServeArgs::default()
    })
    .expect("the files' shape is fine: the dates are checked against the clock at start");
    let e = match shedgate::app::start(config, sources()).await {
        Err(e @ shedgate::app::StartError::Tls(_)) => e.to_string(),
        Err(other) => panic!("not a TLS refusal: {other}"),
        Ok(_) => panic!("started with an expired certificate"),
    };
    assert!(e.contains("tls.crt") && e.contains("expired"), "{e}");
}

/// When the policy does not compile and the certificate pair is refused too, the 422 names
/// both reasons: the operator fixes both before the next try.
#[tokio::test]
async fn a_reload_with_a_broken_policy_and_a_refused_pair_names_both() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let (good, other) = (ca.leaf(90), ca.leaf(90));
    install(dir.path(), &good);
    let (_upstream, policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    std::fs::write(policy.path().join("streams.toml"), "[streams\n").unwrap();
    install_files(dir.path(), &other.cert_pem, &good.key_pem);
    let a = post_reload(&proxy).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("streams.toml"),
        "the policy's error: {detail}"
    );
    assert!(
        detail.contains("tls.key") && detail.contains("does not match"),
        "the pair's reason: {detail}"
    );
    assert_eq!(served(&connect(&proxy, &ca).await), good.der);
}

/// Plain HTTP with a large body sent to the TLS port: the 400 still reaches the client, and
/// the connection ends with a close, not a reset (the proxy reads what was sent before it
/// closes; a reset can discard the answer in flight).
#[tokio::test]
async fn plain_http_with_a_large_body_to_the_tls_port_still_gets_its_400() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    for _ in 0..3 {
        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        let body = vec![b'x'; 200 * 1024];
        let head = format!(
            "POST /ingest HTTP/1.1\r\nHost: localhost\r\nX-Stream: vehicle.position\r\n\
             content-length: {}\r\n\r\n",
            body.len()
        );
        // The head and part of the body, then the answer read to the proxy's FIN, then the
        // rest of the body, as a client that streams its body while it reads does. The
        // proxy reads what comes after its answer instead of closing on unread bytes, which
        // would reset the connection (and can discard the answer in flight): the rest is
        // taken (a write into a reset connection fails).
        let (part, rest) = body.split_at(16 * 1024);
        tcp.write_all(head.as_bytes()).await.unwrap();
        tcp.write_all(part).await.unwrap();
        let mut got = Vec::new();
        let read_result = tcp.read_to_end(&mut got).await;
        let got = String::from_utf8_lossy(&got).into_owned();
        assert!(
            read_result.is_ok() && got.starts_with("HTTP/1.1 400 "),
            "{read_result:?}: {got:?}"
        );
        let sent = async {
            tcp.write_all(rest).await?;
            tcp.shutdown().await
        };
        sent.await
            .expect("the rest of the body is read and discarded, not reset");
    }
    assert_eq!(handshakes(&scrape(&proxy).await, "wrong_protocol"), 3.0);
    assert_eq!(upstream.count(), 0);
}

/// Complete HTTP/1.1 answers at the start of `buf`, counted (head, then a body of its
/// content-length).
fn answers_in(mut buf: &[u8]) -> Vec<String> {
    let mut heads = Vec::new();
    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .unwrap_or(0);
        if buf.len() < end + 4 + length {
            break;
        }
        buf = &buf[end + 4 + length..];
        heads.push(head);
    }
    heads
}

/// Two requests pipelined in one TLS write on a keep-alive connection are both answered
/// well before the idle timeout: the second, decrypted and buffered in the TLS session
/// with the first, is not left waiting for the socket to become readable again. The first
/// request fills one whole read of the proxy (8 KiB), so the second stays in the session.
#[tokio::test]
async fn pipelined_requests_in_one_tls_write_are_both_answered_before_the_idle_timeout() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let idle = Duration::from_secs(60);
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |a| {
        a.idle_timeout = Some("60s".parse().unwrap());
    })
    .await;
    let request = |size: Option<usize>| {
        let head_of = |len: usize| {
            format!(
                "POST /ingest HTTP/1.1\r\nhost: localhost\r\nx-stream: feature.boundary_edit\r\n\
                 content-type: application/json\r\ncontent-length: {len}\r\n\r\n"
            )
        };
        let mut body = event(BERLIN, 0);
        if let Some(size) = size {
            // Padded with JSON whitespace until head and body are `size` bytes.
            let mut len = body.len();
            while head_of(len).len() + len < size {
                len += 1;
            }
            body.push_str(&" ".repeat(len - body.len()));
        }
        let mut r = head_of(body.len());
        r.push_str(&body);
        r
    };
    let first = request(Some(8192));
    assert_eq!(first.len(), 8192);
    for second in [request(None), request(Some(8192))] {
        let mut tls = connect(&proxy, &ca).await;
        tls.write_all(format!("{first}{second}").as_bytes())
            .await
            .unwrap();
        tls.flush().await.unwrap();
        // A margin against the known interval: a tenth of the idle timeout.
        let got = tokio::time::timeout(idle / 10, async {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while answers_in(&buf).len() < 2 {
                let n = tls.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed after {:?}", answers_in(&buf));
                buf.extend_from_slice(&chunk[..n]);
            }
            answers_in(&buf)
        })
        .await
        .expect("both pipelined requests answered before a tenth of the idle timeout");
        assert!(
            got.iter().all(|h| h.starts_with("HTTP/1.1 200 ")),
            "{got:?}"
        );
    }
    assert_eq!(upstream.count(), 4);
}

/// A client that prefers ChaCha20-Poly1305 is served the provider's first suite
/// (AES-256-GCM) all the same: the server's order wins (testssl.sh rates a server without an
/// order of its own a high-severity finding), in TLS 1.3 and in TLS 1.2.
#[tokio::test]
async fn the_servers_cipher_suite_order_wins_over_the_clients() {
    use rustls::CipherSuite::{
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (_upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    let chacha = [
        TLS13_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    let mut provider = (*shedgate::edge::tls::provider()).clone();
    provider
        .cipher_suites
        .sort_by_key(|s| !chacha.contains(&s.suite()));
    assert!(chacha.contains(&provider.cipher_suites[0].suite()));
    let versions: [&[&'static rustls::SupportedProtocolVersion]; 2] =
        [&[&rustls::version::TLS13], &[&rustls::version::TLS12]];
    for (version, want) in versions.into_iter().zip([
        TLS13_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ]) {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider.clone()))
            .with_protocol_versions(version)
            .unwrap()
            .with_root_certificates(ca.roots())
            .with_no_client_auth();
        let tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("TLS handshake");
        let suite = tls.get_ref().1.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(suite, want, "{version:?}");
    }
}
