//! The admission middleware: a tower layer that decides in `call` (never in `poll_ready`:
//! readiness-based shedding misfires under axum and on idle keep-alive connections), forwards
//! what it admits, and keeps in-flight accounting until the response body ends.
//!
//! It only gathers inputs — the stream, a policy snapshot, the body's facts, the pressure,
//! the clock, a random draw — and calls [`decide`]; the rule itself lives in
//! [`crate::admission`].

mod body;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderName};
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use tower::{Layer, Service, ServiceExt};

pub use body::{GuardedBody, TimedBody};

use crate::BoxError;
use crate::admission::Load;
use crate::admission::time::parse_time_text;
use crate::admission::{
    BodyState, Coordinates, EventFacts, EventTime, Facts, ShedReason, UnixMillis, Verdict, decide,
    summarise,
};
use crate::metrics::{Fact, Outcome};
use crate::policy::store::Snapshot;
use crate::policy::{Class, PolicyStore, StreamId, StreamSource, Supersession};
use crate::pressure::PressureGauge;
use crate::rejection::{Body, Explanation, Rejection, retry_after};
use crate::upstream::{ForwardBody, UpstreamOutcome};
use std::sync::atomic::{AtomicU32, Ordering};

/// Request-path settings of the middleware.
#[derive(Debug, Clone)]
pub struct AdmissionSettings {
    /// Header carrying the stream name (default `X-Stream`).
    pub stream_header: HeaderName,
    /// Body size limit, bytes.
    pub max_body: u64,
    /// Time allowed to receive the whole request body.
    pub body_read_timeout: Duration,
    /// The upstream's in-flight capacity (`--max-inflight`), which class budgets share.
    pub capacity: u32,
}

/// Inputs the decision takes from outside, injectable for tests.
#[derive(Debug, Clone, Copy)]
pub struct Sources {
    /// The wall clock, for staleness.
    pub clock: fn() -> UnixMillis,
    /// Uniform random draws in `[0, 1)`.
    pub draw: fn() -> f64,
}

impl Default for Sources {
    fn default() -> Self {
        Sources {
            clock: UnixMillis::now,
            draw: fastrand::f64,
        }
    }
}

#[derive(Debug)]
struct Shared {
    store: Arc<PolicyStore>,
    pressure: Arc<PressureGauge>,
    settings: AdmissionSettings,
    sources: Sources,
    /// For bodies read on a route whose stream turned out unknown.
    default_extractor: crate::admission::Extractor,
    /// In flight per class, for budgets.
    classes: Arc<ClassLoad>,
}

/// Requests in flight per class; wakes `never` requests waiting for room under a cap.
#[derive(Debug, Default)]
pub struct ClassLoad {
    inflight: [AtomicU32; 3],
    room: tokio::sync::Notify,
}

impl ClassLoad {
    /// The load the budgets see, given the total in flight and the capacity.
    pub fn load(&self, total: u32, capacity: u32) -> Load {
        Load {
            class_inflight: std::array::from_fn(|i| self.inflight[i].load(Ordering::Relaxed)),
            total,
            capacity,
        }
    }

    fn start(self: &Arc<Self>, class: Class) -> ClassGuard {
        self.inflight[class.index()].fetch_add(1, Ordering::Relaxed);
        ClassGuard {
            load: Arc::clone(self),
            class,
        }
    }
}

/// One request in flight in a class; dropping it ends it and wakes waiters.
#[derive(Debug)]
struct ClassGuard {
    load: Arc<ClassLoad>,
    class: Class,
}

impl Drop for ClassGuard {
    fn drop(&mut self) {
        self.load.inflight[self.class.index()].fetch_sub(1, Ordering::Relaxed);
        self.load.room.notify_waiters();
    }
}

/// Wraps a proxy service with admission control.
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    shared: Arc<Shared>,
}

