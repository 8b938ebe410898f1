//! Who the admin listener answers (docs/operations.md "The admin listener's rules"): only
//! requests addressed to it, and state-changing ones only from a client that is not a
//! browser, on loopback or with the bearer token.
//!
//! A web page can make its visitor's browser send requests to the admin port: a cross-site
//! form or `fetch` (CSRF), or, after DNS rebinding, same-origin requests under the attacker's
//! host name. What gives them away is the `Host` (the attacker's name), the `Origin` browsers
//! put on every state-changing request, and the body types a page can send without a CORS
//! preflight. As linkerd2-proxy's admin server (`linkerd/app/admin/src/server.rs`) answers
//! mutations only to loopback peers, and Caddy's admin endpoint checks `Host` and `Origin`,
//! [`check`] refuses, in this order:
//!
//! 1. any request whose `Host` (and absolute-form target) is not an IP literal, `localhost`
//!    or a name of `--admin-allow-host`: 421, and 400 for none (HTTP/1.1) or two;
//! 2. a state-changing request (any method but GET, HEAD, OPTIONS and TRACE, the safe methods
//!    of RFC 9110 section 9.2.1) that carries `Origin`, whatever its value: 403;
//! 3. one whose `Content-Type` is not `application/json`, or that has a body and no type: 415
//!    (`text/plain`, form-urlencoded and multipart need no preflight; a `Blob` body sends none);
//! 4. one from beyond loopback without the `--admin-token-file` token (`Authorization:
//!    Bearer`): 403 when no token is configured, 401 otherwise; a wrong token is 401 from any
//!    peer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Version, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::edge::serve::ClientInfo;
use crate::metrics::{AdminRefusal, Metrics};

/// Shortest token `--admin-token-file` may hold, bytes: 128 bits as hex.
pub const MIN_TOKEN_BYTES: usize = 32;

/// The `realm` of the admin listener's `WWW-Authenticate` challenges (RFC 6750 section 3).
const REALM: &str = "shedgate-admin";

/// Who may address the admin listener, and its token: `--admin-allow-host` and
/// `--admin-token-file`, validated.
#[derive(Clone, Default)]
pub struct AdminAccess {
    /// Names besides IP literals and `localhost`, lower case, without a trailing dot.
    hosts: Vec<String>,
    /// SHA-256 of the token: the token itself is not kept.
    token: Option<[u8; 32]>,
}

impl std::fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminAccess")
            .field("hosts", &self.hosts)
            .field("token", &self.token.map(|_| "<set>"))
            .finish()
    }
}

impl AdminAccess {
    /// Access for `hosts` (each checked by [`AdminAccess::allowed_name`]) and an optional
    /// token (checked by [`token_text`]).
    pub fn new(hosts: Vec<String>, token: Option<&str>) -> Self {
        AdminAccess {
            hosts,
            token: token.map(|t| Sha256::digest(t.as_bytes()).into()),
        }
    }

    /// Whether a token is configured.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// An `--admin-allow-host` entry as it is compared: a DNS name (labels of letters, digits
    /// and `-`, at most 63 bytes each, 253 in all), lower-cased, without its trailing dot.
    ///
    /// # Errors
    /// A port, a scheme, an IP literal (always served), `localhost` (always served) or
    /// anything that is not a host name, with what to write instead.
    pub fn allowed_name(entry: &str) -> Result<String, String> {
        let name = entry.trim().trim_end_matches('.').to_ascii_lowercase();
        if name.parse::<IpAddr>().is_ok() || name.starts_with('[') {
            return Err(format!(
                "{entry:?} is an IP address: IP literals are always served, list names only"
            ));
        }
        if name.contains(':') || name.contains('/') {
            return Err(format!(
                "{entry:?} is not a host name: give the name alone, without a scheme or a port"
            ));
        }
        if name == "localhost" {
            return Err(format!("{entry:?} is always served"));
        }
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(format!(
                "{entry:?} is not a host name (labels of letters, digits and '-', dot-separated)"
            ));
        }
        Ok(name)
    }

    fn serves(&self, name: &str) -> bool {
        name == "localhost" || self.hosts.iter().any(|h| h == name)
    }

    fn token_matches(&self, presented: &[u8]) -> bool {
        self.token.is_some_and(|expected| {
            // Digests of equal length compared in constant time: neither the token's bytes
            // nor its length show in the time a guess takes.
            let presented: [u8; 32] = Sha256::digest(presented).into();
            bool::from(expected.ct_eq(&presented))
        })
    }
}

