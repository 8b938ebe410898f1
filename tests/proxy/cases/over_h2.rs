//! Every case HTTP/2 can express, sent over HTTP/1.1 and over HTTP/2 to one TLS proxy at the
//! pressure its README names, and answered the same: status, `Retry-After`, `X-Shed-Reason`,
//! content type, whether the upstream received it, and what it received.
//!
//! Not expressible in HTTP/2, so not here: `header-case.http` (field names are lower case by
//! the protocol), `connection-nominated-headers.http` and `h2c-upgrade.http` (`Connection`,
//! `Keep-Alive`, `TE` other than `trailers` and `Upgrade` are connection-specific: a request
//! carrying them is malformed, RFC 9113 section 8.2.2), `te-cl-conflict.raw` and
//! `chunk-size-plus.raw` (HTTP/2 has no chunked coding; its frames carry their length; a
//! `content-length` the frames do not match is tested in `h2.rs`). `absolute-form-authority`
//! becomes `:authority` beside a differing `host`, which HTTP/2 answers 400 (RFC 9113 section
//! 8.3.1) where HTTP/1.1 lets the request line win; `connect-method.raw` is sent as an HTTP/2
//! `CONNECT` (no `:scheme`, no `:path`).

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};

use super::*;
use crate::h2_frames::{HEADERS, Raw, status};
use crate::tls::{Ca, connect_offering, install};

/// The cases, each with the pressures its README expectation names.
const CASES: &[(&str, &[f64])] = &[
    ("formats/owntracks-location.http", &[0.75, 0.3]),
    ("formats/owntracks-transition.http", &[1.0]),
    ("formats/traccar-position.http", &[0.75]),
    ("formats/traccar-event-geofence.http", &[1.0]),
    ("formats/traccar-event-no-position.http", &[1.0]),
    ("formats/overland-batch.http", &[0.75, 0.3]),
    ("formats/cloudevents-binary-position.http", &[0.75]),
    ("formats/cloudevents-structured-geofence.http", &[1.0]),
    ("formats/cloudevents-batch-mixed.http", &[1.0]),
    ("formats/standard-webhooks-position.http", &[0.75, 0.3]),
    ("formats/geojson-feature.http", &[0.75]),
    ("formats/owntracks-stale.http", &[0.0]),
    ("formats/overland-stale.http", &[0.0]),
    ("formats/overland-backlog-current.http", &[0.75]),
    ("formats/osmand-query.http", &[0.75, 0.3]),
    ("formats/owntracks-encrypted.http", &[1.0]),
    ("faults/swapped-coordinates.http", &[0.75]),
    ("faults/non-finite-coordinates.http", &[0.75]),
    ("faults/number-out-of-range.http", &[0.75, 0.3]),
    ("faults/numbers-as-strings.http", &[0.75]),
    ("faults/deep-unrelated-nesting.http", &[0.75]),
    ("faults/odd-formatting-signed.http", &[0.3]),
    ("faults/duplicate-stream-header.http", &[0.99]),
    ("faults/duplicate-time-key.http", &[0.3]),
    ("faults/duplicate-host.raw", &[0.0]),
    ("faults/bom-body.http", &[0.75]),
    ("faults/underscore-stream-twin.http", &[0.99]),
    ("faults/dot-segment-path.http", &[0.99]),
];

