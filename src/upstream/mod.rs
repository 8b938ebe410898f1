//! The proxy to the upstream: the connection pool ([`pool`]), header hygiene (RFC 9110
//! section 7.6.1), forwarding headers, the upstream timeout, and the mapping of client
//! failures to rejections (docs/responses.md "Proxying").

pub mod load_report;
pub mod pool;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use ipnet::IpNet;
use tokio::time::Instant;

use crate::BoxError;
use crate::edge::rejection::{Body, Rejection};
use crate::edge::serve::ClientInfo;

/// The request body type the proxy forwards: buffered bytes or a streamed, limited body.
pub type ForwardBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// What happened upstream, attached to every response the proxy returns as an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// The upstream answered; latency to its response headers.
    Answered {
        /// Time from sending to response headers.
        latency: Duration,
    },
    /// The upstream answered before the request body had been sent whole (a 401 or 413
    /// decided from the head, envoy#2929): forwarded, but not a latency sample, since the
    /// upstream did not do the request's work (docs/pressure.md "Samples").
    AnsweredEarly,
    /// The upstream did not answer within the timeout: an overload signal.
    TimedOut {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The proxy answered itself (502, 408, 413, 400), for this reason: not an upstream
    /// latency.
    Failed(crate::metrics::ErrorKind),
}

/// When the request body finished arriving (for streamed bodies; a buffered body has
/// finished before forwarding starts). Carried in request extensions; the upstream timeout
/// and the latency sample start when the body has been sent, so a slow uploader is neither
/// a 504 nor an upstream latency (it is a 408 when the body read timeout passes).
#[derive(Debug, Clone, Default)]
pub struct BodyProgress(std::sync::Arc<std::sync::OnceLock<Instant>>);

impl BodyProgress {
    /// Marks the body finished now (the first call wins).
    pub fn finish(&self) {
        let _ = self.0.set(Instant::now());
    }

    /// When the body finished, if it has.
    pub fn finished(&self) -> Option<Instant> {
        self.0.get().copied()
    }
}

/// How the proxy sets `Host` on forwarded requests (`--host-header client|upstream`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HostHeader {
    /// Pass the client's `Host` through (virtual hosting upstream still works).
    #[default]
    Client,
    /// Replace it with the upstream URL's host, and its port unless 80.
    Upstream,
}

/// How header names are written on the upstream leg (`--upstream-header-case`). HTTP field
/// names are case-insensitive (RFC 9110 section 5.1), but receivers that compare them
/// literally exist (authentik#25410, haproxy#462, go#21868), so by default each name goes out
/// as the sender wrote it, as nginx forwards it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HeaderCase {
    /// Each name as the sender wrote it (hyper's `preserve_header_case` on both legs); names
    /// the proxy adds (`X-Forwarded-For`, `Forwarded`, `Host`) in title case. Answers reach
    /// the client with the upstream's case too.
    #[default]
    Preserve,
    /// Every name title-cased (`Webhook-Signature`), whatever the sender wrote.
    Title,
    /// Every name in lower case (`webhook-signature`), as HTTP/2 writes them.
    Lower,
}

/// The request body was not received within the body read timeout.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("request body not received within {0:?}")]
pub struct BodyReadTimeout(pub Duration);

/// The client's request body failed while it streamed to the upstream: a malformed chunk (a
/// `+5` size, a bare LF, a size that overflows), or a connection cut mid-body. The client's
/// fault, answered 400 (bun PR #26931, pound#19): never a 502, never an upstream error, never
/// a latency sample; the upstream's request is aborted before its final chunk.
#[derive(Debug, thiserror::Error)]
#[error("request body: {0}")]
pub struct ClientBodyError(pub BoxError);

/// Where requests go and how long they may take.
#[derive(Debug, Clone)]
pub struct Proxy {
    pool: pool::Pool,
    authority: http::uri::Authority,
    /// `Host` for the upstream: its host, and its port unless 80; never user information.
    host_header: HeaderValue,
    path_prefix: Arc<str>,
    timeout: Duration,
    body_limit: u64,
    host: HostHeader,
    trusted: Arc<[IpNet]>,
}

pub use pool::POOL_IDLE_TIMEOUT;