/// The token in `--admin-token-file`'s `bytes`: the file's content without one trailing
/// newline (`\n` or `\r\n`, as `echo` and editors leave), at least [`MIN_TOKEN_BYTES`]
/// characters of RFC 6750's `b64token` (letters, digits, `-._~+/`, then `=` padding) so that
/// it travels in `Authorization: Bearer` unchanged (`openssl rand -hex 32` writes one).
///
/// # Errors
/// What is wrong with the content.
pub fn token_text(bytes: &[u8]) -> Result<&str, String> {
    let bytes = bytes
        .strip_suffix(b"\r\n")
        .or_else(|| bytes.strip_suffix(b"\n"))
        .unwrap_or(bytes);
    let body_end = bytes.iter().rposition(|&b| b != b'=').map_or(0, |i| i + 1);
    let b64 = |b: &u8| b.is_ascii_alphanumeric() || b"-._~+/".contains(b);
    if !bytes[..body_end].iter().all(b64) || bytes.is_empty() {
        return Err(
            "the token must be one line of letters, digits and -._~+/ (then = padding), \
             as in `openssl rand -hex 32`"
                .to_owned(),
        );
    }
    if bytes.len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "the token has {} characters; give at least {MIN_TOKEN_BYTES} (`openssl rand -hex 32`)",
            bytes.len()
        ));
    }
    // Only ASCII passed the checks above.
    std::str::from_utf8(bytes).map_err(|e| e.to_string())
}

