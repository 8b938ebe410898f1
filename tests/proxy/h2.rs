//! HTTP/2 at the TLS edge: ALPN `h2`, each stream one request decided alone (a shed stream is
//! answered 503 on that stream, the connection goes on), the upstream leg in HTTP/1.1,
//! `:authority` against `host`, an early answer's `RST_STREAM` `NO_ERROR`, the limits
//! (concurrent streams advertised and enforced, rapid reset), and the graceful closes (drain,
//! lame duck, idle timeout) as RFC 9113 section 6.8 describes them.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use shedgate::config::{HumanDelay, HumanDuration, ServeArgs};

use crate::h2_frames::*;
use crate::processes::{OK_EMPTY, RawReply, RawUpstream};
use crate::support::*;
use crate::tls::{Ca, connect_offering, install, tls_proxy};

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// A TLS proxy with a fresh CA's leaf, settings tweaked.
async fn h2_proxy(
    tweak: impl FnOnce(&mut ServeArgs),
) -> (
    Ca,
    tempfile::TempDir,
    MockUpstream,
    PolicyDir,
    shedgate::app::Running,
) {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let (upstream, policy, proxy) = tls_proxy(dir.path(), tweak).await;
    (ca, dir, upstream, policy, proxy)
}

/// hyper's HTTP/2 client over a TLS connection that offered `h2` and `http/1.1`: ALPN
/// chooses `h2`.
async fn h2_client(proxy: &shedgate::app::Running, ca: &Ca) -> Sender {
    let tls = connect_offering(proxy, ca, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

async fn post_h2(sender: &Sender, stream: &str, body: String) -> Answer {
    let req = Request::post("https://localhost/ingest")
        .header("x-stream", stream)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.clone().send_request(req).await.expect("answered");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn closes(text: &str, reason: &str) -> f64 {
    metric(
        text,
        "shedgate_client_connection_closes_total",
        &[("reason", reason)],
    )
}

/// Scrapes `admin` until `check` holds on the page (the count is made as the connection's task
/// ends, just after the client saw the close): a margin, not a timing claim.
async fn eventually(admin: std::net::SocketAddr, check: impl Fn(&str) -> bool) -> String {
    for _ in 0..200 {
        let text = send(
            Request::get(format!("http://{admin}/metrics"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        let text = String::from_utf8(text.body.to_vec()).unwrap();
        if check(&text) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the metric never showed the expected count");
}

/// Two streams sent at once on one connection at pressure 1.0: the sheddable one is answered
/// 503 with `Retry-After` and problem+json on its stream, the never-shed one is forwarded; the
/// connection stays open and a third stream after the 503 is served. The upstream receives
/// HTTP/1.1 with `Host` from `:authority` and the forwarding headers saying https.
#[tokio::test]
async fn streams_of_one_connection_are_decided_alone() {
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|_| {}).await;
    pin(&proxy, 1.0).await;
    let sender = h2_client(&proxy, &ca).await;
    let (shed, kept) = tokio::join!(
        post_h2(&sender, "sensor.reading", event(MUNICH, 0)),
        post_h2(&sender, "feature.boundary_edit", event(MUNICH, 0)),
    );
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        shed.header("retry-after")
            .is_some_and(|r| r.parse::<u32>().is_ok_and(|s| s > 0))
    );
    assert_eq!(
        shed.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(shed.json()["status"], 503);
    assert_eq!(kept.status, StatusCode::OK);
    assert_eq!(upstream.count(), 1);
    let third = post_h2(&sender, "geofence.transition", event(BERLIN, 0)).await;
    assert_eq!(third.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
    let seen = upstream.last();
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(seen.headers["host"], "localhost");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(seen.headers["forwarded"], "for=127.0.0.1;proto=https");
    assert_eq!(seen.uri, "/ingest");
    let text = scrape(&proxy).await;
    let tls = |p| metric(&text, "shedgate_tls_connections_total", &[("protocol", p)]);
    assert_eq!((tls("h2"), tls("http/1.1")), (1.0, 0.0));
    assert_eq!(metric(&text, "shedgate_http2_streams_total", &[]), 3.0);
}

/// RFC 9113 section 8.3.1: a `host` naming another authority than `:authority` is 400, as is
/// a request with neither; one that agrees (any case) is forwarded. Each on its own stream of
/// one connection.
#[tokio::test]
async fn a_host_that_differs_from_authority_is_400() {
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|_| {}).await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    let never = ("x-stream", "geofence.transition");
    let cases = [
        (
            1,
            request("POST", "/ingest", &[("host", "admin.example"), never]),
            400,
        ),
        (
            3,
            vec![
                (":method", "POST"),
                (":scheme", "https"),
                (":path", "/ingest"),
                never,
            ],
            400,
        ),
        (
            5,
            request("POST", "/ingest", &[("host", "LOCALHOST"), never]),
            200,
        ),
    ];
    for (stream, fields, want) in cases {
        raw.headers(stream, &fields, true).await;
        let seen = raw.until(|f| f.kind == HEADERS && f.stream == stream).await;
        let answer = seen.last().unwrap();
        assert_eq!(status(&answer.payload), Some(want), "stream {stream}");
    }
    assert_eq!(upstream.count(), 1);
    assert_eq!(upstream.last().headers["host"], "localhost");
    // Counted as the proxy's own 400s are.
    assert_eq!(proxy_errors(&scrape(&proxy).await, "bad_request"), 2.0);
}

/// An answer given before the request body arrived (413 for a declared length over
/// `--max-body`) ends its stream with `RST_STREAM` `NO_ERROR` after the answer (RFC 9113
/// section 8.1), and the connection serves the next stream.
#[tokio::test]
async fn an_early_answer_ends_its_stream_with_no_error_and_the_connection_goes_on() {
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|_| {}).await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    let fields = request(
        "POST",
        "/ingest",
        &[
            ("x-stream", "geofence.transition"),
            ("content-length", "10000000"),
        ],
    );
    raw.headers(1, &fields, false).await;
    raw.data(1, b"{\"partial\":", false).await;
    let seen = raw.until(|f| f.kind == RST_STREAM && f.stream == 1).await;
    let answer = seen
        .iter()
        .find(|f| f.kind == HEADERS && f.stream == 1)
        .expect("an answer before the reset");
    assert_eq!(status(&answer.payload), Some(413));
    assert_eq!(seen.last().unwrap().word(0), NO_ERROR, "{seen:?}");
    raw.headers(
        3,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 3).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(200));
    assert_eq!(upstream.count(), 1);
}

/// A `content-length` the `DATA` frames do not match, short or long, makes the stream
/// malformed (RFC 9113 section 8.1.1): it is reset with `PROTOCOL_ERROR`, and the upstream
/// never receives a complete request, even for a never-shed stream whose body was already
/// streaming there. The connection serves the next stream.
#[tokio::test]
async fn a_content_length_the_data_does_not_match_never_reaches_the_upstream_whole() {
    let upstream = RawUpstream::start(|_| RawReply::AfterBody(OK_EMPTY, Duration::ZERO)).await;
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    install(dir.path(), &ca.leaf(90));
    let policy = PolicyDir::seed();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let proxy = spawn_proxy_with(&upstream.url(), policy.path(), |a| {
        a.tls_cert = Some(cert);
        a.tls_key = Some(key);
    })
    .await;
    pin(&proxy, 0.0).await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    // Declared 10, sent 6; declared 2, sent 7.
    for (stream, declared, sent) in [(1, "10", &b"{\"a\":1"[..]), (3, "2", &b"{\"a\":1}"[..])] {
        let fields = request(
            "POST",
            "/ingest",
            &[
                ("x-stream", "geofence.transition"),
                ("content-length", declared),
            ],
        );
        raw.headers(stream, &fields, false).await;
        raw.data(stream, sent, true).await;
        let seen = raw
            .until(|f| f.kind == RST_STREAM && f.stream == stream)
            .await;
        assert_eq!(seen.last().unwrap().word(0), PROTOCOL_ERROR, "{seen:?}");
    }
    raw.headers(
        5,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 5).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(200));
    let complete = upstream.requests().iter().filter(|r| r.complete).count();
    assert_eq!(complete, 1, "{:?}", upstream.requests());
}

/// Field names are lower case by the protocol (RFC 9113 section 8.2.1): a name with an
/// upper-case letter closes the connection with `GOAWAY` `PROTOCOL_ERROR` (the h2 crate's
/// HPACK decoder refuses it), counted, and nothing is forwarded.
#[tokio::test]
async fn an_upper_case_field_name_is_a_protocol_error() {
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|_| {}).await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    raw.headers(
        1,
        &request("POST", "/ingest", &[("X-Stream", "geofence.transition")]),
        true,
    )
    .await;
    let frames = raw.until_closed().await;
    let goaway = frames.iter().find(|f| f.kind == GOAWAY).unwrap();
    assert_eq!(goaway.goaway(), (0, PROTOCOL_ERROR));
    eventually(proxy.admin_addr, |t| {
        closes(t, "http2_protocol_error") == 1.0
    })
    .await;
    assert_eq!(upstream.count(), 0);
}

/// `--h2-max-concurrent-streams` is advertised in the proxy's SETTINGS (with `--max-head` as
/// the header list size, and the flow-control windows that bound the request bytes a client
/// can make the proxy hold unread: 64 KiB a stream, 256 KiB the connection) and enforced: a
/// stream past it is refused with `REFUSED_STREAM`, the open ones finish, and the connection
/// takes new streams once they have.
#[tokio::test]
async fn the_stream_limit_is_advertised_and_enforced() {
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|a| {
        a.h2_max_concurrent_streams = Some(2);
    })
    .await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    let seen = raw
        .until(|f| f.kind == SETTINGS && f.flags & ACK == 0)
        .await;
    let settings = seen.last().unwrap();
    assert_eq!(settings.setting(MAX_CONCURRENT_STREAMS), Some(2));
    assert_eq!(settings.setting(MAX_HEADER_LIST_SIZE), Some(32 * 1024));
    assert_eq!(settings.setting(INITIAL_WINDOW_SIZE), Some(64 * 1024));
    // The connection's window opened from the protocol's 65,535 to 256 KiB (RFC 9113
    // section 6.9.2: SETTINGS cannot change it).
    let seen = raw
        .until(|f| f.kind == WINDOW_UPDATE && f.stream == 0)
        .await;
    assert_eq!(seen.last().unwrap().word(0), 256 * 1024 - 65_535);
    let open = request(
        "POST",
        "/ingest",
        &[("x-stream", "geofence.transition"), ("content-length", "2")],
    );
    for stream in [1, 3, 5] {
        raw.headers(stream, &open, false).await;
    }
    let seen = raw.until(|f| f.kind == RST_STREAM).await;
    let reset = seen.last().unwrap();
    assert_eq!((reset.stream, reset.word(0)), (5, REFUSED_STREAM));
    for stream in [1, 3] {
        raw.data(stream, b"{}", true).await;
    }
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let f = raw.until(|f| f.kind == HEADERS).await.pop().unwrap();
        assert_eq!(status(&f.payload), Some(200));
        answered.push(f.stream);
    }
    answered.sort_unstable();
    assert_eq!(answered, [1, 3]);
    raw.headers(
        7,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    let f = raw.until(|f| f.kind == HEADERS).await.pop().unwrap();
    assert_eq!(f.stream, 7);
    assert_eq!(upstream.count(), 3);
}

/// The rapid-reset pattern (CVE-2023-44487): streams opened and reset at once, more than
/// `--h2-max-pending-resets` before the proxy accepts them, close the connection with
/// `GOAWAY` `ENHANCE_YOUR_CALM`, counted.
#[tokio::test]
async fn rapid_reset_closes_the_connection_with_enhance_your_calm() {
    let (ca, _dir, _upstream, _policy, proxy) = h2_proxy(|_| {}).await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    raw.write(&opened_and_reset(50)).await;
    let frames = raw.until_closed().await;
    let goaway = frames
        .iter()
        .find(|f| f.kind == GOAWAY)
        .unwrap_or_else(|| panic!("no GOAWAY in {frames:?}"));
    assert_eq!(goaway.goaway().1, ENHANCE_YOUR_CALM);
    eventually(proxy.admin_addr, |t| {
        closes(t, "http2_enhance_your_calm") == 1.0
    })
    .await;

    // The same burst under a limit above it: the connection goes on.
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|a| {
        a.h2_max_pending_resets = Some(100);
    })
    .await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    raw.write(&opened_and_reset(50)).await;
    raw.headers(
        101,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 101).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(200));
    assert!(seen.iter().all(|f| f.kind != GOAWAY), "{seen:?}");
    assert!(upstream.count() >= 1);
}