impl Proxy {
    /// A proxy to `upstream` (an `http://` URL; a path is a prefix for every request path).
    /// `timeout` bounds the wait for response headers once the request body has been sent.
    /// `body_limit` is only reported in 413s; `host` says how `Host` is forwarded; peers in
    /// `trusted` keep their forwarding headers (see [`add_forwarding_headers`]); `case` says
    /// how header names are written upstream.
    pub fn new(
        upstream: &Uri,
        timeout: Duration,
        connect_timeout: Duration,
        body_limit: u64,
        host: HostHeader,
        trusted: &[IpNet],
        case: HeaderCase,
    ) -> Self {
        let prefix = upstream.path().trim_end_matches('/').to_owned();
        let authority = upstream
            .authority()
            .cloned()
            .unwrap_or_else(|| http::uri::Authority::from_static("127.0.0.1"));
        let port = authority.port_u16().unwrap_or(80);
        let host_header = if port == 80 {
            HeaderValue::from_str(authority.host())
        } else {
            HeaderValue::from_str(&format!("{}:{port}", authority.host()))
        }
        .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Proxy {
            pool: pool::Pool::new(authority.host(), port, connect_timeout, case),
            host_header,
            authority,
            path_prefix: prefix.into(),
            timeout,
            body_limit,
            host,
            trusted: trusted.into(),
        }
    }

    /// The request target sent upstream, in origin form (RFC 9112 section 3.2.1): the path
    /// prefix, then the client's path and query. The client's own target is reused as it is
    /// when there is no prefix and it is already in origin form.
    fn upstream_uri(&self, original: &Uri) -> Result<Uri, http::Error> {
        let pq = original.path_and_query().map_or("/", PathAndQuery::as_str);
        // The asterisk form (`OPTIONS *`, the clock probe) is about the server as a whole:
        // no path prefix applies to it.
        if self.path_prefix.is_empty() || pq == "*" {
            if original.scheme().is_none()
                && original.authority().is_none()
                && original.path_and_query().is_some()
            {
                return Ok(original.clone());
            }
            return Ok(Uri::from(PathAndQuery::try_from(pq)?));
        }
        Ok(Uri::from(PathAndQuery::try_from(format!(
            "{}{pq}",
            self.path_prefix
        ))?))
    }
}

impl tower::Service<Request<ForwardBody>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ForwardBody>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

impl Proxy {
    async fn forward(self, req: Request<ForwardBody>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let uri = match self.upstream_uri(&parts.uri) {
            Ok(uri) => uri,
            Err(e) => return failed(Rejection::BadRequest(format!("bad request target: {e}"))),
        };
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let client = parts.extensions.get::<ClientInfo>();
        strip_hop_by_hop(&mut parts.headers);
        // The proxy answered `Expect: 100-continue` itself by reading the body; the upstream
        // gets the whole body at once.
        parts.headers.remove(header::EXPECT);
        // The body is re-framed by the client (exact size → Content-Length, else chunked).
        parts.headers.remove(header::CONTENT_LENGTH);
        if let Some(info) = client {
            let ip = info.peer.ip().to_canonical();
            let trusted = self.trusted.iter().any(|net| net.contains(&ip));
            add_forwarding_headers(&mut parts.headers, info, trusted);
        }
        if self.host == HostHeader::Upstream || !parts.headers.contains_key(header::HOST) {
            // A request without `Host` (HTTP/1.0) gets the upstream's, as HTTP/1.1 requires
            // (RFC 9112 section 3.2).
            parts.headers.insert(header::HOST, self.host_header.clone());
        }
        let progress = parts.extensions.get::<BodyProgress>().cloned();
        let request = Request::from_parts(parts, body);
        let started = Instant::now();
        let sent = || {
            progress
                .as_ref()
                .map_or(Some(started), BodyProgress::finished)
        };
        let call = self.pool.send(request);
        tokio::pin!(call);
        let result = loop {
            // The upstream timeout runs from the end of the request body; while the client
            // is still sending, its body read timeout is what bounds the wait.
            let deadline = sent().unwrap_or_else(Instant::now) + self.timeout;
            tokio::select! {
                r = &mut call => break Ok(r),
                () = tokio::time::sleep_until(deadline) => {
                    if sent().is_some_and(|t| t + self.timeout <= Instant::now()) {
                        break Err(());
                    }
                }
            }
        };
        match result {
            Err(()) => {
                let mut r = Rejection::GatewayTimeout.into_response();
                r.extensions_mut().insert(UpstreamOutcome::TimedOut {
                    after: self.timeout,
                });
                r
            }
            Ok(Err(e)) => failed(self.classify(&e)),
            Ok(Ok(response)) => {
                // An answer that came before the body ended is not a latency sample: the
                // body is sent whole before any answer the upstream gives after reading it.
                let outcome = match sent() {
                    Some(t) => UpstreamOutcome::Answered {
                        latency: t.max(started).elapsed(),
                    },
                    None => UpstreamOutcome::AnsweredEarly,
                };
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let mut r =
                    Response::from_parts(parts, body.map_err(BoxError::from).boxed_unsync());
                r.extensions_mut().insert(outcome);
                r
            }
        }
    }