impl AdmissionLayer {
    /// A layer deciding with the live policy in `store` and the pressure in `pressure`.
    pub fn new(
        store: Arc<PolicyStore>,
        pressure: Arc<PressureGauge>,
        settings: AdmissionSettings,
        sources: Sources,
    ) -> Self {
        AdmissionLayer {
            shared: Arc::new(Shared {
                store,
                pressure,
                settings,
                sources,
                default_extractor: crate::admission::Extractor::default(),
                classes: Arc::new(ClassLoad::default()),
            }),
        }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Admission<S> {
        Admission {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The admission service.
#[derive(Debug, Clone)]
pub struct Admission<S> {
    inner: S,
    shared: Arc<Shared>,
}

// === impl Admission ===

impl<S, B> Service<Request<B>> for Admission<S>
where
    S: Service<Request<ForwardBody>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
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
        let inner = self.inner.clone();
        let snapshot = shared.store.load();
        let flagged = req.extensions().get::<crate::framing::AmbiguousFraming>();
        if let Some(why) = flagged
            .map(|f| f.0.clone())
            .or_else(|| ambiguous_framing(req.headers()))
        {
            return ResponseFuture::ready(reject(&snapshot, None, Rejection::BadFraming(why)));
        }
        // The route (a path prefix) says how to read the request; without one, the stream
        // header and the stream's own pointers.
        let policy = &snapshot.policy;
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
        let header_stream =
            |name: &http::HeaderName| header_value(name).and_then(|v| policy.stream(v));
        // `None` here: the stream is named in the body, known only once it is read.
        let known: Option<Option<StreamId>> = match source {
            None | Some(StreamSource::DefaultHeader) => {
                Some(header_stream(&shared.settings.stream_header))
            }
            Some(StreamSource::Header(h)) => Some(header_stream(h)),
            Some(mapped @ StreamSource::MappedHeader { name, .. }) => Some(
                header_value(name)
                    .and_then(|v| mapped.map_field(v))
                    .and_then(|n| policy.stream(&n)),
            ),
            Some(StreamSource::Fixed(name)) => Some(policy.stream(name)),
            Some(StreamSource::Field { .. }) => None,
        };
        let stream = known.flatten();
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
            return ResponseFuture::ready(reject(&snapshot, stream, rejection));
        }
        let sheddable = match known {
            None => true,
            Some(stream) => stream.is_some_and(|id| {
                policy.stream_policy(id).supersession == Supersession::SelfSuperseding
            }),
        };
        if sheddable {
            let read = Read { route, known };
            ResponseFuture::boxed(admit_sheddable(shared, inner, snapshot, read, req))
        } else {
            // `never` and unknown streams: the body is not parsed or buffered; it streams
            // through, still bounded in size and time.
            let class = snapshot.policy.class_of(stream);
            if capped(&shared, &snapshot.policy, class) {
                return ResponseFuture::boxed(async move {
                    match hold_for_room(&shared, &snapshot, stream, class).await {
                        Ok(reserved) => {
                            // The body deadline starts after the wait, not before it.
                            let req = stream_through(&shared, req);
                            forward(shared, inner, snapshot, stream, req, reserved).await
                        }
                        Err(response) => response,
                    }
                });
            }
            let req = stream_through(&shared, req);
            ResponseFuture::boxed(forward(shared, inner, snapshot, stream, req, None))
        }
    }
}

/// A request whose body streams to the upstream unread, bounded in size and time.
fn stream_through<B>(shared: &Shared, req: Request<B>) -> Request<ForwardBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let progress = crate::upstream::BodyProgress::default();
    parts.extensions.insert(progress.clone());
    let limit = usize::try_from(shared.settings.max_body).unwrap_or(usize::MAX);
    let body = TimedBody::new(
        Limited::new(body, limit).boxed_unsync(),
        shared.settings.body_read_timeout,
        progress,
    )
    .boxed_unsync();
    Request::from_parts(parts, body)
}

/// Whether a `never` request of `class` must get a place under the class cap first.
fn capped(shared: &Shared, policy: &crate::policy::Policy, class: Class) -> bool {
    let cap = policy.class(class);
    cap.wait.is_some() && shared.load().over_budget(class, cap)
}

/// A `never` request of a capped class over its budget: in warn mode (global or the class's)
/// it is counted as a would-shed and goes through; otherwise it waits for a reserved place
/// (`Ok`) or, when the wait runs out, gets its 503 answer (`Err`).
async fn hold_for_room(
    shared: &Shared,
    snapshot: &Snapshot,
    stream: Option<StreamId>,
    class: Class,
) -> Result<Option<ClassGuard>, Response<Body>> {
    let policy = &snapshot.policy;
    let warn = policy.mode() == crate::policy::Mode::Warn
        || policy.class(class).mode == Some(crate::policy::Mode::Warn);
    if warn {
        snapshot
            .metrics
            .shed(stream, None, Verdict::WouldShed(ShedReason::Budget));
        return Ok(None);
    }
    match wait_for_room(shared, policy, class).await {
        Ok(guard) => Ok(Some(guard)),
        Err(()) => Err(cap_exceeded(shared, snapshot, stream)),
    }
}

