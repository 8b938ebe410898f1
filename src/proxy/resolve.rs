//! Resolution: which route reads a request (by path prefix and `Content-Type`) and, when a
//! header or the route names it, the stream, before a byte of the body is read.

use http::{HeaderName, Request};

use crate::admission::Reading;
use crate::extract::headers::{Stated, read_one};
use crate::policy::path::route_path;
use crate::policy::{Policy, StreamId, StreamSource};
use crate::upstream::{UpstreamId, Upstreams};

/// Longest stream value read from a header, bytes: a longer value is unclassified without
/// being hashed or mapped (policy stream names are at most 64 characters; a `stream_map`
/// key may be longer, but no sender's event type is).
const MAX_STREAM_LEN: usize = 128;

/// The route and content mode matching `req`, and its stream when known before the body:
/// from the route's source (a fixed stream, a header, a mapped header), or without a route
/// from `stream_header` (`--stream-header`). A stream the body names is left unknown
/// (`known: None`) until the body is read.
pub(super) fn resolve<B>(policy: &Policy, req: &Request<B>, stream_header: &HeaderName) -> Reading {
    let headers = req.headers();
    let content_type = read_one(headers, &http::header::CONTENT_TYPE);
    // The route (a path prefix) says how to read the request; without one, the stream
    // header and the stream's own pointers.
    let route = policy.route_index(&route_path(req.uri().path())).map(|i| {
        let ct = content_type.value().map(http::HeaderValue::as_bytes);
        (i, policy.routes()[i].mode_index(ct))
    });
    let source = route.map(|(i, j)| &policy.routes()[i].mode_at(j).stream);
    // A header stated twice, differently, names no stream: unknown, so never shed.
    let mut ambiguous = content_type == Stated::Ambiguous;
    let mut header_value = |name: &http::HeaderName| match read_one(headers, name) {
        Stated::One(v) => v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|v| v.len() <= MAX_STREAM_LEN),
        Stated::Absent => None,
        Stated::Ambiguous => {
            ambiguous = true;
            None
        }
    };
    // `None` here: the stream is named in the body, known only once it is read.
    let known: Option<Option<StreamId>> = match source {
        None | Some(StreamSource::DefaultHeader) => {
            Some(header_value(stream_header).and_then(|v| policy.stream(v)))
        }
        Some(StreamSource::Header(h)) => Some(header_value(h).and_then(|v| policy.stream(v))),
        Some(mapped @ StreamSource::MappedHeader { name, .. }) => Some(
            header_value(name)
                .and_then(|v| mapped.map_field(v))
                .and_then(|n| policy.stream(&n)),
        ),
        Some(StreamSource::Fixed(name)) => Some(policy.stream(name)),
        Some(StreamSource::Field { .. }) => None,
    };
    let known = if ambiguous { Some(None) } else { known };
    Reading {
        route,
        known,
        ambiguous,
    }
}

/// The upstream a request of `stream` (when known) read by `route` (when one matched) goes
/// to: the route's, else the stream's, else `default` ([`Policy::upstream_of`]). The table
/// was built for `policy` (they are read as one [`crate::upstream::Routing`]), so the id is
/// the table's; were it not, `default` (an index check, never a panic).
pub(super) fn upstream_of(
    upstreams: &Upstreams,
    policy: &Policy,
    route: Option<usize>,
    stream: Option<StreamId>,
) -> UpstreamId {
    let id = policy.upstream_of(route, stream);
    if upstreams.get(id).is_some() {
        id
    } else {
        debug_assert!(false, "upstream {id:?} is not in the table");
        UpstreamId::DEFAULT
    }
}