    /// Client errors caused by the request body (ours, raised while streaming it) are the
    /// client's fault; everything else is the upstream's.
    fn classify(&self, e: &pool::SendError) -> Rejection {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = source {
            if err.is::<BodyReadTimeout>() {
                return Rejection::BodyTimeout;
            }
            if err.is::<http_body_util::LengthLimitError>() {
                return Rejection::PayloadTooLarge {
                    limit: self.body_limit,
                };
            }
            if err.is::<ClientBodyError>() {
                return Rejection::BadBody(err.to_string());
            }
            source = err.source();
        }
        let mut detail = format!("upstream {}: {e}", self.authority);
        let mut source = std::error::Error::source(e);
        while let Some(err) = source {
            detail.push_str(&format!(": {err}"));
            source = err.source();
        }
        Rejection::BadGateway(detail)
    }
}

fn failed(rejection: Rejection) -> Response<Body> {
    let kind = rejection.error_kind();
    let mut r = rejection.into_response();
    if let Some(kind) = kind {
        r.extensions_mut().insert(UpstreamOutcome::Failed(kind));
    }
    r
}

/// Hop-by-hop headers that never cross a proxy (RFC 9110 section 7.6.1, plus the legacy
/// `Keep-Alive` and `Proxy-Connection`, and `TE`/`Trailer`/`Transfer-Encoding`/`Upgrade`), and
/// `HTTP2-Settings`, which belongs to the connection an h2c upgrade would make (RFC 7540
/// section 3.2.1) and is meaningless without that `Upgrade` (go#80416: it reached upstreams).
/// Names built at compile time: removing them parses nothing per request (parsing the nine
/// names twice per request was about 1% of the proxy's CPU, README "Benchmarks").
pub const HOP_BY_HOP: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("http2-settings"),
];

/// Where `name` (lowercase, as `HeaderName` holds it) is in [`HOP_BY_HOP`].
fn hop_by_hop_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        "http2-settings" => 9,
        _ => return None,
    })
}

/// Removes hop-by-hop headers: the standard set and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let present = present(headers, hop_by_hop_index);
    if present == 0 {
        return;
    }
    // `HOP_BY_HOP[0]` is `Connection`: the headers it names go too.
    if present & 1 != 0 {
        // Bytes, not `to_str`: a non-UTF-8 value must not hide the tokens beside it.
        // Tokens that name a header removed below anyway (`keep-alive`, `close`-free lists in
        // practice) are skipped without making a `HeaderName` of them.
        let nominated: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|t| {
                !t.eq_ignore_ascii_case(b"keep-alive")
                    && !t.eq_ignore_ascii_case(b"close")
                    && !HOP_BY_HOP
                        .iter()
                        .any(|h| t.eq_ignore_ascii_case(h.as_str().as_bytes()))
            })
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        for name in nominated {
            headers.remove(name);
        }
    }
    remove(headers, &HOP_BY_HOP, present);
}

/// Which names of a set `headers` holds: bit `i` for the name `index` places at `i` (at most
/// 32). One pass over the request's or answer's few names, each placed by one `match` on its
/// text (a switch on the length, then one comparison), instead of a hashed lookup per name:
/// the proxy looks for 32 fixed names per request (hop-by-hop both ways, forwarding headers)
/// and a request carries one or two of them. `scripts/instructions.sh` (callgrind, 4,000
/// POSTs of the harness's body): 70,202–70,247 instructions per request with a `remove` per
/// name; 66,585–66,933 comparing each name with each of the set's (64,525–64,666 with that
/// comparison after later changes), 63,449–63,758 over nine runs with the `match` (runs of
/// one build spread by up to 300; 63,483–63,542 in the final build).
fn present(headers: &HeaderMap, index: impl Fn(&str) -> Option<usize>) -> u32 {
    let mut found = 0u32;
    for name in headers.keys() {
        if let Some(i) = index(name.as_str()) {
            found |= 1 << i;
        }
    }
    found
}

