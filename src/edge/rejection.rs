//! The one place where a reason to answer a request here becomes a status, headers and a
//! body (docs/responses.md "Responses"; problem details per RFC 9457).
//!
//! The proxy never answers 410: webhook senders disable an endpoint that answers it.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde::Serialize;

use crate::admission::{Decision, ShedReason};
use crate::metrics::ErrorKind;
use crate::policy::Policy;
use crate::pressure::Pressure;

/// The response body type of the whole stack.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, crate::BoxError>;

/// Header naming why a request was shed: `pressure`, `stale` or `disabled`.
pub const X_SHED_REASON: &str = "x-shed-reason";

/// `application/problem+json` (RFC 9457 section 3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Why the proxy answers a request itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// Shed by pressure or because the stream is disabled: 503 + `Retry-After`.
    Shed {
        /// The decision's explanation.
        explanation: Explanation,
        /// Delay-seconds for `Retry-After`, at least 1.
        retry_after: u32,
    },
    /// A stale or superseded event (its successor came already): answered with the policy's
    /// non-retryable status (default 202).
    Stale {
        /// [`ShedReason::Stale`] or [`ShedReason::Superseded`]: the `X-Shed-Reason`.
        reason: ShedReason,
        /// The decision's explanation.
        explanation: Explanation,
        /// The status to answer.
        status: StatusCode,
        /// The sender's own success body (`application/json`, see
        /// [`crate::policy::Policy::stale_body`]) instead of the problem document, so that
        /// the sender counts the event as delivered and does not resend it.
        success_body: Option<Bytes>,
    },
    /// Declared or streamed body over the limit: 413.
    PayloadTooLarge {
        /// The limit, bytes.
        limit: u64,
    },
    /// The body was not received within the body read timeout: 408.
    BodyTimeout,
    /// A malformed request: 400.
    BadRequest(String),
    /// A request body whose framing broke while it was read (a malformed chunk, a connection
    /// cut mid-body): 400 with `Connection: close`, since nothing after it on the connection
    /// can be framed.
    BadBody(String),
    /// Ambiguous message framing (a request-smuggling attempt): 400, and the connection is
    /// closed so nothing after it on the connection is read (RFC 9112 section 6.3).
    BadFraming(String),
    /// No `Host`, or several, on an HTTP/1.1 request (RFC 9112 section 3.2): 400 with
    /// `Connection: close`.
    BadHost(String),
    /// A request header line over `--max-header-line` (bytes): 431 (RFC 6585 section 5) with
    /// `Connection: close`.
    HeaderLineTooLong(usize),
    /// A method the proxy never forwards (`CONNECT`): 405 with `Allow` (RFC 9110 section
    /// 15.5.6) and `Connection: close`.
    MethodNotAllowed(http::Method),
    /// The upstream could not be reached or failed mid-response: 502.
    BadGateway(String),
    /// The upstream did not answer in time: 504.
    GatewayTimeout,
    /// The upstream's answer had not begun within the class's `max_request_time` (seconds,
    /// as configured), counted from admission: 504 (docs/decision.md "Priority classes and
    /// budgets").
    ClassTimeout {
        /// The class's name.
        class: &'static str,
        /// The limit.
        limit: std::time::Duration,
    },
}

/// A decision made readable: the rule, the stream, the area and rank, pressure and
/// probability, and the policy version. Shed responses carry it; `explain` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// `admit` or `shed` (warn-mode would-sheds are `admit` with `would_shed` set).
    pub decision: &'static str,
    /// The rule that fired: `never-shed`, `unknown-stream`, `disabled`, `stale`,
    /// `pressure`, `kept`.
    pub reason: &'static str,
    /// Warn mode: the reason the request would have been shed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_shed: Option<&'static str>,
    /// The stream as the policy names it, or `unknown`.
    pub stream: String,
    /// The stream's class (`critical` for unknown streams).
    pub class: &'static str,
    /// The upstream the request was bound for, by the policy's name (`default`: `--upstream`):
    /// `pressure` is that upstream's.
    pub upstream: String,
    /// The area name, or `unconfigured`.
    pub area: String,
    /// The rank used, 1..=100.
    pub rank: u8,
    /// Pressure-shed probability, 0.0–1.0.
    pub probability: f64,
    /// Pressure the decision saw, 0.0–1.0.
    pub pressure: f64,
    /// Event age in seconds, when its time was readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<f64>,
    /// The schedule whose pressure floor raised `pressure`, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The policy version (content hash).
    pub policy_version: String,
    /// The history of the device the request named, as the decision read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<crate::admission::DeviceHistory>,
}

