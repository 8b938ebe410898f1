//! Request-target and head hygiene, before admission: what a request's line and `Host` say
//! must be one thing (RFC 9112 section 3.2).

use http::Request;

use super::rejection::Rejection;

/// RFC 9112 section 3.2: an HTTP/1.1 request without a `Host` line, or with more than one, is
/// answered 400 and never forwarded (which `Host` would the upstream route on?). HTTP/1.0 may
/// omit it.
pub fn bad_host<B>(req: &Request<B>) -> Option<Rejection> {
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let why = match (hosts.next(), hosts.next()) {
        (Some(_), None) => return None,
        (None, _) if req.version() < http::Version::HTTP_11 => return None,
        (None, _) => "an HTTP/1.1 request must have a Host header (RFC 9112 section 3.2)",
        (Some(_), Some(_)) => "more than one Host header (RFC 9112 section 3.2)",
    };
    Some(Rejection::BadHost(why.to_owned()))
}
