//! Forwarding: a body that streams through unread, in-flight accounting held until the
//! response body ends, and the upstream's outcome turned into a pressure sample and counts.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use tower::{Service, ServiceExt};

use super::Shared;
use super::body::{GuardedBody, TimedBody};
use crate::BoxError;
use crate::edge::rejection::{Body, Rejection};
use crate::live::store::Snapshot;
use crate::metrics::Outcome;
use crate::policy::StreamId;
use crate::record::Note;
use crate::upstream::{
    BodyProgress, ClassGuard, ForwardBody, Routed, Routing, Target, UpstreamId, UpstreamOutcome,
};

/// A request whose body streams to the upstream unread, bounded in size and time, and the
/// body's progress (for the upstream timeout, [`BodyProgress`]).
pub(super) fn stream_through<B>(
    shared: &Shared,
    req: Request<B>,
) -> (Request<ForwardBody>, BodyProgress)
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let progress = BodyProgress::default();
    let limit = usize::try_from(shared.settings.max_body).unwrap_or(usize::MAX);
    let body = TimedBody::new(
        Limited::new(body, limit).boxed_unsync(),
        shared.settings.body_read_timeout,
        progress.clone(),
    )
    .boxed_unsync();
    (Request::from_parts(parts, body), progress)
}

/// An admitted fix of a device: what a 2xx from the upstream tells the device table.
#[derive(Debug)]
pub(super) struct Delivery {
    /// The device.
    pub(super) id: crate::extract::DeviceId,
    /// The fix's (newest) event time, if readable: the device's newest delivered, if newer.
    pub(super) at: Option<crate::clock::UnixMillis>,
    /// Where the fix was, if readable: kept with its time, for the next fix's plausibility.
    pub(super) position: Option<crate::admission::trust::PackedPoint>,
    /// Held while a floor admission is in flight ([`crate::upstream::FreshnessBudget`]).
    pub(super) floor: Option<crate::upstream::FloorGuard>,
}