/// Reads `--admin-token-file` (the same rule for the server and `shedgate preview`).
///
/// # Errors
/// The file cannot be read, or [`token_text`] refuses its content.
pub fn read_token(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    token_text(&bytes)
        .map(str::to_owned)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Why a request was refused, with what the answer tells the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 421: the `Host` (as sent, shortened) names no one this listener serves.
    Misdirected(String),
    /// 400: an HTTP/1.1 request without `Host`, or one with two (RFC 9112 section 3.2).
    HostHeader(&'static str),
    /// 403: a browser's `Origin` on a state-changing request.
    BrowserOrigin,
    /// 415: the `Content-Type` sent (`None`: a body without one).
    NotJson(Option<String>),
    /// 403: a state-changing request from beyond loopback, and no token configured.
    NotLoopback,
    /// 401: from beyond loopback without `Authorization: Bearer`.
    TokenMissing,
    /// 401: a credential that is not the token.
    TokenInvalid,
}

impl Refusal {
    /// The metric's reason.
    pub fn reason(&self) -> AdminRefusal {
        match self {
            Refusal::Misdirected(_) | Refusal::HostHeader(_) => AdminRefusal::Host,
            Refusal::BrowserOrigin => AdminRefusal::Origin,
            Refusal::NotJson(_) => AdminRefusal::ContentType,
            Refusal::NotLoopback => AdminRefusal::NotLoopback,
            Refusal::TokenMissing => AdminRefusal::TokenMissing,
            Refusal::TokenInvalid => AdminRefusal::TokenInvalid,
        }
    }

    /// The status it is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Misdirected(_) => StatusCode::MISDIRECTED_REQUEST,
            Refusal::HostHeader(_) => StatusCode::BAD_REQUEST,
            Refusal::BrowserOrigin | Refusal::NotLoopback => StatusCode::FORBIDDEN,
            Refusal::NotJson(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::TokenMissing | Refusal::TokenInvalid => StatusCode::UNAUTHORIZED,
        }
    }

    fn title_and_detail(&self) -> (&'static str, String) {
        match self {
            Refusal::Misdirected(host) => (
                "Not addressed to this listener",
                format!(
                    "Host {host:?} is not an IP address, localhost or a name given to \
                     --admin-allow-host (a web page after DNS rebinding looks like this). If \
                     clients reach this listener by that name, add it: --admin-allow-host NAME"
                ),
            ),
            Refusal::HostHeader(what) => ("Bad Host header", (*what).to_owned()),
            Refusal::BrowserOrigin => (
                "Browsers cannot change this proxy's state",
                "the request carries Origin, which browsers send: a web page may not pin \
                 pressure, reload or preview. Send it without Origin, from curl or a script"
                    .to_owned(),
            ),
            Refusal::NotJson(sent) => (
                "Send Content-Type: application/json",
                format!(
                    "state-changing admin requests carry Content-Type: application/json, or no \
                     body; {} (the types a web page can send across sites are refused)",
                    match sent {
                        Some(t) => format!("this one was {t:?}"),
                        None => "this one has a body and no Content-Type".to_owned(),
                    }
                ),
            ),
            Refusal::NotLoopback => (
                "State-changing requests need loopback or a token",
                "this peer is beyond loopback and the proxy has no --admin-token-file: send \
                 it from the proxy's host (kubectl port-forward arrives on loopback), or start \
                 the proxy with --admin-token-file FILE and send Authorization: Bearer TOKEN"
                    .to_owned(),
            ),
            Refusal::TokenMissing => (
                "Token required",
                "from beyond loopback, state-changing requests carry Authorization: Bearer \
                 TOKEN, the content of the proxy's --admin-token-file"
                    .to_owned(),
            ),
            Refusal::TokenInvalid => (
                "Invalid token",
                "the Authorization header is not Bearer with the proxy's --admin-token-file \
                 token"
                    .to_owned(),
            ),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (title, detail) = self.title_and_detail();
        let mut response = super::problem(self.status(), title, &detail);
        let challenge = match self {
            Refusal::TokenMissing => Some(format!("Bearer realm=\"{REALM}\"")),
            Refusal::TokenInvalid => {
                Some(format!("Bearer realm=\"{REALM}\", error=\"invalid_token\""))
            }
            _ => None,
        };
        if let Some(value) = challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

/// Whether `method` may change state: all but the safe methods of RFC 9110 section 9.2.1.
pub fn is_state_changing(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Whether the admin listener answers a request with this method, version and headers
/// (target: its URI) from `peer` (`None`: unknown, taken as beyond loopback), under
/// `access`. Pure: the middleware gathers the inputs.
///
/// # Errors
/// The first [`Refusal`] in the module's order.
pub fn check(
    method: &Method,
    version: Version,
    target: &axum::http::Uri,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    access: &AdminAccess,
) -> Result<(), Refusal> {
    addressed(version, target, headers, access)?;
    if !is_state_changing(method) {
        return Ok(());
    }
    if headers.contains_key(header::ORIGIN) {
        return Err(Refusal::BrowserOrigin);
    }
    json_or_nothing(headers)?;
    credential(headers, peer, access)
}

/// Step 1: the `Host`, and the authority of an absolute-form target (RFC 9112 section 3.2.2:
/// it replaces `Host`; both must name this listener).
fn addressed(
    version: Version,
    target: &axum::http::Uri,
    headers: &HeaderMap,
    access: &AdminAccess,
) -> Result<(), Refusal> {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(Refusal::HostHeader("the request has two Host headers")),
        (Some(host), None) => {
            let text = host.to_str().unwrap_or("");
            if !host_served(text, access) {
                return Err(Refusal::Misdirected(shortened(&String::from_utf8_lossy(
                    host.as_bytes(),
                ))));
            }
        }
        // HTTP/1.0 needs none, and names no one; a browser always sends one.
        (None, _) if version <= Version::HTTP_10 => {}
        (None, _) => {
            return Err(Refusal::HostHeader(
                "an HTTP/1.1 request needs a Host header",
            ));
        }
    }
    let Some(authority) = target.authority() else {
        return Ok(());
    };
    // `http://user@host/`: the user is no part of the name.
    let text = authority.as_str();
    let host = text.rsplit_once('@').map_or(text, |(_, host)| host);
    if host_served(host, access) {
        Ok(())
    } else {
        Err(Refusal::Misdirected(shortened(host)))
    }
}

/// Whether `authority` (`host[:port]`, a `Host` value) names this listener: an IP literal
/// other than the unspecified address, `localhost`, or an allowed name; case and one
/// trailing dot aside. The port is not compared: a Service or a port-forward may map it.
fn host_served(authority: &str, access: &AdminAccess) -> bool {
    // `port = *DIGIT` (RFC 3986 section 3.2.3): empty is allowed.
    let port_ok = |p: &str| p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
    let served_ip = |ip: IpAddr| !ip.to_canonical().is_unspecified();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split_once(']').is_some_and(|(v6, after)| {
            (after.is_empty() || after.strip_prefix(':').is_some_and(port_ok))
                && v6.parse::<Ipv6Addr>().is_ok_and(|v6| served_ip(v6.into()))
        });
    }
    let (name, port) = authority.split_once(':').unwrap_or((authority, ""));
    if !port_ok(port) {
        return false;
    }
    if let Ok(v4) = name.parse::<Ipv4Addr>() {
        return served_ip(v4.into());
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    !name.is_empty() && access.serves(&name)
}

/// At most 100 characters of what a client sent, for a problem's detail and a log line.
fn shortened(text: &str) -> String {
    text.chars().take(100).collect()
}

/// Step 3: `Content-Type: application/json` (parameters allowed), or no type and no body.
fn json_or_nothing(headers: &HeaderMap) -> Result<(), Refusal> {
    let mut types = headers.get_all(header::CONTENT_TYPE).iter();
    match (types.next(), types.next()) {
        (Some(_), Some(_)) => Err(Refusal::NotJson(Some(
            "two Content-Type headers".to_owned(),
        ))),
        (Some(t), None) => {
            if crate::extract::formats::media_type(t.as_bytes())
                .eq_ignore_ascii_case(b"application/json")
            {
                Ok(())
            } else {
                Err(Refusal::NotJson(Some(shortened(&String::from_utf8_lossy(
                    t.as_bytes(),
                )))))
            }
        }
        (None, _) => {
            let empty = !headers.contains_key(header::TRANSFER_ENCODING)
                && headers
                    .get(header::CONTENT_LENGTH)
                    .is_none_or(|n| n.as_bytes() == b"0");
            if empty {
                Ok(())
            } else {
                Err(Refusal::NotJson(None))
            }
        }
    }
}

/// Step 4: loopback, or the token.
fn credential(
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    access: &AdminAccess,
) -> Result<(), Refusal> {
    // An IPv4 peer of a `[::]` listener arrives as `::ffff:127.0.0.1`.
    let loopback = peer.is_some_and(|p| p.ip().to_canonical().is_loopback());
    let mut sent = headers.get_all(header::AUTHORIZATION).iter();
    let sent = match (sent.next(), sent.next()) {
        (None, _) => None,
        (Some(one), None) => Some(bearer(one.as_bytes())),
        (Some(_), Some(_)) => Some(None),
    };
    match (access.has_token(), sent) {
        // Without a configured token a credential cannot be checked, and is not needed on
        // loopback.
        (false, _) if loopback => Ok(()),
        (false, _) => Err(Refusal::NotLoopback),
        (true, None) if loopback => Ok(()),
        (true, None) => Err(Refusal::TokenMissing),
        (true, Some(Some(token))) if access.token_matches(token) => Ok(()),
        // A wrong token is an error even on loopback: the script that sent it would fail
        // from anywhere else.
        (true, Some(_)) => Err(Refusal::TokenInvalid),
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case, RFC 9110 section 11.1).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.starts_with(b" ") {
        return None;
    }
    Some(rest.trim_ascii())
}

/// The middleware's state: the access rules, the metric, and how many of each refusal were
/// logged.
#[derive(Debug)]
pub(super) struct Guard {
    access: AdminAccess,
    metrics: Arc<Metrics>,
    seen: [AtomicU64; 6],
}

impl Guard {
    pub(super) fn new(access: AdminAccess, metrics: Arc<Metrics>) -> Self {
        Guard {
            access,
            metrics,
            seen: Default::default(),
        }
    }
}

/// Applies [`check`] to every admin request: the refusal's answer, or the route's.
pub(super) async fn enforce(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<ClientInfo>().map(|c| c.peer);
    let verdict = check(
        request.method(),
        request.version(),
        request.uri(),
        request.headers(),
        peer,
        &guard.access,
    );
    let Err(refusal) = verdict else {
        return next.run(request).await;
    };
    let reason = refusal.reason();
    guard.metrics.admin_refused(reason);
    // The 1st, 2nd, 4th, 8th... refusal of each reason at warn, the others at debug: a page
    // that retries forever cannot flood the log, and no clock is needed.
    let n = guard.seen[reason as usize].fetch_add(1, Ordering::Relaxed) + 1;
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| shortened(&String::from_utf8_lossy(h.as_bytes())));
    macro_rules! refused {
        ($level:ident) => {
            tracing::$level!(
                reason = reason.as_str(),
                status = refusal.status().as_u16(),
                count = n,
                peer = ?peer,
                method = %request.method(),
                path = request.uri().path(),
                host = ?host,
                "admin request refused"
            )
        };
    }
    if n.is_power_of_two() {
        refused!(warn);
    } else {
        refused!(debug);
    }
    refusal.into_response()
}

#[cfg(test)]
mod tests;
