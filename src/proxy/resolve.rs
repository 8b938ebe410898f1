//! Resolution: which route reads a request (by path prefix and `Content-Type`) and, when a
//! header or the route names it, the stream, before a byte of the body is read.

use http::{HeaderName, Request};

use crate::admission::Reading;
use crate::policy::{Policy, StreamId, StreamSource};

/// The route and content mode matching `req`, and its stream when known before the body:
/// from the route's source (a fixed stream, a header, a mapped header), or without a route
/// from `stream_header` (`--stream-header`). A stream the body names is left unknown
/// (`known: None`) until the body is read.
pub(super) fn resolve<B>(policy: &Policy, req: &Request<B>, stream_header: &HeaderName) -> Reading {
    // The route (a path prefix) says how to read the request; without one, the stream
    // header and the stream's own pointers.
    let route = policy.route_index(req.uri().path()).map(|i| {
        let ct = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes());
        (i, policy.routes()[i].mode_index(ct))
    });
    let source = route.map(|(i, j)| &policy.routes()[i].mode_at(j).stream);
    let header_value = |name: &http::HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let header_stream = |name: &http::HeaderName| header_value(name).and_then(|v| policy.stream(v));
    // `None` here: the stream is named in the body, known only once it is read.
    let known: Option<Option<StreamId>> = match source {
        None | Some(StreamSource::DefaultHeader) => Some(header_stream(stream_header)),
        Some(StreamSource::Header(h)) => Some(header_stream(h)),
        Some(mapped @ StreamSource::MappedHeader { name, .. }) => Some(
            header_value(name)
                .and_then(|v| mapped.map_field(v))
                .and_then(|n| policy.stream(&n)),
        ),
        Some(StreamSource::Fixed(name)) => Some(policy.stream(name)),
        Some(StreamSource::Field { .. }) => None,
    };
    Reading { route, known }
}
