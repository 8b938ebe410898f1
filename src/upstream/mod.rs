//! The upstreams: everything one upstream owns ([`Upstream`]: its client, pressure, class
//! and freshness budgets, clock skew and load reports), the table of a proxy's upstreams
//! ([`Upstreams`], by [`UpstreamId`]) read with the policy it was built for as one
//! [`Routing`], rebuilt by name when a reload changes the upstreams ([`LiveUpstreams`]), and
//! the stack's innermost service sending each request to the upstream chosen for it
//! ([`Dispatch`], by its [`Target`], in a [`Routed`] request).
//!
//! And the client to one upstream ([`Proxy`]): the connection pool ([`pool`]), header
//! hygiene (RFC 9110 section 7.6.1), forwarding headers, the upstream timeout, and the
//! mapping of client failures to rejections (docs/responses.md "Proxying").

mod account;
mod classes;
mod dispatch;
mod freshness;
mod headers;
mod live;
pub mod load_report;
pub mod pool;
mod set;
mod settings;
mod state;

pub use account::{ACCOUNTS, Account, Accounts};
pub use classes::{ClassGuard, ClassLoad};
pub use dispatch::{Dispatch, Routed, Target};
pub use freshness::{FloorGuard, FreshnessBudget};
pub use headers::{HOP_BY_HOP, add_forwarding_headers, strip_hop_by_hop};
pub use live::{LiveUpstreams, UpstreamError};
pub use set::{DEFAULT_UPSTREAM, Routing, UpstreamId, Upstreams};
pub use settings::{ClientOptions, Defaults, Settings};
pub use state::Upstream;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
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
/// finished before forwarding starts). Carried beside the request ([`Routed`]); the upstream
/// timeout and the latency sample start when the body has been sent, so a slow uploader is neither
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

    /// Keeps idle connections to the upstream as `limits` says (`--pool-idle-timeout`,
    /// `--pool-max-idle`), instead of [`pool::Limits::default`].
    #[must_use]
    pub fn with_pool_limits(mut self, limits: pool::Limits) -> Self {
        self.pool = self.pool.with_limits(limits);
        self
    }

    /// Counts the upstream sockets against the process's descriptors, and, when a connect
    /// finds them exhausted, closes idle client connections and tries once more
    /// (`edge::descriptors`).
    #[must_use]
    pub fn with_descriptors(self, descriptors: Arc<crate::edge::descriptors::Descriptors>) -> Self {
        self.pool.count_descriptors(descriptors);
        self
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
        let progress = req.extensions().get::<BodyProgress>().cloned();
        Box::pin(async move { Ok(this.forward(req, progress).await) })
    }
}

impl Proxy {
    /// Sends `req` upstream; `progress` tells when its streamed body finished arriving
    /// (`None`: a body read whole before), where the upstream timeout starts.
    async fn forward(
        &self,
        req: Request<ForwardBody>,
        progress: Option<BodyProgress>,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let uri = match self.upstream_uri(&parts.uri) {
            Ok(uri) => uri,
            Err(e) => return failed(Rejection::BadRequest(format!("bad request target: {e}"))),
        };
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let client = parts.extensions.get::<ClientInfo>().map(|info| {
            let ip = info.peer.ip().to_canonical();
            (info, self.trusted.iter().any(|net| net.contains(&ip)))
        });
        // Hop-by-hop headers, `Expect` (the proxy answered `100-continue` itself by reading
        // the body; the upstream gets the whole body at once) and `Content-Length` (the body
        // is re-framed by the client: exact size → Content-Length, else chunked) removed,
        // the forwarding headers set.
        let has_host = headers::prepare_request(&mut parts.headers, client);
        if self.host == HostHeader::Upstream || !has_host {
            // A request without `Host` (HTTP/1.0) gets the upstream's, as HTTP/1.1 requires
            // (RFC 9112 section 3.2).
            parts.headers.insert(header::HOST, self.host_header.clone());
        }
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
