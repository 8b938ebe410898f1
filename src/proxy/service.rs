//! The service: the framing check and the stream's resolution (route, header, or the body
//! to come), then the branch between a sheddable body that is read and decided and a
//! `never` or unknown stream that streams through.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Request, Response};
use tower::Service;

use super::Shared;
use super::budget::{capped, hold_for_room};
use super::forward::{forward, reject, stream_through};
use super::future::ResponseFuture;
use super::read::admit_sheddable;
use super::record::{Start, finish};
use super::resolve::{resolve, upstream_of};
use crate::BoxError;
use crate::edge::rejection::{Body, Rejection};
use crate::edge::target::Local;
use crate::policy::Supersession;
use crate::upstream::Routed;

/// The admission service.
#[derive(Debug, Clone)]
pub struct Admission<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
}

// === impl Admission ===

impl<S, B> Service<Request<B>> for Admission<S>
where
    S: Service<Routed, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Always ready: admission is decided per request in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> ResponseFuture {
        let shared = Arc::clone(&self.shared);
        // The policy and the upstream table built for it, read as one.
        let snapshot = shared.upstreams.load();
        match &shared.records.log {
            None => self.admit(shared, snapshot, req),
            Some(log) => {
                let (log, start) = (Arc::clone(log), Start::of(log, &req));
                let policy = Arc::clone(&snapshot.snapshot);
                let answer = self.admit(Arc::clone(&shared), snapshot, req);
                finish(shared, log, start, policy, answer)
            }
        }
    }
}

impl<S> Admission<S> {
    /// The framing check, the stream's resolution, and the branch.
    fn admit<B>(
        &mut self,
        shared: Arc<Shared>,
        snapshot: Arc<crate::upstream::Routing>,
        mut req: Request<B>,
    ) -> ResponseFuture
    where
        S: Service<Routed, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
        S::Future: Send,
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let inner = self.inner.clone();
        let flagged = req
            .extensions()
            .get::<crate::edge::framing::AmbiguousFraming>();
        if let Some(why) = flagged
            .map(|f| f.0.clone())
            .or_else(|| ambiguous_framing(req.headers()))
        {
            return ResponseFuture::ready(reject(
                &shared,
                &snapshot,
                None,
                None,
                Rejection::BadFraming(why),
            ));
        }
        match crate::edge::target::local_answer(&mut req) {
            Some(Local::Reject(rejection)) => {
                return ResponseFuture::ready(reject(&shared, &snapshot, None, None, *rejection));
            }
            Some(Local::ServerOptions) => {
                return ResponseFuture::ready(crate::edge::rejection::server_options());
            }
            None => {}
        }
        let policy = &snapshot.policy;
        let reading = resolve(policy, &req, &shared.settings.stream_header);
        if reading.ambiguous {
            let route = reading.route.map(|(i, _)| i);
            snapshot
                .metrics
                .unreadable(None, route, crate::metrics::Fact::Ambiguous);
        }
        let stream = reading.known.flatten();
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > shared.settings.max_body) {
            // Refused before reading a byte.
            let rejection = Rejection::PayloadTooLarge {
                limit: shared.settings.max_body,
            };
            return ResponseFuture::ready(reject(&shared, &snapshot, stream, None, rejection));
        }
        let sheddable = match reading.known {
            None => true,
            Some(stream) => stream.is_some_and(|id| {
                policy.stream_policy(id).supersession == Supersession::SelfSuperseding
            }),
        };
        if sheddable {
            ResponseFuture::boxed(admit_sheddable(shared, inner, snapshot, reading, req))
        } else {
            // `never` and unknown streams: the body is not parsed or buffered; it streams
            // through, still bounded in size and time. Its arrival is observed all the same
            // (the offered rate counts every request the upstream is offered).
            let route = reading.route.map(|(i, _)| i);
            let upstream = upstream_of(&snapshot.upstreams, &snapshot.policy, route, stream);
            let up = &snapshot.upstreams[upstream];
            up.pressure.arrive();
            shared.preview_unread(
                &snapshot,
                stream.map(|id| policy.stream_policy(id).name.as_str()),
            );
            let class = snapshot.policy.class_of(stream);
            if capped(up, &snapshot.policy, class) {
                return ResponseFuture::boxed(async move {
                    match hold_for_room(&shared, upstream, &snapshot, stream, class).await {
                        Ok(reserved) => {
                            // The body deadline starts after the wait, not before it.
                            let (req, progress) = stream_through(&shared, req);
                            forward(
                                shared,
                                inner,
                                snapshot,
                                upstream,
                                stream,
                                req,
                                Some(progress),
                                reserved,
                                None,
                            )
                            .await
                        }
                        Err(response) => response,
                    }
                });
            }
            let (req, progress) = stream_through(&shared, req);
            ResponseFuture::boxed(forward(
                shared,
                inner,
                snapshot,
                upstream,
                stream,
                req,
                Some(progress),
                None,
                None,
            ))
        }
    }
}

/// The framing rule ([`crate::edge::framing::judge_framing`]) on the parsed headers. hyper has
/// already refused a final coding other than `chunked` and dropped a `Content-Length` that
/// came with `Transfer-Encoding`; what is still ambiguous here is refused.
fn ambiguous_framing(headers: &http::HeaderMap) -> Option<String> {
    let te: Vec<&[u8]> = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .map(http::HeaderValue::as_bytes)
        .collect();
    if te.is_empty() {
        return None;
    }
    crate::edge::framing::judge_framing(&te, headers.contains_key(CONTENT_LENGTH))
}