/// A case's request: method, target, header fields in order, body.
struct Parsed {
    method: String,
    target: String,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

fn parse(bytes: &[u8]) -> Parsed {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&bytes[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let mut line = lines.next().unwrap().split(' ');
    let (method, target) = (line.next().unwrap(), line.next().unwrap());
    let fields = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    Parsed {
        method: method.to_owned(),
        target: target.to_owned(),
        fields,
        body: bytes[end + 4..].to_vec(),
    }
}

/// What is compared between the two protocols.
#[derive(Debug, PartialEq)]
struct Outcome {
    status: u16,
    retry_after: bool,
    shed_reason: Option<String>,
    content_type: Option<String>,
    /// What the upstream received (its `x-stream` fields and body), `None`: nothing.
    forwarded: Option<(Vec<String>, Bytes)>,
}

/// The answer's head over HTTP/1.1: the case's bytes as they are, over TLS.
async fn over_http1(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    bytes: &[u8],
) -> (u16, http::HeaderMap) {
    use tokio::io::AsyncReadExt;
    io.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = io.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before an answer");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut headers = http::HeaderMap::new();
    for l in lines {
        let (n, v) = l.split_once(':').unwrap();
        headers.append(
            http::HeaderName::from_bytes(n.trim().as_bytes()).unwrap(),
            v.trim().parse().unwrap(),
        );
    }
    (status, headers)
}

/// The same request over HTTP/2: `:authority` from the first `host` field, every field kept.
async fn over_http2(
    ca: &Ca,
    proxy: &shedgate::app::Running,
    case: &Parsed,
) -> (u16, http::HeaderMap) {
    let tls = connect_offering(proxy, ca, &[b"h2"]).await;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let authority = &case.fields.iter().find(|(n, _)| n == "host").unwrap().1;
    let mut req = Request::builder()
        .method(case.method.as_str())
        .uri(format!("https://{authority}{}", case.target));
    for (n, v) in &case.fields {
        req = req.header(n, v);
    }
    let req = req.body(Full::new(Bytes::from(case.body.clone()))).unwrap();
    let resp = sender.send_request(req).await.expect("answered");
    let (parts, body) = resp.into_parts();
    let _ = body.collect().await;
    (parts.status.as_u16(), parts.headers)
}

/// One send at `pressure` and what came of it.
async fn outcome(
    upstream: &MockUpstream,
    send: impl Future<Output = (u16, http::HeaderMap)>,
) -> Outcome {
    let before = upstream.count();
    let (status, headers) = send.await;
    let text = |n: &str| headers.get(n).map(|v| v.to_str().unwrap().to_owned());
    let forwarded = (upstream.count() > before).then(|| {
        let r = upstream.last();
        let streams = r
            .headers
            .get_all("x-stream")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        (streams, r.body)
    });
    Outcome {
        status,
        retry_after: headers.contains_key("retry-after"),
        shed_reason: text("x-shed-reason"),
        content_type: text("content-type"),
        forwarded,
    }
}

#[tokio::test]
async fn every_case_http2_can_express_is_answered_as_over_http1() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let upstream = MockUpstream::start().await;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let proxy = spawn_proxy_with(&upstream.url(), &cases_policy(), |a| {
        a.tls_cert = Some(cert);
        a.tls_key = Some(key);
    })
    .await;
    let ca = Arc::new(ca);
    let mut statuses = std::collections::BTreeSet::new();
    for (case, pressures) in CASES {
        for &pressure in *pressures {
            pin(&proxy, pressure).await;
            let bytes = render(case);
            let mut h1 = connect_offering(&proxy, &ca, &[b"http/1.1"]).await;
            let one = outcome(&upstream, over_http1(&mut h1, &bytes)).await;
            let parsed = parse(&bytes);
            let two = outcome(&upstream, over_http2(&ca, &proxy, &parsed)).await;
            assert_eq!(one, two, "{case} at {pressure}");
            statuses.insert(one.status);
        }
    }
    // Shed, forwarded, refused (the duplicate `host`), and answered stale without the
    // upstream, each over both protocols.
    assert!(
        [503, 200, 400, 202].iter().all(|s| statuses.contains(s)),
        "{statuses:?}"
    );
    assert!(upstream.count() > 10);
}

/// `CONNECT` over HTTP/2 (`:method` and `:authority` only, RFC 9113 section 8.5) is 405, as
/// over HTTP/1.1; an absolute-form target whose authority differs from `Host` becomes
/// `:authority` beside a differing `host`, which HTTP/2 refuses (400).
#[tokio::test]
async fn connect_and_a_differing_authority_over_http2() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let upstream = MockUpstream::start().await;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let proxy = spawn_proxy_with(&upstream.url(), &cases_policy(), |a| {
        a.tls_cert = Some(cert);
        a.tls_key = Some(key);
    })
    .await;
    pin(&proxy, 1.0).await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    let connect = [
        (":method", "CONNECT"),
        (":authority", "internal.example.test:22"),
    ];
    raw.headers(1, &connect, true).await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 1).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(405));
    let case = parse(&render("faults/absolute-form-authority.http"));
    let authority = case
        .target
        .strip_prefix("http://")
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let mut fields = vec![
        (":method", case.method.as_str()),
        (":scheme", "https"),
        (":path", "/ingest"),
        (":authority", authority),
    ];
    fields.extend(case.fields.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    raw.headers(3, &fields, false).await;
    raw.data(3, &case.body, true).await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 3).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(400));
    assert_eq!(upstream.count(), 0);
}