impl Explanation {
    /// Explains `decision`, taken under `policy` for the stream named `stream` (`None`:
    /// unknown) bound for `upstream` (an id `policy` issued), at that upstream's pressure.
    pub fn new(
        policy: &Policy,
        stream: Option<&str>,
        upstream: crate::policy::UpstreamId,
        decision: &Decision,
    ) -> Self {
        use crate::admission::Verdict;
        let (verdict, would) = match decision.verdict {
            Verdict::Admit => ("admit", None),
            Verdict::Shed(_) => ("shed", None),
            Verdict::WouldShed(r) => ("admit", Some(r.as_str())),
        };
        Explanation {
            decision: verdict,
            reason: decision.rule.as_str(),
            would_shed: would,
            stream: stream.unwrap_or(crate::policy::UNKNOWN_STREAM).to_owned(),
            class: stream
                .and_then(|s| policy.stream(s))
                .map_or(crate::policy::Class::Critical, |id| {
                    policy.stream_policy(id).class
                })
                .as_str(),
            upstream: policy
                .upstreams()
                .get(upstream.index())
                .map_or(crate::policy::DEFAULT_UPSTREAM, |u| u.name.as_str())
                .to_owned(),
            area: decision.area.map_or_else(
                || crate::policy::UNCONFIGURED_AREA.to_owned(),
                |a| policy.area(a).name.clone(),
            ),
            rank: decision.rank.get(),
            probability: decision.probability,
            pressure: decision.pressure.get(),
            age_seconds: decision.age_ms.map(crate::clock::millis_to_secs),
            schedule: decision
                .schedule
                .and_then(|i| policy.schedules().get(i))
                .map(|s| s.name.clone()),
            policy_version: policy.version().to_owned(),
            device: decision.device,
        }
    }
}

/// `Retry-After` delay-seconds for a shed at `pressure`: a centre that grows from
/// `policy.base` at `p <= 0.5` to `5 × base` at `p = 1`, jittered by `draw` (uniform in
/// `[0, 1)`) over `[centre / 2, centre * 3 / 2)` so a crowd of shed senders does not come back
/// in the same second, rounded up, clamped to `[1, policy.max]` (RFC 9110 section 10.2.3: a
/// non-negative integer of seconds).
pub fn retry_after(pressure: Pressure, draw: f64, policy: crate::policy::RetryAfterPolicy) -> u32 {
    let max = policy.max;
    let centre = f64::from(policy.base.max(1))
        * (1.0 + 8.0 * (pressure.get() - Pressure::SHED_FLOOR.get()).max(0.0));
    let jittered = centre * (0.5 + draw.clamp(0.0, 1.0));
    #[expect(clippy::cast_possible_truncation, reason = "clamped to [1, max]")]
    #[expect(clippy::cast_sign_loss, reason = "clamped to [1, max]")]
    let secs = jittered.ceil().clamp(1.0, f64::from(max.max(1))) as u32;
    secs
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u32>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    explanation: Option<&'a Explanation>,
}

impl Rejection {
    /// The status this rejection answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Shed { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::Stale { status, .. } => *status,
            Rejection::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Rejection::BadRequest(_)
            | Rejection::BadBody(_)
            | Rejection::BadFraming(_)
            | Rejection::BadHost(_) => StatusCode::BAD_REQUEST,
            Rejection::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Rejection::HeaderLineTooLong(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Rejection::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Rejection::GatewayTimeout | Rejection::ClassTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    /// The problem type's last part (`urn:shedgate:problem:<slug>`): `shed`, `stale`,
    /// `superseded`, `payload-too-large`, `body-timeout`, `bad-request`, `bad-body`,
    /// `bad-framing`, `bad-host`, `header-too-large`, `method-not-allowed`,
    /// `bad-gateway`, `gateway-timeout`, `class-timeout`: the access log's `reason` for a
    /// rejection.
    pub fn slug(&self) -> &'static str {
        match self {
            Rejection::Shed { .. } => "shed",
            Rejection::Stale {
                reason: ShedReason::Superseded,
                ..
            } => "superseded",
            Rejection::Stale { .. } => "stale",
            Rejection::PayloadTooLarge { .. } => "payload-too-large",
            Rejection::BodyTimeout => "body-timeout",
            Rejection::BadRequest(_) => "bad-request",
            Rejection::BadBody(_) => "bad-body",
            Rejection::BadFraming(_) => "bad-framing",
            Rejection::BadHost(_) => "bad-host",
            Rejection::HeaderLineTooLong(_) => "header-too-large",
            Rejection::MethodNotAllowed(_) => "method-not-allowed",
            Rejection::BadGateway(_) => "bad-gateway",
            Rejection::GatewayTimeout => "gateway-timeout",
            Rejection::ClassTimeout { .. } => "class-timeout",
        }
    }