/// `n` streams (1, 3, 5, ...), each opened with a whole request and reset at once, in one
/// write: the proxy reads them all before it accepts any.
fn opened_and_reset(n: u32) -> Vec<u8> {
    let fields = request("GET", "/", &[("x-stream", "geofence.transition")]);
    let mut burst = Vec::new();
    for i in 0..n {
        let stream = 2 * i + 1;
        burst.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            stream,
            &hpack(&fields),
        ));
        burst.extend(frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
    }
    burst
}

/// The drain, as RFC 9113 section 6.8 describes it: a `GOAWAY` with the largest stream id
/// first, then, once the client has acknowledged the `PING` after it (a round trip), one with
/// the last stream processed. A stream the client opened before it saw the first `GOAWAY` is
/// served; one opened after the second is ignored; the stream in flight when the drain began
/// finishes, then the connection closes.
#[tokio::test]
async fn the_drain_is_two_goaways_and_streams_below_the_last_id_finish() {
    let (ca, _dir, upstream, _policy, proxy) = h2_proxy(|_| {}).await;
    let admin = proxy.admin_addr;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    let body = event(BERLIN, 0);
    let length = body.len().to_string();
    let first = request(
        "POST",
        "/ingest",
        &[
            ("x-stream", "feature.boundary_edit"),
            ("content-length", &length),
        ],
    );
    raw.headers(1, &first, false).await;
    let (head, tail) = body.as_bytes().split_at(body.len() / 2);
    raw.data(1, head, false).await;
    // The stream has reached the proxy: the drain begins with it in flight.
    eventually(admin, |t| {
        metric(t, "shedgate_http2_streams_total", &[]) == 1.0
    })
    .await;
    let stopping = tokio::spawn(proxy.shutdown());

    let seen = raw.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (0x7fff_ffff, NO_ERROR));
    let ping = raw
        .until(|f| f.kind == PING && f.flags & ACK == 0)
        .await
        .pop()
        .unwrap();
    // Sent before the client acknowledges the PING: processed.
    raw.headers(
        3,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    raw.write(&frame(PING, ACK, 0, &ping.payload)).await;
    let seen = raw.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (3, NO_ERROR));
    // After the last id: ignored.
    raw.headers(
        5,
        &request("POST", "/ingest", &[("x-stream", "dlq.replay")]),
        true,
    )
    .await;
    raw.data(1, tail, true).await;
    let rest: Vec<Frame> = seen.into_iter().chain(raw.until_closed().await).collect();
    for stream in [1, 3] {
        let answer = rest
            .iter()
            .find(|f| f.kind == HEADERS && f.stream == stream)
            .unwrap_or_else(|| panic!("stream {stream} was not answered: {rest:?}"));
        assert_eq!(status(&answer.payload), Some(200), "stream {stream}");
    }
    assert!(
        rest.iter().all(|f| f.stream != 5 || f.kind == RST_STREAM),
        "{rest:?}"
    );
    stopping.await.unwrap();
    let seen = upstream.seen.lock().unwrap().clone();
    let streams: Vec<_> = seen
        .iter()
        .filter(|r| !r.is_clock_probe())
        .map(|r| r.headers["x-stream"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(streams.len(), 2, "{streams:?}");
    assert!(!streams.iter().any(|s| s == "dlq.replay"), "{streams:?}");
    let first = seen
        .iter()
        .find(|r| r.headers["x-stream"] == "feature.boundary_edit")
        .unwrap();
    assert_eq!(
        first.body,
        body.as_bytes(),
        "the stream in flight finished whole"
    );
}

/// The shutdown delay is the `GOAWAY`: from the lame duck on, an open HTTP/2 connection is
/// sent the graceful `GOAWAY` pair and closes while the proxy still serves, and a connection
/// made during the lame duck gets it at once.
#[tokio::test]
async fn the_lame_duck_sends_goaway_to_every_http2_connection() {
    let (ca, _dir, _upstream, _policy, proxy) = h2_proxy(|a| {
        a.shutdown_delay = Some(HumanDelay(Duration::from_secs(600)));
    })
    .await;
    let (admin, addr) = (proxy.admin_addr, proxy.proxy_addr);
    let mut raw = Raw::open(addr, &ca).await;
    raw.headers(
        1,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 1).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(200));
    let lame_duck = proxy.lame_duck.clone();
    let stopping = tokio::spawn(proxy.stop());

    let seen = raw.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (0x7fff_ffff, NO_ERROR));
    let ping = raw
        .until(|f| f.kind == PING && f.flags & ACK == 0)
        .await
        .pop()
        .unwrap();
    raw.write(&frame(PING, ACK, 0, &ping.payload)).await;
    let seen = raw.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (1, NO_ERROR));
    assert!(raw.until_closed().await.iter().all(|f| f.kind != HEADERS));
    assert!(
        lame_duck.is_set() && !stopping.is_finished(),
        "still the lame duck"
    );
    eventually(admin, |t| closes(t, "lame_duck") == 1.0).await;

    let mut late = Raw::open(addr, &ca).await;
    let seen = late.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (0x7fff_ffff, NO_ERROR));
    stopping.abort();
}

