//! TLS on the proxy listener: requests over TLS decided and forwarded as over plain HTTP,
//! live certificate rotation (rename, a Secret's `..data` symlink swap), a broken pair
//! refused, and handshakes bounded (timeout, plain HTTP, the cap on those in progress).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::CertificateDer;
use shedgate::config::{Config, ServeArgs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::support::*;

/// A test CA and leaves it signs for `localhost`.
pub(crate) struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    der: CertificateDer<'static>,
}

/// A leaf certificate (PEM, DER) and its key (PEM).
pub(crate) struct Leaf {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) der: CertificateDer<'static>,
    pub(crate) not_after: i64,
}

impl Ca {
    pub(crate) fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "shedgate test CA");
        let cert = params.self_signed(&key).unwrap();
        Ca {
            der: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for `localhost` valid for `days`, with the CA in its chain file: valid both by
    /// the real clock, which the TLS client checks it against, and by the tests' clock
    /// ([`NOW`]), which the proxy checks it against.
    pub(crate) fn leaf(&self, days: i64) -> Leaf {
        #[expect(clippy::disallowed_methods, reason = "clients check the wall clock")]
        let now = time::OffsetDateTime::now_utc();
        let test_now = now_utc();
        self.leaf_between(
            now.min(test_now) - time::Duration::days(1),
            now.max(test_now) + time::Duration::days(days),
        )
    }

    /// A leaf for `localhost` valid from `not_before` to `not_after`.
    pub(crate) fn leaf_between(
        &self,
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_before = not_before.replace_nanosecond(0).unwrap();
        params.not_after = not_after.replace_nanosecond(0).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            not_after: params.not_after.unix_timestamp(),
        }
    }

    /// A root store of the CA alone.
    pub(crate) fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der.clone()).unwrap();
        roots
    }

    /// A client trusting the CA that offers the `alpn` protocols.
    pub(crate) fn client_config_offering(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let roots = self.roots();
        let mut config =
            rustls::ClientConfig::builder_with_provider(shedgate::edge::tls::provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// Writes `leaf` as `dir/tls.crt` and `dir/tls.key`, each written aside then renamed over.
pub(crate) fn install(dir: &Path, leaf: &Leaf) {
    install_files(dir, &leaf.cert_pem, &leaf.key_pem);
}

pub(crate) fn install_files(dir: &Path, cert: &str, key: &str) {
    for (name, text) in [("tls.key", key), ("tls.crt", cert)] {
        let aside = dir.join(format!(".{name}.new"));
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, dir.join(name)).unwrap();
    }
}

/// A proxy serving TLS with the files in `dir` (and `tweak` on top).
pub(crate) async fn tls_proxy(
    dir: &Path,
    tweak: impl FnOnce(&mut ServeArgs),
) -> (MockUpstream, PolicyDir, shedgate::app::Running) {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    seeded_with(Behaviour::default(), move |a| {
        a.tls_cert = Some(cert);
        a.tls_key = Some(key);
        tweak(a);
    })
    .await
}

/// A TLS connection to the proxy, trusting `ca`.
pub(crate) async fn connect(proxy: &shedgate::app::Running, ca: &Ca) -> TlsStream<TcpStream> {
    connect_offering(proxy, ca, &[b"http/1.1"]).await
}

/// A TLS connection to the proxy, trusting `ca`, offering the `alpn` protocols.
pub(crate) async fn connect_offering(
    proxy: &shedgate::app::Running,
    ca: &Ca,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(ca.client_config_offering(alpn))
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// The leaf the connection was served.
pub(crate) fn served(tls: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1.1 keep-alive client over `tls`.
async fn http(tls: TlsStream<TcpStream>) -> Sender {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn post_on(sender: &mut Sender, stream: &str, body: String) -> Answer {
    let req = Request::post("/ingest")
        .header("host", "localhost")
        .header("x-stream", stream)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.expect("answered");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

pub(crate) fn handshakes(text: &str, outcome: &str) -> f64 {
    metric(
        text,
        "shedgate_tls_handshakes_total",
        &[("outcome", outcome)],
    )
}

/// The serving certificate's expiry the proxy exports, unix seconds.
fn expiry(text: &str) -> i64 {
    let seconds = metric(
        text,
        "shedgate_tls_certificate_expiry_timestamp_seconds",
        &[],
    );
    #[expect(clippy::cast_possible_truncation, reason = "whole unix seconds")]
    let seconds = seconds as i64;
    seconds
}

pub(crate) fn reloads(text: &str, outcome: &str) -> f64 {
    metric(text, "shedgate_tls_reloads_total", &[("outcome", outcome)])
}

/// Opens new connections until one is served `want` (the watcher's reload is asynchronous:
/// the bound is a margin over its 250 ms debounce, not a timing claim).
async fn await_leaf(proxy: &shedgate::app::Running, ca: &Ca, want: &CertificateDer<'_>) {
    for _ in 0..400 {
        if served(&connect(proxy, ca).await) == *want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("new connections never saw the new certificate");
}

#[tokio::test]
async fn a_request_over_tls_is_decided_and_forwarded_as_https() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let leaf = ca.leaf(90);
    install(dir.path(), &leaf);
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    pin(&proxy, 0.0).await;
    let tls = connect(&proxy, &ca).await;
    assert_eq!(served(&tls), leaf.der);
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut sender = http(tls).await;
    let a = post_on(&mut sender, "vehicle.position", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    // Decided as over plain HTTP: a stale ping is shed before the upstream.
    let a = post_on(&mut sender, "vehicle.position", event(BERLIN, 120)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert_eq!(a.header("x-shed-reason"), Some("stale"));
    assert_eq!(upstream.count(), 1);
    let seen = upstream.last();
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(seen.headers["forwarded"], "for=127.0.0.1;proto=https");
    let text = scrape(&proxy).await;
    assert_eq!(handshakes(&text, "completed"), 1.0);
    assert_eq!(expiry(&text), leaf.not_after);
}

#[tokio::test]
async fn a_shed_over_tls_is_503_with_retry_after() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    pin(&proxy, 1.0).await;
    let mut sender = http(connect(&proxy, &ca).await).await;
    let a = post_on(&mut sender, "sensor.reading", event(MUNICH, 0)).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        a.header("retry-after")
            .is_some_and(|r| r.parse::<u32>().is_ok_and(|s| s > 0))
    );
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_eq!(upstream.count(), 0);
    // The same connection goes on after the shed.
    let a = post_on(&mut sender, "feature.boundary_edit", event(MUNICH, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn files_renamed_over_rotate_new_handshakes_and_open_connections_keep_theirs() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let (old, new) = (ca.leaf(90), ca.leaf(120));
    install(dir.path(), &old);
    let (_upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    pin(&proxy, 0.0).await;
    let kept = connect(&proxy, &ca).await;
    assert_eq!(served(&kept), old.der);
    let mut kept = http(kept).await;
    assert_eq!(
        post_on(&mut kept, "feature.boundary_edit", event(BERLIN, 0))
            .await
            .status,
        StatusCode::OK
    );

    install(dir.path(), &new);
    await_leaf(&proxy, &ca, &new.der).await;
    // The keep-alive connection opened before the rotation still serves.
    let a = post_on(&mut kept, "feature.boundary_edit", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    let text = scrape(&proxy).await;
    assert_eq!(reloads(&text, "swapped"), 1.0);
    assert_eq!(reloads(&text, "refused"), 0.0);
    assert_eq!(expiry(&text), new.not_after);
}

/// A cert-manager Secret mounted in Kubernetes: `tls.crt -> ..data/tls.crt`, and an update
/// renames a new `..data` link over the old one; no event names `tls.crt`.
#[tokio::test]
async fn a_secret_mounts_symlink_swap_rotates() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let (old, new) = (ca.leaf(90), ca.leaf(120));
    let version = |n: &str, leaf: &Leaf| {
        let v = dir.path().join(n);
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("tls.crt"), &leaf.cert_pem).unwrap();
        std::fs::write(v.join("tls.key"), &leaf.key_pem).unwrap();
    };
    version("..2026_01_01", &old);
    std::os::unix::fs::symlink("..2026_01_01", dir.path().join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.path().join(name)).unwrap();
    }
    let (_upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    let mut kept = http(connect(&proxy, &ca).await).await;

    version("..2026_02_01", &new);
    std::os::unix::fs::symlink("..2026_02_01", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    await_leaf(&proxy, &ca, &new.der).await;
    let a = post_on(&mut kept, "feature.boundary_edit", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn a_mismatched_pair_is_refused_counted_and_the_old_one_keeps_serving() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let (good, other) = (ca.leaf(90), ca.leaf(90));
    install(dir.path(), &good);
    let (_upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    // The new certificate with the old key: each file fine, the pair not.
    install_files(dir.path(), &other.cert_pem, &good.key_pem);
    // POST /reload says why, whether or not the watcher tried first.
    let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let a = send(req).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("tls.key") && detail.contains("does not match"),
        "{detail}"
    );
    assert_eq!(served(&connect(&proxy, &ca).await), good.der);
    // Counted once, whichever trigger read it first; an unparsable file is refused too.
    let text = scrape(&proxy).await;
    assert_eq!(reloads(&text, "refused"), 1.0);
    install_files(
        dir.path(),
        "-----BEGIN CERTIFICATE-----\nnot base64!\n",
        &good.key_pem,
    );
    let a = send(
        Request::post(format!("http://{}/reload", proxy.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(a.json()["detail"].as_str().unwrap().contains("tls.crt"));
    assert_eq!(served(&connect(&proxy, &ca).await), good.der);
    assert_eq!(reloads(&scrape(&proxy).await, "refused"), 2.0);
    assert_eq!(reloads(&scrape(&proxy).await, "swapped"), 0.0);
}

#[test]
fn a_broken_pair_at_start_is_a_config_error_naming_the_file() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let (a, b) = (ca.leaf(90), ca.leaf(90));
    install_files(dir.path(), &a.cert_pem, &b.key_pem);
    let args = |cert: Option<PathBuf>, key: Option<PathBuf>| ServeArgs {
        upstream: Some("http://127.0.0.1:3000".into()),
        tls_cert: cert,
        tls_key: key,
        ..ServeArgs::default()
    };
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let e = Config::from_args(args(Some(cert.clone()), Some(key.clone())))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tls-key") && e.contains("does not match"), "{e}");
    let e = Config::from_args(args(Some(cert.clone()), None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tls-key") && e.contains("both or neither"),
        "{e}"
    );
    std::fs::write(&cert, "").unwrap();
    let e = Config::from_args(args(Some(cert), Some(key)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tls.crt") && e.contains("no certificate"), "{e}");
}

/// The first record of a ClientHello, cut short: the handshake can never complete.
const PARTIAL_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];

/// Reads until the peer closes; what came before.
async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got).await;
    got
}

#[tokio::test]
async fn a_handshake_that_never_completes_is_closed_at_the_timeout() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |a| {
        a.tls_handshake_timeout = Some("300ms".parse().unwrap());
    })
    .await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(PARTIAL_HELLO).await.unwrap();
    let got = until_closed(&mut tcp).await;
    assert!(got.is_empty(), "closed without an answer: {got:?}");
    let text = scrape(&proxy).await;
    assert_eq!(handshakes(&text, "timed_out"), 1.0);
    assert_eq!(handshakes(&text, "completed"), 0.0);
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_answered_400_counted_and_closed() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(b"POST /ingest HTTP/1.1\r\nHost: localhost\r\nX-Stream: vehicle.position\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let got = String::from_utf8(until_closed(&mut tcp).await).unwrap();
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(got.contains("https://"), "{got}");
    let text = scrape(&proxy).await;
    assert_eq!(handshakes(&text, "wrong_protocol"), 1.0);
    assert_eq!(upstream.count(), 0);
}

/// Past `--tls-max-handshakes` in progress, the oldest incomplete handshake is closed first,
/// and a client that completes its handshake is served.
#[tokio::test]
async fn past_the_cap_the_oldest_incomplete_handshake_is_closed_first() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (_upstream, _policy, proxy) = tls_proxy(dir.path(), |a| {
        a.tls_max_handshakes = Some(2);
    })
    .await;
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        tcp.write_all(PARTIAL_HELLO).await.unwrap();
        slow.push(tcp);
    }
    // Handshakes are aged in the order of accept, which is the order of the connects.
    let mut third = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    third.write_all(PARTIAL_HELLO).await.unwrap();
    assert!(until_closed(&mut slow[0]).await.is_empty());
    assert_eq!(handshakes(&scrape(&proxy).await, "displaced"), 1.0);
    // An honest client still gets through (displacing the next oldest).
    let mut sender = http(connect(&proxy, &ca).await).await;
    let a = post_on(&mut sender, "feature.boundary_edit", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(until_closed(&mut slow[1]).await.is_empty());
    assert_eq!(handshakes(&scrape(&proxy).await, "displaced"), 2.0);
}

/// SIGHUP reloads the pair: the certificate file is a link to a file in another directory,
/// whose replacement makes no event in the watched one (and the periodic re-check is an
/// hour away), so only the signal can show the new certificate.
#[tokio::test]
async fn sighup_reloads_the_pair() {
    let (ca, dir, elsewhere) = (
        Ca::new(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (old, new) = (ca.leaf(90), ca.leaf(120));
    install(elsewhere.path(), &old);
    for name in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(elsewhere.path().join(name), dir.path().join(name)).unwrap();
    }
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(upstream.url()),
        policies: Some(policy.path().to_owned()),
        tls_cert: Some(dir.path().join("tls.crt")),
        tls_key: Some(dir.path().join("tls.key")),
        policy_recheck: Some("1h".parse().unwrap()),
        ..ServeArgs::default()
    };
    let signals = shedgate::signals::Signals::none();
    signals.serving();
    let config = Config::from_args(args).unwrap();
    let (proxy, _) = shedgate::app::start_with(config, sources(), &signals)
        .await
        .unwrap();
    install(elsewhere.path(), &new);
    // No event and no re-check: the old pair serves until the signal.
    assert_eq!(served(&connect(&proxy, &ca).await), old.der);
    signals.deliver(1); // SIGHUP
    await_leaf(&proxy, &ca, &new.der).await;
    assert_eq!(reloads(&scrape(&proxy).await, "swapped"), 1.0);
}

/// A keep-alive TLS connection idle past the park (its HTTP buffers freed, only the socket
/// and the TLS session held) resumes when the client sends again.
#[tokio::test]
async fn a_parked_tls_connection_resumes() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (upstream, _policy, proxy) = tls_proxy(dir.path(), |_| {}).await;
    let mut sender = http(connect(&proxy, &ca).await).await;
    let a = post_on(&mut sender, "feature.boundary_edit", event(BERLIN, 0)).await;
    assert_eq!(a.status, StatusCode::OK);
    let parked = || async {
        metric(
            &scrape(&proxy).await,
            "shedgate_client_connections_parked",
            &[],
        )
    };
    for _ in 0..200 {
        if parked().await == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(parked().await, 1.0, "the connection was never parked");
    for _ in 0..3 {
        let a = post_on(&mut sender, "feature.boundary_edit", event(BERLIN, 0)).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    assert_eq!(upstream.count(), 4);
}