/// Removes the `names` whose bits are set in `present` (from [`present`]).
fn remove(headers: &mut HeaderMap, names: &[HeaderName], present: u32) {
    for (i, name) in names.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

/// Forwarding headers a client could use to claim an address, host, path or scheme it does
/// not have (the de facto set frameworks read: Rack's `X-Forwarded-Ssl` and
/// `X-Forwarded-Scheme`, IIS's `Front-End-Https`, CDNs' `True-Client-IP`): kept (and
/// extended) only from trusted peers. Names built at compile time: removing them from an
/// untrusted peer's request parses nothing per request.
/// `FORWARDING[0..3]` are the three shedgate sets (`add_forwarding_headers`).
const FORWARDING: [HeaderName; 14] = [
    HeaderName::from_static("forwarded"),
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-url-scheme"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("true-client-ip"),
];

/// Where `name` (lowercase, as `HeaderName` holds it) is in [`FORWARDING`].
fn forwarding_index(name: &str) -> Option<usize> {
    Some(match name {
        "forwarded" => 0,
        "x-forwarded-for" => 1,
        "x-forwarded-proto" => 2,
        "x-forwarded-host" => 3,
        "x-forwarded-port" => 4,
        "x-forwarded-prefix" => 5,
        "x-forwarded-server" => 6,
        "x-forwarded-ssl" => 7,
        "x-forwarded-scheme" => 8,
        "x-url-scheme" => 9,
        "front-end-https" => 10,
        "x-real-ip" => 11,
        "x-client-ip" => 12,
        "true-client-ip" => 13,
        _ => return None,
    })
}

/// Removes underscore twins of the forwarding headers (`X_Forwarded_For` beside
/// `X-Forwarded-For`; any name that reads as one of [`FORWARDING`] once `_` reads as `-`),
/// from every peer, trusted ones included: a CGI or WSGI upstream reads a twin as the header
/// itself (`HTTP_X_FORWARDED_FOR`), so a client's twin passed through an ingress that keeps
/// underscores would stand beside the value shedgate sets (httpd PR #558, caddy#7808). Other
/// underscore headers are left alone. A request without `_` in any name costs one scan of
/// its names.
fn remove_forwarding_twins(headers: &mut HeaderMap) {
    if !headers
        .keys()
        .any(|k| k.as_str().as_bytes().contains(&b'_'))
    {
        return;
    }
    let twins: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            FORWARDING
                .iter()
                .any(|f| crate::extract::headers::is_twin(k.as_str(), f.as_str().as_bytes()))
        })
        .cloned()
        .collect();
    for name in twins {
        headers.remove(name);
    }
}

