//! A shed decided outside [`crate::admission::decide`] (a capped class's wait or the buffered
//! bytes ran out): its 503 answer, counted and logged like any shed.

use http::Response;

use super::Shared;
use crate::admission::ShedReason;
use crate::edge::rejection::{Body, Explanation, Rejection, retry_after};
use crate::metrics::Outcome;
use crate::policy::StreamId;
use crate::record::Note;
use crate::upstream::{Routing, UpstreamId};

/// Sheds a request for `reason`, decided outside [`crate::admission::decide`] (a capped
/// class's wait ran out: [`ShedReason::Budget`]; the buffered bytes ran out:
/// [`ShedReason::Memory`]): 503 + `Retry-After` with the explanation (at the pressure of
/// `upstream`, the request's), counted like any shed, and logged. The sender keeps the
/// event and resends. `upstream` is `None` for a memory shed before the body said where the
/// request goes: counted with `upstream="none"`, explained as bound for `none`, its
/// `Retry-After` drawn at the default upstream's pressure.
pub(super) fn shed_outside_decide(
    shared: &Shared,
    upstream: Option<UpstreamId>,
    snapshot: &Routing,
    stream: Option<StreamId>,
    reason: ShedReason,
) -> Response<Body> {
    let policy = &snapshot.policy;
    let name = stream.map(|id| policy.stream_policy(id).name.as_str());
    let logged = name.unwrap_or(crate::policy::UNKNOWN_STREAM);
    match reason {
        ShedReason::Budget => tracing::warn!(
            stream = logged,
            class = policy.class_of(stream).as_str(),
            "capped class stayed over its budget for its whole wait: 503, the sender retries"
        ),
        ShedReason::Memory => tracing::debug!(
            stream = logged,
            limit = shared.buffers.limit(),
            "buffered body bytes over --max-buffered-bytes: 503, the sender retries"
        ),
        ShedReason::Disabled
        | ShedReason::Stale
        | ShedReason::Superseded
        | ShedReason::Pressure => {}
    }
    let pressure = snapshot.upstreams[upstream.unwrap_or(UpstreamId::DEFAULT)]
        .pressure
        .pressure();
    let decision = crate::admission::Decision::shed_by(reason, policy, pressure);
    let m = &snapshot.metrics;
    m.shed(stream, None, decision.verdict);
    m.request(stream, upstream, Outcome::Shed);
    m.counts(stream).shed(reason, shared.sources().now());
    let mut explanation = Explanation::new(
        policy,
        name,
        upstream.unwrap_or(UpstreamId::DEFAULT),
        &decision,
    );
    if upstream.is_none() {
        crate::metrics::NO_UPSTREAM.clone_into(&mut explanation.upstream);
    }
    let mut response = Rejection::Shed {
        explanation,
        retry_after: retry_after(pressure, shared.sources().draw(), policy.retry_after()),
    }
    .into_response();
    shared.note(&mut response, || Note {
        stream,
        upstream,
        outcome: Some(Outcome::Shed),
        reason: Some(reason.as_str()),
        rule: Some(decision.rule),
        ..Note::default()
    });
    response
}