/// The framing rule ([`crate::framing::judge_framing`]) on the parsed headers. hyper has
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
    crate::framing::judge_framing(&te, headers.contains_key(CONTENT_LENGTH))
}

/// How to read a request whose body must be read: its route and mode (indices into the
/// snapshot's policy), and its stream if known before the body.
#[derive(Debug, Clone, Copy)]
struct Read {
    route: Option<(usize, usize)>,
    known: Option<Option<StreamId>>,
}

/// Reads a body (a sheddable stream's, or one that names its own stream), decides, and
/// forwards or answers.
async fn admit_sheddable<S, B>(
    shared: Arc<Shared>,
    inner: S,
    snapshot: Arc<Snapshot>,
    read_as: Read,
    req: Request<B>,
) -> Response<Body>
where
    S: Service<Request<ForwardBody>, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let settings = &shared.settings;
    let stream = read_as.known.flatten();
    let (parts, body) = req.into_parts();
    let limit = usize::try_from(settings.max_body).unwrap_or(usize::MAX);
    let read = tokio::time::timeout(
        settings.body_read_timeout,
        Limited::new(body, limit).collect(),
    );
    let bytes = match read.await {
        Err(_) => return reject(&snapshot, stream, Rejection::BodyTimeout),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            let rejection = Rejection::PayloadTooLarge {
                limit: settings.max_body,
            };
            return reject(&snapshot, stream, rejection);
        }
        Ok(Err(e)) => {
            let rejection = Rejection::BadRequest(format!("request body: {e}"));
            return reject(&snapshot, stream, rejection);
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };

    let policy = &snapshot.policy;
    let mode = read_as
        .route
        .map(|(i, j)| policy.routes()[i].mode_at(j))
        .filter(|m| !m.stream_pointers);
    let (extractor, time_header) = match (mode, stream) {
        (Some(m), _) => (&m.extractor, m.time_header.as_ref()),
        (None, Some(id)) => {
            let content_type = parts.headers.get(http::header::CONTENT_TYPE);
            let m = policy
                .stream_policy(id)
                .read_mode(content_type.map(http::HeaderValue::as_bytes));
            (&m.extractor, m.time_header.as_ref())
        }
        (None, None) => (&shared.default_extractor, None),
    };
    let mut body_facts = extractor.extract(&bytes);
    // CloudEvents binary mode: the time is an attribute header, not in the data.
    if let Some(h) = time_header
        && let Some(at) = parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_time_text)
    {
        for e in &mut body_facts.events {
            e.time = EventTime::At(at);
        }
    }
    let source = read_as
        .route
        .map(|(i, j)| &policy.routes()[i].mode_at(j).stream);
    // Each event's stream: known before the body, or named in the body (mapped by the route).
    let stream_of = |e: &EventFacts| match (read_as.known, source) {
        (Some(known), _) => known,
        (None, Some(source)) => e
            .stream
            .as_deref()
            .and_then(|v| source.map_field(v))
            .and_then(|n| policy.stream(&n)),
        (None, None) => None,
    };
    let (stream, facts) = if body_facts.events.is_empty() {
        let no_facts = Facts {
            body: body_facts.body,
            coordinates: Coordinates::Missing,
            time: EventTime::Missing,
        };
        (stream, no_facts)
    } else {
        summarise(policy, body_facts.body, &body_facts.events, stream_of)
    };
    let m = &snapshot.metrics;
    let sheddable = stream
        .is_some_and(|id| policy.stream_policy(id).supersession == Supersession::SelfSuperseding);
    if sheddable {
        if facts.body == BodyState::NotJson {
            m.unreadable(stream, Fact::Body);
        }
        if !matches!(facts.coordinates, Coordinates::Valid { .. }) {
            m.unreadable(stream, Fact::Coordinates);
        }
        if !matches!(facts.time, EventTime::At(_)) {
            m.unreadable(stream, Fact::Time);
        }
    }
    let pressure = shared.pressure.admission_pressure();
    let now = (shared.sources.clock)();
    let decision = decide(
        policy,
        stream,
        &facts,
        now,
        pressure,
        (shared.sources.draw)(),
        &shared.load(),
    );
    m.shed(stream, decision.area, decision.verdict);
    if decision.implausible_time {
        m.unreadable(stream, Fact::ImplausibleTime);
    }
    let name = stream.map(|id| policy.stream_policy(id).name.as_str());
    tracing::debug!(
        stream = name.unwrap_or(crate::metrics::UNKNOWN_STREAM),
        verdict = ?decision.verdict,
        rule = decision.rule.as_str(),
        rank = decision.rank.get(),
        probability = decision.probability,
        pressure = pressure.get(),
        policy_version = policy.version(),
        "admission decision"
    );
    match decision.verdict {
        Verdict::Shed(reason) => {
            let explanation = Explanation::new(policy, name, &decision);
            let rejection = if reason == ShedReason::Stale {
                Rejection::Stale {
                    explanation,
                    status: policy.stale_status(),
                }
            } else {
                let secs = retry_after(pressure, (shared.sources.draw)(), policy.retry_after());
                Rejection::Shed {
                    explanation,
                    retry_after: secs,
                }
            };
            m.request(stream, Outcome::Shed);
            m.counts(stream).shed(reason, now);
            rejection.into_response()
        }
        Verdict::Admit | Verdict::WouldShed(_) => {
            let body = Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync();
            // A `never` (or unknown) stream named in the body meets its class cap here, as
            // one named in a header does before its body is read.
            let mut reserved = None;
            let never = matches!(
                decision.rule,
                crate::admission::Rule::NeverShed | crate::admission::Rule::UnknownStream
            );
            let class = policy.class_of(stream);
            if never && capped(&shared, policy, class) {
                match hold_for_room(&shared, &snapshot, stream, class).await {
                    Ok(guard) => reserved = guard,
                    Err(response) => return response,
                }
            }
            forward(
                shared.clone(),
                inner,
                Arc::clone(&snapshot),
                stream,
                Request::from_parts(parts, body),
                reserved,
            )
            .await
        }
    }
}

