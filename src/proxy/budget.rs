//! Class budgets on the request path: the check that a `never` request of a capped class
//! must wait, the wait for a reserved place in its upstream's class count
//! ([`crate::upstream::ClassLoad`]), and the 503 when it runs out.

use http::Response;

use super::Shared;
use super::shed::shed_outside_decide;
use crate::admission::{ShedReason, Verdict};
use crate::edge::rejection::Body;
use crate::policy::{Class, StreamId};
use crate::upstream::{ClassGuard, Routing, Upstream, UpstreamId};

/// Whether a `never` request of `class` bound to `up` must get a place under the class cap
/// first.
pub(super) fn capped(up: &Upstream, policy: &crate::policy::Policy, class: Class) -> bool {
    let cap = policy.class(class);
    cap.wait.is_some() && up.load().over_budget(class, cap)
}

/// A `never` request of a capped class over its budget at `upstream`: in warn mode (global or the
/// class's) it is counted as a would-shed and goes through; otherwise it waits for a
/// reserved place (`Ok`) or, when the wait runs out, gets its 503 answer (`Err`).
pub(super) async fn hold_for_room(
    shared: &Shared,
    upstream: UpstreamId,
    snapshot: &Routing,
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
    match wait_for_room(&snapshot.upstreams[upstream], policy, class).await {
        Ok(guard) => Ok(Some(guard)),
        Err(()) => Err(shed_outside_decide(
            shared,
            Some(upstream),
            snapshot,
            stream,
            ShedReason::Budget,
        )),
    }
}

/// Takes a place in `class` at `up` if the class is under its budget or `up`'s capacity is
/// idle.
fn try_reserve(
    up: &Upstream,
    class: Class,
    cap: &crate::policy::ClassPolicy,
) -> Option<ClassGuard> {
    let capacity = up.pressure.capacity();
    let limit = cap.limit(capacity).unwrap_or(u32::MAX);
    up.classes
        .try_start(class, limit, || up.pressure.inflight() >= capacity)
}

/// A `never` request whose class is capped (`budget` with `wait`) and over its budget waits
/// for room, up to the class's `wait`, and takes it by reserving a place in the class count
/// (so one freed place lets one waiter in, not all of them). `Err`: the wait ran out, and
/// the request is answered 503 + `Retry-After` (reason `budget`) — never dropped silently:
/// the sender keeps the event and retries.
async fn wait_for_room(
    up: &Upstream,
    policy: &crate::policy::Policy,
    class: Class,
) -> Result<ClassGuard, ()> {
    let cap = policy.class(class);
    let deadline = tokio::time::Instant::now() + cap.wait.unwrap_or_default();
    loop {
        let notified = up.classes.freed();
        if let Some(guard) = try_reserve(up, class, cap) {
            return Ok(guard);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return try_reserve(up, class, cap).ok_or(());
        }
    }
}
