//! The answer hook of a client connection: which answers end their connection
//! (`Connection: close`), and the wrapper that marks the connection idle when an answer's
//! body ends (docs/responses.md "Connections").

use std::sync::Arc;

use http::{HeaderValue, Response, header};

use super::client::LameDuck;
use super::keepalive::{Activity, Answer};
use crate::metrics::{CloseReason, Metrics};

/// The answer hook of one connection: adds `Connection: close` to an answer given before its
/// request was received whole (an early answer; the lifecycle then lingers), during the lame
/// duck, or to an HTTP/1.0 request with a body of unknown length. hyper answers a
/// connection's requests one at a time and in order, so the n-th answer is the n-th
/// request's. The body is wrapped so that its end marks the connection idle
/// (`edge::keepalive`).
///
/// HTTP/1.0 has no chunked coding: an answer of unknown length (a streamed upstream answer,
/// chunked upstream) is delimited by closing the connection (RFC 9112 section 6.3, rule 8;
/// RFC 1945 section 7.2.2), whatever the client asked, and says so. An answer to HTTP/1.0
/// that closes is also given version 1.0: hyper adds `Connection: keep-alive` to a 1.1 answer
/// for an HTTP/1.0 client that asked for keep-alive, beside a `close` and before a
/// close-delimited body alike (`proto/h1/conn.rs`, `fix_keep_alive`), while a 1.0 answer
/// without keep-alive ends the connection. Known-length answers keep hyper's HTTP/1.0
/// keep-alive.
pub(super) fn close_when<B: http_body::Body>(
    verdicts: super::framing::Verdicts,
    lame_duck: LameDuck,
    metrics: Option<Arc<Metrics>>,
    activity: Arc<Activity>,
) -> impl FnOnce(Response<B>) -> Response<Answer<B>> + Clone {
    move |mut resp: Response<B>| {
        let index = activity.response();
        let close = if lame_duck.is_set() {
            Some(CloseReason::LameDuck)
        } else if verdicts.progress().received(index) == Some(false) {
            Some(CloseReason::EarlyAnswer)
        } else {
            None
        };
        if let Some(reason) = close
            && let Some(m) = &metrics
        {
            m.connection_closed(reason);
        }
        let http10 = activity.answering_http10();
        let close_delimited = http10 && resp.body().size_hint().exact().is_none();
        if close.is_some() || close_delimited {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            if http10 {
                *resp.version_mut() = http::Version::HTTP_10;
            }
        }
        resp.map(|body| Answer::new(body, activity))
    }
}