/// Forwards an admitted request, counting it in flight until its response body ends.
async fn forward<S>(
    shared: Arc<Shared>,
    inner: S,
    snapshot: Arc<Snapshot>,
    stream: Option<StreamId>,
    req: Request<ForwardBody>,
    reserved: Option<ClassGuard>,
) -> Response<Body>
where
    S: Service<Request<ForwardBody>, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
{
    let class = snapshot.policy.class_of(stream);
    let counts = snapshot.metrics.counts(stream);
    counts.accepted((shared.sources.clock)());
    let guard = (
        shared.pressure.start(),
        reserved.unwrap_or_else(|| shared.classes.start(class)),
        counts.start(),
    );
    // Boxed as a `Send` trait object here, where `S::Future: Send` is known; awaiting the
    // generic future directly trips rustc's higher-ranked `Send` inference.
    let call: Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>> =
        Box::pin(inner.oneshot(req));
    let response = match call.await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let m = &snapshot.metrics;
    match response.extensions().get::<UpstreamOutcome>() {
        Some(UpstreamOutcome::Answered { latency }) => {
            // An upstream 5xx is often fast (a failing dependency, a 503 of its own) and
            // says nothing about how long served requests take: not a latency sample.
            if !response.status().is_server_error() {
                shared.pressure.record_latency(*latency);
            }
            m.global().observe_latency(*latency);
            m.request(stream, Outcome::Forwarded);
        }
        Some(UpstreamOutcome::TimedOut { after }) => {
            // A timeout is overload: it counts as a sample at least as slow as the timeout.
            shared.pressure.record_latency(*after);
            m.global()
                .proxy_error(crate::metrics::ErrorKind::GatewayTimeout);
            m.request(stream, Outcome::UpstreamError);
        }
        Some(UpstreamOutcome::Failed(kind)) => {
            m.global().proxy_error(*kind);
            m.request(stream, kind.outcome());
        }
        None => m.request(stream, Outcome::UpstreamError),
    }
    response.map(|body| GuardedBody::new(body, guard).boxed_unsync())
}

