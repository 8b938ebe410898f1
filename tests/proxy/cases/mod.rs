//! The cases in tests/cases (copied from the team's shared cases: real sender formats and
//! inputs that broke other proxies), each sent byte for byte over a raw socket with the
//! expectation its README gives.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::*;

mod ambiguous;
mod formats;
mod over_h2;
mod senders;

const SECRET: &[u8] = b"shedgate-test-secret";

fn case_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cases")
        .join(name)
}

fn rfc3339(t: time::OffsetDateTime, millis: bool) -> String {
    let base = t.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second]"
    ));
    let base = base.unwrap();
    if millis {
        format!("{base}.{:03}", t.millisecond())
    } else {
        base
    }
}

/// Substitutes the README's placeholders and adds `Content-Length`: the bytes to send.
fn render(name: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(case_path(name)).unwrap();
    let now = now_utc();
    let unix = now.unix_timestamp().to_string();
    let ago = now - time::Duration::seconds(20) - time::Duration::hours(7);
    let text = text
        .replace("{{NOW_UNIX}}", &unix)
        .replace("{{NOW_UNIX_STRING}}", &unix)
        .replace(
            "{{NOW_RFC3339_MS_OFFSET}}",
            &format!("{}+00:00", rfc3339(now, true)),
        )
        .replace("{{NOW_RFC3339_MS}}", &format!("{}Z", rfc3339(now, true)))
        .replace("{{NOW_RFC3339}}", &format!("{}Z", rfc3339(now, false)))
        .replace(
            "{{AGO_600_UNIX}}",
            &(now.unix_timestamp() - 600).to_string(),
        )
        .replace(
            "{{AGO_600_RFC3339}}",
            &format!("{}Z", rfc3339(now - time::Duration::seconds(600), false)),
        )
        .replace(
            "{{AGO_7200_RFC3339}}",
            &format!("{}Z", rfc3339(now - time::Duration::hours(2), false)),
        )
        .replace(
            "{{AGO_20_ISO_NOCOLON_MINUS0700}}",
            &format!("{}-0700", rfc3339(ago, false)),
        );
    if name.ends_with(".raw") {
        return text.into_bytes();
    }
    let (head, body) = text
        .split_once("\r\n\r\n")
        .expect("a blank line after the headers");
    let mut head = head.to_owned();
    if head.contains("{{SIGNATURE}}") {
        let header = |n: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(&format!("{n}: ")))
                .unwrap()
                .to_owned()
        };
        let signed = format!(
            "{}.{}.{body}",
            header("webhook-id"),
            header("webhook-timestamp")
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(signed.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        head = head.replace("{{SIGNATURE}}", &sig);
    }
    format!("{head}\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// A raw `POST target` with `Host: x`, the given header lines (each ending in CRLF), and
/// `body` with its `Content-Length`.
fn post_raw(target: &str, headers: &str, body: &str) -> String {
    format!(
        "POST {target} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// `shedgate_unreadable_facts_total` with these labels, summed, as the proxy reports it now.
async fn unreadable(s: &Setup, labels: &[(&str, &str)]) -> f64 {
    metric(
        &scrape(&s.proxy).await,
        "shedgate_unreadable_facts_total",
        labels,
    )
}

/// No fact of any request so far was unreadable.
async fn assert_all_facts_read(s: &Setup) {
    assert_eq!(unreadable(s, &[]).await, 0.0);
}

/// Whether a Standard Webhooks v1 signature over the received bytes verifies.
fn signature_verifies(r: &Recorded) -> bool {
    let h = |n: &str| {
        r.headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut signed = format!("{}.{}.", h("webhook-id"), h("webhook-timestamp")).into_bytes();
    signed.extend_from_slice(&r.body);
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(&signed);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    h("webhook-signature")
        .split(' ')
        .any(|s| s == format!("v1,{expected}"))
}

/// A raw response: status, headers (lower-case names), body, and whether the proxy closed
/// the connection afterwards.
struct RawAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    closed: bool,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn exchange(proxy: &shedgate::app::Running, bytes: &[u8]) -> RawAnswer {
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut chunk))
            .await
            .expect("the proxy answers")
            .unwrap();
        assert!(
            n > 0,
            "connection closed before a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(n > 0);
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    // Did the proxy close the connection? (A read of 0 within a short wait.)
    let closed = matches!(
        tokio::time::timeout(Duration::from_millis(500), tcp.read(&mut chunk)).await,
        Ok(Ok(0) | Err(_))
    );
    RawAnswer {
        status,
        headers,
        body,
        closed,
    }
}

struct Setup {
    upstream: MockUpstream,
    proxy: shedgate::app::Running,
}

async fn setup() -> Setup {
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), &cases_policy()).await;
    Setup { upstream, proxy }
}

/// Sends `case` at `pressure` and asserts it was shed: 503, integer Retry-After, upstream
/// saw nothing.
async fn assert_shed(s: &Setup, case: &str, pressure: f64) -> RawAnswer {
    pin(&s.proxy, pressure).await;
    let before = s.upstream.count();
    let a = exchange(&s.proxy, &render(case)).await;
    assert_eq!(
        a.status,
        503,
        "{case} at {pressure}: {}",
        String::from_utf8_lossy(&a.body)
    );
    let retry = a.header("retry-after").unwrap();
    assert!(retry.parse::<u32>().is_ok_and(|n| n >= 1), "{retry}");
    assert_eq!(
        s.upstream.count(),
        before,
        "{case}: the upstream saw nothing"
    );
    a
}

/// Sends `case` at `pressure` and asserts it was forwarded and answered by the upstream.
async fn assert_forwarded(s: &Setup, case: &str, pressure: f64) -> Recorded {
    assert_forwarded_bytes(s, case, &render(case), pressure).await
}

async fn assert_forwarded_bytes(s: &Setup, case: &str, bytes: &[u8], pressure: f64) -> Recorded {
    pin(&s.proxy, pressure).await;
    let before = s.upstream.count();
    let a = exchange(&s.proxy, bytes).await;
    assert_eq!(
        a.status,
        200,
        "{case} at {pressure}: {}",
        String::from_utf8_lossy(&a.body)
    );
    assert_eq!(a.body, b"{\"ok\":true}");
    assert_eq!(s.upstream.count(), before + 1, "{case}: forwarded once");
    s.upstream.last()
}

#[tokio::test]
async fn case_connection_nominated_headers() {
    let s = setup().await;
    let r = assert_forwarded(&s, "faults/connection-nominated-headers.http", 1.0).await;
    for h in ["x-debug-trace", "keep-alive", "te", "connection"] {
        assert!(!r.headers.contains_key(h), "{h} reached the upstream");
    }
    assert_eq!(r.headers["x-stream"], "feature.boundary_edit");
}

#[tokio::test]
async fn case_te_cl_conflict() {
    let s = setup().await;
    pin(&s.proxy, 0.0).await;
    let a = exchange(&s.proxy, &render("faults/te-cl-conflict.raw")).await;
    assert_eq!(a.status, 400, "{:?}", a.headers);
    assert!(
        a.closed,
        "the connection is closed after a smuggling attempt"
    );
    // Give a trailing request every chance to run, then check nothing was forwarded.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.upstream.count(), 0);
}

#[tokio::test]
async fn case_swapped_coordinates() {
    // A policy that ranks the very cell h3o would compute for the swapped pair as rank 1:
    // if the proxy placed it there, it would be kept at 0.75.
    let wrapped = h3o::LatLng::new(151.20732, -33.86785)
        .unwrap()
        .to_cell(h3o::Resolution::Four);
    let areas =
        format!("{BERLIN_AREA}\n[[areas]]\nname = \"trap\"\nrank = 1\ncells = [\"{wrapped}\"]\n");
    let policy = PolicyDir::new(SEED_STREAMS, Some(&areas));
    let upstream = MockUpstream::start().await;
    let proxy = spawn_proxy(&upstream.url(), policy.path()).await;
    let s = Setup { upstream, proxy };
    let a = assert_shed(&s, "faults/swapped-coordinates.http", 0.75).await;
    let p: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(p["area"], "unconfigured");
    assert_eq!(p["rank"], 50);
    assert_eq!(unreadable(&s, &[("fact", "coordinates")]).await, 1.0);
}

#[tokio::test]
async fn case_non_finite_coordinates() {
    let s = setup().await;
    let a = assert_shed(&s, "faults/non-finite-coordinates.http", 0.75).await;
    let p: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(p["rank"], 50);
    assert_eq!(unreadable(&s, &[("fact", "coordinates")]).await, 1.0);
}

#[tokio::test]
async fn case_number_out_of_range() {
    let s = setup().await;
    assert_shed(&s, "faults/number-out-of-range.http", 0.75).await;
    let r = assert_forwarded(&s, "faults/number-out-of-range.http", 0.3).await;
    assert!(r.body.windows(5).any(|w| w == b"1e400"), "body unchanged");
    assert_eq!(unreadable(&s, &[("fact", "coordinates")]).await, 2.0);
}

#[tokio::test]
async fn case_numbers_as_strings() {
    let s = setup().await;
    assert_forwarded(&s, "faults/numbers-as-strings.http", 0.75).await;
    assert_all_facts_read(&s).await;
}

#[tokio::test]
async fn case_deep_unrelated_nesting() {
    let s = setup().await;
    let case = "faults/deep-unrelated-nesting.http";
    let sent = render(case);
    let r = assert_forwarded_bytes(&s, case, &sent, 0.75).await;
    let body_start = sent.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(
        r.body,
        &sent[body_start..],
        "the body reaches the upstream unchanged"
    );
}

#[tokio::test]
async fn case_odd_formatting_signed() {
    let s = setup().await;
    let case = "faults/odd-formatting-signed.http";
    let sent = render(case);
    let r = assert_forwarded_bytes(&s, case, &sent, 0.3).await;
    assert!(
        signature_verifies(&r),
        "the upstream verifies the signature over the raw body"
    );
    let body_start = sent.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(r.body, &sent[body_start..], "byte-identical body");
}

/// go#80416: an h2c upgrade request is served as HTTP/1.1 (never 101) and forwarded at 1.0
/// without `Upgrade` or `HTTP2-Settings`, which belong to the connection an upgrade would make.
#[tokio::test]
async fn case_h2c_upgrade() {
    let s = setup().await;
    let r = assert_forwarded(&s, "faults/h2c-upgrade.http", 1.0).await;
    for h in ["upgrade", "http2-settings", "connection"] {
        assert!(!r.headers.contains_key(h), "{h} reached the upstream");
    }
    assert_eq!(r.headers["x-stream"], "geofence.transition");
}