/// Sets the forwarding headers for a request from `client`.
///
/// - From a trusted peer (`trusted`: a load balancer or ingress in `--trusted-proxies`), the
///   client is appended to `X-Forwarded-For` and `Forwarded` (RFC 7239 section 4), earlier
///   values joined into one line, and `X-Forwarded-Proto` is kept as that peer set it (it
///   names the original client's scheme; `https, http` would name none), else set to `http`.
/// - From anyone else, every forwarding header it sent is dropped (a direct client could
///   claim any address or `https`), and `X-Forwarded-For`, `X-Forwarded-Proto` and
///   `Forwarded` name only this hop: its address, `http`.
///
/// An IPv4 client on a `[::]` listener (`::ffff:a.b.c.d`) is named as IPv4. The elements that
/// name the client are made once per connection and resume ([`ClientInfo::new`]); a request with no
/// earlier hops gets them without a copy (formatting them per request was about 1.8% of the
/// proxy's CPU under the throughput harness, README "Benchmarks").
pub fn add_forwarding_headers(headers: &mut HeaderMap, client: &ClientInfo, trusted: bool) {
    remove_forwarding_twins(headers);
    let present = present(headers, forwarding_index);
    if !trusted {
        remove(headers, &FORWARDING, present);
    }
    // Whether `FORWARDING[i]` is still there.
    let kept = |i: usize| trusted && present & (1 << i) != 0;
    let append = |headers: &mut HeaderMap, name: HeaderName, value: &HeaderValue, kept: bool| {
        if !kept {
            headers.insert(name, value.clone());
            return;
        }
        // Earlier hops are kept as bytes (a non-UTF-8 value is not dropped).
        let mut line: Vec<u8> = Vec::new();
        for v in &headers.get_all(&name) {
            line.extend_from_slice(v.as_bytes());
            line.extend_from_slice(b", ");
        }
        line.extend_from_slice(value.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&line) {
            headers.insert(name, v);
        }
    };
    append(
        headers,
        FORWARDING[1].clone(),
        &client.forwarded_for,
        kept(1),
    );
    if !kept(2) {
        headers.insert(FORWARDING[2].clone(), HeaderValue::from_static("http"));
    }
    append(headers, header::FORWARDED, &client.forwarded, kept(0));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str) -> ClientInfo {
        ClientInfo::new(std::net::SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    #[test]
    fn each_set_places_its_own_names_within_its_bits() {
        for (set, index) in [
            (
                &HOP_BY_HOP[..],
                hop_by_hop_index as fn(&str) -> Option<usize>,
            ),
            (&FORWARDING[..], forwarding_index),
        ] {
            for (i, name) in set.iter().enumerate() {
                assert_eq!(index(name.as_str()), Some(i), "{name}");
            }
            // Every index the match can give is one of the set's: names near the set's
            // (and the other set's) are placed nowhere or within it.
            for other in HOP_BY_HOP.iter().chain(&FORWARDING) {
                assert!(
                    index(other.as_str()).is_none_or(|i| set[i] == other),
                    "{other}"
                );
            }
            for other in ["host", "x-stream", "content-length", "x-forwarded", "tE"] {
                assert_eq!(index(other), None, "{other}");
            }
        }
    }

    #[test]
    fn strips_standard_and_nominated_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Debug-Trace"),
        );
        h.insert("x-debug-trace", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-stream", HeaderValue::from_static("a"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-stream"));
    }

    #[test]
    fn forwarding_headers_from_trusted_peers_are_extended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        add_forwarding_headers(&mut h, &client("127.0.0.1"), true);
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https", "the original scheme, once");
        assert_eq!(h["forwarded"], "for=127.0.0.1;proto=http");
        add_forwarding_headers(&mut h, &client("::1"), true);
        assert_eq!(
            h["forwarded"],
            "for=127.0.0.1;proto=http, for=\"[::1]\";proto=http"
        );
    }

    #[test]
    fn underscore_twins_of_forwarding_headers_go_from_every_peer() {
        for trusted in [true, false] {
            let mut h = HeaderMap::new();
            h.insert("x_forwarded_for", HeaderValue::from_static("10.9.9.9"));
            h.insert("x_forwarded-proto", HeaderValue::from_static("https"));
            h.insert("x-real_ip", HeaderValue::from_static("10.9.9.9"));
            h.insert("x_fleet_tenant", HeaderValue::from_static("kept"));
            add_forwarding_headers(&mut h, &client("127.0.0.1"), trusted);
            for twin in ["x_forwarded_for", "x_forwarded-proto", "x-real_ip"] {
                assert!(!h.contains_key(twin), "{twin} kept (trusted {trusted})");
            }
            assert_eq!(h["x_fleet_tenant"], "kept", "other underscore headers stay");
            assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        }
    }

    #[test]
    fn forwarding_headers_from_anyone_else_are_replaced() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("admin.example.test"),
        );
        h.insert(
            "forwarded",
            HeaderValue::from_static("for=10.0.0.1;proto=https"),
        );
        add_forwarding_headers(&mut h, &client("::ffff:127.0.0.1"), false);
        assert_eq!(
            h["x-forwarded-for"], "127.0.0.1",
            "mapped IPv4 named as IPv4"
        );
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["forwarded"], "for=127.0.0.1;proto=http");
        assert!(!h.contains_key("x-forwarded-host"));
        let mut h = HeaderMap::new();
        for name in FORWARDING {
            h.insert(name, HeaderValue::from_static("https"));
        }
        add_forwarding_headers(&mut h, &client("10.1.2.3"), false);
        let left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left.len(), 3, "only this hop's: {left:?}");
    }
}