/// A capped `never` class stayed over its budget for the whole wait: 503 + `Retry-After`.
fn cap_exceeded(shared: &Shared, snapshot: &Snapshot, stream: Option<StreamId>) -> Response<Body> {
    let policy = &snapshot.policy;
    let now = (shared.sources.clock)();
    let pressure = shared.pressure.pressure();
    let decision = crate::admission::Decision::cap_exceeded(policy, pressure);
    let m = &snapshot.metrics;
    m.shed(stream, None, decision.verdict);
    m.request(stream, Outcome::Shed);
    m.counts(stream).shed(ShedReason::Budget, now);
    let name = stream.map(|id| policy.stream_policy(id).name.as_str());
    tracing::warn!(
        stream = name.unwrap_or(crate::metrics::UNKNOWN_STREAM),
        class = policy.class_of(stream).as_str(),
        "capped class stayed over its budget for its whole wait: 503, the sender retries"
    );
    Rejection::Shed {
        explanation: Explanation::new(policy, name, &decision),
        retry_after: retry_after(pressure, (shared.sources.draw)(), policy.retry_after()),
    }
    .into_response()
}

/// Answers a request the proxy refuses before forwarding, counting it.
fn reject(snapshot: &Snapshot, stream: Option<StreamId>, rejection: Rejection) -> Response<Body> {
    if let Some(kind) = rejection.error_kind() {
        snapshot.metrics.global().proxy_error(kind);
    }
    snapshot.metrics.request(stream, Outcome::Rejected);
    rejection.into_response()
}

// === impl ResponseFuture ===

/// The response future of [`Admission`]: ready for answers known in `call`, boxed for the
/// rest (they await the body and the upstream).
pub struct ResponseFuture {
    kind: Kind,
}

enum Kind {
    Ready(Option<Response<Body>>),
    Boxed(Pin<Box<dyn Future<Output = Response<Body>> + Send>>),
}

impl ResponseFuture {
    fn ready(response: Response<Body>) -> Self {
        ResponseFuture {
            kind: Kind::Ready(Some(response)),
        }
    }

    fn boxed(f: impl Future<Output = Response<Body>> + Send + 'static) -> Self {
        ResponseFuture {
            kind: Kind::Boxed(Box::pin(f)),
        }
    }
}

impl Shared {
    fn load(&self) -> Load {
        self.classes
            .load(self.pressure.inflight(), self.settings.capacity)
    }

    /// Takes a place in `class` if it is under its budget or capacity is idle: the check and
    /// the increment are one atomic step on the class count.
    fn try_reserve(&self, class: Class, cap: &crate::policy::ClassPolicy) -> Option<ClassGuard> {
        let limit = cap.limit(self.settings.capacity).unwrap_or(u32::MAX);
        let count = &self.classes.inflight[class.index()];
        let mut current = count.load(Ordering::Relaxed);
        loop {
            if current >= limit && self.pressure.inflight() >= self.settings.capacity {
                return None;
            }
            match count.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(ClassGuard {
                        load: Arc::clone(&self.classes),
                        class,
                    });
                }
                Err(seen) => current = seen,
            }
        }
    }
}

/// A `never` request whose class is capped (`budget` with `wait`) and over its budget waits
/// for room, up to the class's `wait`, and takes it by reserving a place in the class count
/// (so one freed place lets one waiter in, not all of them). `Err`: the wait ran out, and
/// the request is answered 503 + `Retry-After` (reason `budget`) — never dropped silently:
/// the sender keeps the event and retries.
async fn wait_for_room(
    shared: &Shared,
    policy: &crate::policy::Policy,
    class: Class,
) -> Result<ClassGuard, ()> {
    let cap = policy.class(class);
    let deadline = tokio::time::Instant::now() + cap.wait.unwrap_or_default();
    loop {
        let notified = shared.classes.room.notified();
        if let Some(guard) = shared.try_reserve(class, cap) {
            return Ok(guard);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return shared.try_reserve(class, cap).ok_or(());
        }
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().kind {
            Kind::Ready(r) => match r.take() {
                Some(r) => Poll::Ready(Ok(r)),
                None => Poll::Pending,
            },
            Kind::Boxed(f) => f.as_mut().poll(cx).map(Ok),
        }
    }
}