/// Forwards an admitted request to `upstream` (through `inner`, which gets it beside its
/// [`Target`] in a [`Routed`]), counting it in flight there until its response body ends; its
/// streamed body's `progress` goes with it. A fix of a device (`delivery`) the upstream
/// answers 2xx ends the device's silence.
#[expect(clippy::too_many_arguments, reason = "a request's parts, by name")]
pub(super) async fn forward<S>(
    shared: Arc<Shared>,
    inner: S,
    snapshot: Arc<Routing>,
    upstream: UpstreamId,
    stream: Option<StreamId>,
    req: Request<ForwardBody>,
    progress: Option<BodyProgress>,
    reserved: Option<ClassGuard>,
    delivery: Option<Delivery>,
) -> Response<Body>
where
    S: Service<Routed, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
{
    let mut req = req;
    let up = &snapshot.upstreams[upstream];
    // The access log's note: the decision's, else a body streamed through unread.
    let mut note = shared.recording().then(|| {
        req.extensions_mut()
            .remove::<Note>()
            .unwrap_or_else(|| Note {
                stream,
                rule: Some(if stream.is_some() {
                    crate::admission::Rule::NeverShed
                } else {
                    crate::admission::Rule::UnknownStream
                }),
                ..Note::default()
            })
    });
    if let Some(note) = &mut note {
        note.upstream = Some(upstream);
    }
    let class = snapshot.policy.class_of(stream);
    let counts = snapshot.metrics.counts(stream);
    counts.accepted(shared.sources().now());
    let mut delivery = delivery;
    let guard = (
        up.pressure.start(),
        reserved.unwrap_or_else(|| up.classes.start(class)),
        counts.start(),
        delivery.as_mut().and_then(|d| d.floor.take()),
    );
    let routed = Routed {
        target: Target(Arc::clone(up)),
        progress,
        request: req,
    };
    // Boxed as a `Send` trait object here, where `S::Future: Send` is known; awaiting the
    // generic future directly trips rustc's higher-ranked `Send` inference.
    let call: Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>> =
        Box::pin(inner.oneshot(routed));
    let m = &snapshot.metrics;
    let answered = match snapshot.policy.class(class).max_request_time {
        None => call.await,
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(answered) => answered,
            Err(_) => {
                // The upstream request is dropped with the call; the slot, the class's
                // budget share and the stream's in-flight count are freed now, and the wait
                // is a latency sample as slow as the limit.
                drop(guard);
                up.pressure
                    .record_latency(snapshot.policy.cost_slot(stream), limit);
                let mut response = reject(
                    &shared,
                    &snapshot,
                    stream,
                    Some(upstream),
                    Rejection::ClassTimeout {
                        class: class.as_str(),
                        limit,
                    },
                );
                if let Some(mut note) = note.take() {
                    note.outcome = Some(Outcome::UpstreamError);
                    note.reason = Some("class-timeout");
                    response.extensions_mut().insert(note);
                }
                return response;
            }
        },
    };
    let response = match answered {
        Ok(r) => r,
        Err(never) => match never {},
    };
    if let Some(Delivery {
        id, at, position, ..
    }) = delivery
        && response.status().is_success()
        && matches!(
            response.extensions().get::<UpstreamOutcome>(),
            Some(UpstreamOutcome::Answered { .. } | UpstreamOutcome::AnsweredEarly)
        )
    {
        let local = shared.sources().now();
        let corrected = up.skew.correct(local);
        if let Some(silence) = shared.devices.delivered(id, at, position, corrected, local) {
            m.silence(stream, silence);
        }
    }
    let mut response = response;
    let outcome = match response.extensions().get::<UpstreamOutcome>() {
        Some(UpstreamOutcome::Answered { latency }) => {
            let date = response.headers().get(http::header::DATE);
            up.sample_clock(shared.sources(), date);
            // Only an answer that served the request measures how long serving takes. A 5xx
            // is often fast (a failing dependency, a 503 of its own), and so is a 4xx (a
            // signature or token refused once the body is read): one fast 401 after a quiet
            // spell took the learned no-load latency from 21.5 to 1.5 ms (docs/pressure.md
            // "Samples"). Neither is a latency sample.
            let status = response.status();
            if status.is_success() || status.is_redirection() {
                up.pressure
                    .record_latency(snapshot.policy.cost_slot(stream), *latency);
            }
            up.read_load_report(response.headers());
            up.metrics.observe_latency(*latency);
            (Outcome::Forwarded, None)
        }
        Some(UpstreamOutcome::AnsweredEarly) => {
            let date = response.headers().get(http::header::DATE);
            up.sample_clock(shared.sources(), date);
            up.read_load_report(response.headers());
            (Outcome::Forwarded, None)
        }
        Some(UpstreamOutcome::TimedOut { after }) => {
            // A timeout is overload: it counts as a sample at least as slow as the timeout.
            up.pressure
                .record_latency(snapshot.policy.cost_slot(stream), *after);
            let kind = crate::metrics::ErrorKind::GatewayTimeout;
            m.global().proxy_error(kind);
            (Outcome::UpstreamError, Some(kind.as_str()))
        }
        Some(UpstreamOutcome::Failed(kind)) => {
            m.global().proxy_error(*kind);
            (kind.outcome(), Some(kind.as_str()))
        }
        None => (Outcome::UpstreamError, None),
    };
    m.request(stream, Some(upstream), outcome.0);
    if let Some(mut note) = note {
        (note.outcome, note.reason) = (Some(outcome.0), outcome.1);
        response.extensions_mut().insert(note);
    }
    response.map(|body| GuardedBody::new(body, guard).boxed_unsync())
}

/// Answers a request the proxy refuses or gives up on, counting it at `upstream` (`None`:
/// refused before one was chosen for it): outcome `rejected` for the client's faults,
/// `upstream_error` for the upstream's (by [`crate::metrics::ErrorKind::outcome`]).
pub(super) fn reject(
    shared: &Shared,
    snapshot: &Snapshot,
    stream: Option<StreamId>,
    upstream: Option<UpstreamId>,
    rejection: Rejection,
) -> Response<Body> {
    let outcome = match rejection.error_kind() {
        Some(kind) => {
            snapshot.metrics.global().proxy_error(kind);
            kind.outcome()
        }
        None => Outcome::Rejected,
    };
    snapshot.metrics.request(stream, upstream, outcome);
    let reason = rejection.slug();
    let mut response = rejection.into_response();
    shared.note(&mut response, || Note {
        stream,
        outcome: Some(outcome),
        reason: Some(reason),
        ..Note::default()
    });
    response
}