    /// The error kind to count, for errors (not sheds).
    pub fn error_kind(&self) -> Option<ErrorKind> {
        match self {
            Rejection::Shed { .. } | Rejection::Stale { .. } => None,
            Rejection::PayloadTooLarge { .. } => Some(ErrorKind::PayloadTooLarge),
            Rejection::BodyTimeout => Some(ErrorKind::BodyTimeout),
            Rejection::BadRequest(_)
            | Rejection::BadBody(_)
            | Rejection::BadFraming(_)
            | Rejection::BadHost(_)
            | Rejection::MethodNotAllowed(_)
            | Rejection::HeaderLineTooLong(_) => Some(ErrorKind::BadRequest),
            Rejection::BadGateway(_) => Some(ErrorKind::BadGateway),
            Rejection::GatewayTimeout => Some(ErrorKind::GatewayTimeout),
            Rejection::ClassTimeout { .. } => Some(ErrorKind::ClassTimeout),
        }
    }

    /// The response: status, headers and problem+json body.
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let (kind, title, detail, retry, explanation, reason) = match &self {
            Rejection::Shed {
                explanation,
                retry_after,
            } => return shed_response(explanation, *retry_after),
            Rejection::Stale {
                explanation,
                reason: ShedReason::Superseded,
                ..
            } => (
                "urn:shedgate:problem:superseded",
                "Superseded event discarded",
                format!(
                    "stream {:?} event is older than its device's newest delivered one: that \
                     one superseded it; do not retry",
                    explanation.stream
                ),
                None,
                Some(explanation),
                Some(ShedReason::Superseded.as_str()),
            ),
            Rejection::Stale { explanation, .. } => (
                "urn:shedgate:problem:stale",
                "Stale event discarded",
                format!(
                    "stream {:?} event is older than its stale_after: a newer one superseded \
                     it; do not retry",
                    explanation.stream
                ),
                None,
                Some(explanation),
                Some(ShedReason::Stale.as_str()),
            ),
            Rejection::PayloadTooLarge { limit } => (
                "urn:shedgate:problem:payload-too-large",
                "Payload too large",
                format!("the request body exceeds the limit of {limit} bytes"),
                None,
                None,
                None,
            ),
            Rejection::BodyTimeout => (
                "urn:shedgate:problem:body-timeout",
                "Request body timeout",
                "the request body was not received within the body read timeout".to_owned(),
                None,
                None,
                None,
            ),
            Rejection::BadRequest(why) => (
                "urn:shedgate:problem:bad-request",
                "Bad request",
                why.clone(),
                None,
                None,
                None,
            ),
            Rejection::BadBody(why) => (
                "urn:shedgate:problem:bad-body",
                "Malformed request body",
                why.clone(),
                None,
                None,
                None,
            ),
            Rejection::BadFraming(why) => (
                "urn:shedgate:problem:bad-framing",
                "Ambiguous message framing",
                why.clone(),
                None,
                None,
                None,
            ),
            Rejection::BadHost(why) => (
                "urn:shedgate:problem:bad-host",
                "Missing or repeated Host",
                why.clone(),
                None,
                None,
                None,
            ),
            Rejection::HeaderLineTooLong(limit) => (
                "urn:shedgate:problem:header-too-large",
                "Request header line too large",
                format!("a request header line is longer than {limit} bytes"),
                None,
                None,
                None,
            ),
            Rejection::MethodNotAllowed(method) => (
                "urn:shedgate:problem:method-not-allowed",
                "Method not allowed",
                format!("{method} is never forwarded"),
                None,
                None,
                None,
            ),
            Rejection::BadGateway(why) => (
                "urn:shedgate:problem:bad-gateway",
                "Upstream unavailable",
                why.clone(),
                None,
                None,
                None,
            ),
            Rejection::GatewayTimeout => (
                "urn:shedgate:problem:gateway-timeout",
                "Upstream timeout",
                "the upstream did not answer within the upstream timeout".to_owned(),
                None,
                None,
                None,
            ),
            Rejection::ClassTimeout { class, limit } => (
                "urn:shedgate:problem:class-timeout",
                "Request time limit",
                format!(
                    "the upstream had not begun to answer within the {class} class's \
                     max_request_time ({}); the request may have reached it, resend",
                    humantime::format_duration(*limit)
                ),
                None,
                None,
                None,
            ),
        };
        let problem = Problem {
            kind,
            title,
            status: status.as_u16(),
            detail,
            retry_after: retry,
            explanation,
        };
        let close = matches!(
            self,
            Rejection::BadFraming(_)
                | Rejection::BadBody(_)
                | Rejection::BadHost(_)
                | Rejection::MethodNotAllowed(_)
                | Rejection::HeaderLineTooLong(_)
        );
        let (body, content_type) = match &self {
            Rejection::Stale {
                success_body: Some(body),
                ..
            } => (body.clone(), "application/json"),
            _ => (Bytes::from(problem.to_json()), PROBLEM_JSON),
        };
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(secs) = retry {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(reason) = reason {
            headers.insert(SHED_REASON, HeaderValue::from_static(reason));
        }
        if close {
            headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(self, Rejection::MethodNotAllowed(_)) {
            headers.insert(
                http::header::ALLOW,
                HeaderValue::from_static(ALLOWED_METHODS),
            );
        }
        response
    }
}

/// A shed's 503: `Content-Type`, `Retry-After` and `X-Shed-Reason` in that order, and the
/// problem document ([`document::shed_json`]), as the other rejections' answers are made but
/// with the document's constant parts written as one piece, the header name and the common
/// `Retry-After` values made once.
fn shed_response(explanation: &Explanation, retry_after: u32) -> Response<Body> {
    let mut response = Response::new(full(document::shed_json(explanation, retry_after)));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    headers.insert(RETRY_AFTER, retry_after_value(retry_after));
    headers.insert(SHED_REASON, HeaderValue::from_static(explanation.reason));
    response
}

/// [`X_SHED_REASON`] as a header name, made once: inserted by its text, it was parsed on each
/// answer.
const SHED_REASON: HeaderName = HeaderName::from_static(X_SHED_REASON);

/// `Retry-After: secs`, from [`RETRY_AFTER_VALUES`] up to a minute (`HeaderValue::from(u32)`
/// formats and copies the digits on each answer).
fn retry_after_value(secs: u32) -> HeaderValue {
    usize::try_from(secs)
        .ok()
        .and_then(|i| RETRY_AFTER_VALUES.get(i))
        .map_or_else(|| HeaderValue::from(secs), HeaderValue::clone)
}

/// Header values of the given integers' decimal texts.
macro_rules! seconds {
    ($($n:literal)*) => {
        [$(HeaderValue::from_static(stringify!($n))),*]
    };
}
/// `Retry-After` values of 0 to 60 seconds, each its decimal text.
static RETRY_AFTER_VALUES: [HeaderValue; 61] = seconds![
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33
    34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
];

/// Methods the proxy forwards, for `Allow`: the standard ones but `CONNECT` and `TRACE` (and
/// `OPTIONS *`, answered here).
pub const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// The proxy's own answer to `OPTIONS *` (RFC 9110 section 9.3.7): 200, `Allow`, no body.
/// Never forwarded, so no latency sample.
pub fn server_options() -> Response<Body> {
    let mut response = Response::new(full(Bytes::new()));
    response.headers_mut().insert(
        http::header::ALLOW,
        HeaderValue::from_static(ALLOWED_METHODS),
    );
    response
}

mod document;

#[cfg(test)]
mod problem_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RetryAfterPolicy;

    #[test]
    fn retry_after_is_an_integer_in_range_and_spread() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..1000 {
            let draw = f64::from(i) / 1000.0;
            let s = retry_after(
                Pressure::new(0.9).unwrap(),
                draw,
                RetryAfterPolicy::default(),
            );
            assert!((1..=30).contains(&s));
            seen.insert(s);
        }
        assert!(seen.len() >= 3, "{seen:?}");
        let tight = RetryAfterPolicy { base: 1, max: 2 };
        assert_eq!(retry_after(Pressure::FULL, 0.999, tight), 2);
        assert_eq!(
            retry_after(Pressure::ZERO, 0.0, RetryAfterPolicy::default()),
            1
        );
    }

    #[test]
    fn never_410() {
        for r in [
            Rejection::BodyTimeout,
            Rejection::GatewayTimeout,
            Rejection::ClassTimeout {
                class: "critical",
                limit: std::time::Duration::from_secs(2),
            },
            Rejection::BadGateway(String::new()),
            Rejection::PayloadTooLarge { limit: 1 },
            Rejection::BadRequest(String::new()),
        ] {
            assert_ne!(r.status(), StatusCode::GONE);
        }
    }
}
