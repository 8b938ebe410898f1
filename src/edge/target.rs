//! Request-target and head hygiene, before admission: what a request's line and `Host` say
//! must be one thing (RFC 9112 section 3.2).

use http::header::HOST;
use http::{HeaderValue, Method, Request};

use super::rejection::Rejection;

/// What the edge answers itself, before admission.
#[derive(Debug, Clone, PartialEq)]
pub enum Local {
    /// A refusal, counted as one.
    Reject(Box<Rejection>),
    /// `OPTIONS *`: a question about the server as a whole (RFC 9110 section 9.3.7), which
    /// the proxy answers for itself ([`super::rejection::server_options`]).
    ServerOptions,
}

/// Requests the proxy must never forward, answered here, in this order:
/// - a header line over `--max-header-line` (flagged by the framing guard): 431;
/// - no `Host` or several on HTTP/1.1 ([`bad_host`]): 400;
/// - `CONNECT` (a tunnel to any host the proxy can reach) and `TRACE` (which echoes the
///   request, credentials included, back to whoever sent it): 405 with `Allow` and
///   `Connection: close`, since a `CONNECT` client may follow with tunnel bytes;
/// - `OPTIONS *`: answered locally;
/// - an absolute-form target (RFC 9112 section 3.2.2) whose scheme is not `http` or `https`,
///   or whose authority carries userinfo (`http://user@host/`): 400;
/// - a path with an encoded `/` or `\` (`%2F`, `%5C`): 400, since readers disagree on
///   whether it separates segments (`/ingest/overland/..%2Ffleet` is Overland to one and
///   `/fleet` to another).
///
/// An absolute-form target with an `http` or `https` scheme is kept, and its authority
/// replaces `Host` (RFC 9112 section 3.2.2: a server ignores `Host` then), so the upstream
/// routes on what the request line says.
pub fn local_answer<B>(req: &mut Request<B>) -> Option<Local> {
    if let Some(too_long) = req.extensions().get::<super::framing::HeaderLineTooLong>() {
        return Some(Local::Reject(Box::new(Rejection::HeaderLineTooLong(
            too_long.0,
        ))));
    }
    if let Some(rejection) = bad_host(req) {
        return Some(Local::Reject(Box::new(rejection)));
    }
    if req.method() == Method::CONNECT || req.method() == Method::TRACE {
        return Some(Local::Reject(Box::new(Rejection::MethodNotAllowed(
            req.method().clone(),
        ))));
    }
    if req.method() == Method::OPTIONS && req.uri() == "*" {
        return Some(Local::ServerOptions);
    }
    let uri = req.uri();
    if let Some(scheme) = uri.scheme_str() {
        if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
            return Some(Local::Reject(Box::new(Rejection::BadRequest(format!(
                "request target scheme {scheme:?} is not http or https"
            )))));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Some(Local::Reject(Box::new(Rejection::BadRequest(
                "request target carries userinfo".to_owned(),
            ))));
        }
        if let Some(v) = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(HOST, v);
        }
    }
    let path = req.uri().path().as_bytes();
    let encoded_separator = path.windows(3).any(|w| {
        w[0] == b'%'
            && (w[1] == b'2' && w[2].eq_ignore_ascii_case(&b'f')
                || w[1] == b'5' && w[2].eq_ignore_ascii_case(&b'c'))
    });
    if encoded_separator {
        return Some(Local::Reject(Box::new(Rejection::BadRequest(
            "the path encodes a / or \\ (%2F, %5C): readers disagree on its segments".to_owned(),
        ))));
    }
    None
}

/// RFC 9112 section 3.2: an HTTP/1.1 request without a `Host` line, or with more than one, is
/// answered 400 and never forwarded (which `Host` would the upstream route on?). HTTP/1.0 may
/// omit it.
///
/// HTTP/2 (RFC 9113 section 8.3.1): `:authority` stands for `Host`. A request with neither,
/// with two `host` fields, or with a `host` that names another authority than `:authority`
/// (compared without regard to case) is answered 400; one with `:authority` alone gets it as
/// `Host` upstream ([`local_answer`]).
pub fn bad_host<B>(req: &Request<B>) -> Option<Rejection> {
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let (first, second) = (hosts.next(), hosts.next());
    if req.version() == http::Version::HTTP_2 {
        let authority = req.uri().authority().map(http::uri::Authority::as_str);
        let why = match (authority, first, second) {
            (_, Some(_), Some(_)) => "more than one host field (RFC 9113 section 8.3.1)",
            (None, None, _) => {
                "an HTTP/2 request must have :authority or host (RFC 9113 section 8.3.1)"
            }
            (Some(authority), Some(host), None)
                if !host.as_bytes().eq_ignore_ascii_case(authority.as_bytes()) =>
            {
                "host differs from :authority (RFC 9113 section 8.3.1)"
            }
            _ => return None,
        };
        return Some(Rejection::BadHost(why.to_owned()));
    }
    let why = match (first, second) {
        (Some(_), None) => return None,
        (None, _) if req.version() < http::Version::HTTP_11 => return None,
        (None, _) => "an HTTP/1.1 request must have a Host header (RFC 9112 section 3.2)",
        (Some(_), Some(_)) => "more than one Host header (RFC 9112 section 3.2)",
    };
    Some(Rejection::BadHost(why.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h2(uri: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::builder().version(http::Version::HTTP_2).uri(uri);
        for h in hosts {
            b = b.header(HOST, *h);
        }
        b.body(()).unwrap()
    }

    /// RFC 9113 section 8.3.1: `:authority` stands for `Host`; a `host` that names another
    /// authority, two of them, or neither is refused.
    #[test]
    fn an_http2_host_must_agree_with_authority() {
        assert_eq!(bad_host(&h2("https://a.example/x", &[])), None);
        assert_eq!(bad_host(&h2("https://a.example/x", &["A.Example"])), None);
        assert_eq!(bad_host(&h2("/x", &["a.example"])), None);
        for refused in [
            h2("https://a.example/x", &["b.example"]),
            h2("https://a.example/x", &["a.example:8443"]),
            h2("https://a.example/x", &["a.example", "a.example"]),
            h2("/x", &[]),
        ] {
            assert!(
                matches!(bad_host(&refused), Some(Rejection::BadHost(_))),
                "{refused:?}"
            );
        }
    }
}