/// An HTTP/2 connection with no stream open is closed at `--idle-timeout`, with the graceful
/// `GOAWAY` pair, and counted as an HTTP/1 one is.
#[tokio::test]
async fn an_idle_http2_connection_is_closed_at_the_idle_timeout() {
    let (ca, _dir, _upstream, _policy, proxy) = h2_proxy(|a| {
        a.idle_timeout = Some(HumanDuration(Duration::from_millis(1500)));
        a.header_read_timeout = Some(HumanDuration(Duration::from_millis(1500)));
    })
    .await;
    let mut raw = Raw::open(proxy.proxy_addr, &ca).await;
    raw.headers(
        1,
        &request("POST", "/ingest", &[("x-stream", "geofence.transition")]),
        true,
    )
    .await;
    let seen = raw.until(|f| f.kind == HEADERS && f.stream == 1).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(200));
    let seen = raw.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (0x7fff_ffff, NO_ERROR));
    let ping = raw
        .until(|f| f.kind == PING && f.flags & ACK == 0)
        .await
        .pop()
        .unwrap();
    raw.write(&frame(PING, ACK, 0, &ping.payload)).await;
    let seen = raw.until(|f| f.kind == GOAWAY).await;
    assert_eq!(seen.last().unwrap().goaway(), (1, NO_ERROR));
    raw.until_closed().await;
    eventually(proxy.admin_addr, |t| closes(t, "idle_timeout") == 1.0).await;
}
