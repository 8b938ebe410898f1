//! Reading a sheddable body: bounded in size and time, its facts extracted, the request's
//! stream and facts summarised, then the decision, and the answer or the forward.

use std::convert::Infallible;
use std::sync::Arc;

use std::borrow::Cow;

use bytes::Bytes;
use http::header::CONTENT_ENCODING;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use tower::Service;

use super::Shared;
use super::budget::{capped, hold_for_room};
use super::forward::{Delivery, forward, reject};
use super::memory::{Budgeted, Charge, OverBudget, Reservation};
use super::resolve::upstream_of;
use super::shed::shed_outside_decide;
use crate::BoxError;
use crate::admission::trust::{PackedPoint, judge};
use crate::admission::{
    DeviceHistory, FloorVerdict, NamedDevice, Reading, ShedReason, Untrusted, Verdict,
    assess_with_device, decide, schedule_floor,
};
use crate::edge::rejection::{Body, Explanation, Rejection, retry_after};
use crate::extract::coding::{DecodeError, decoded};
use crate::extract::{BodyState, Coordinates, EventTime};
use crate::metrics::{Fact, Outcome};
use crate::policy::Supersession;
use crate::record::preview::Live;
use crate::record::{Decided, Note};
use crate::upstream::{Routed, Routing, Target, Upstream};

/// Reads a body (a sheddable stream's, or one that names its own stream), decides, and
/// forwards or answers.
pub(super) async fn admit_sheddable<S, B>(
    shared: Arc<Shared>,
    inner: S,
    snapshot: Arc<Routing>,
    read_as: Reading,
    req: Request<B>,
) -> Response<Body>
where
    S: Service<Routed, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let settings = &shared.settings;
    let stream = read_as.known.flatten();
    let (parts, body) = req.into_parts();
    let limit = usize::try_from(settings.max_body).unwrap_or(usize::MAX);
    // The upstream the request goes to, when settled before its body is read: its stream is
    // known (a header, a fixed stream), its route names one, or no stream names an upstream
    // but `default` (so every stream the body may name goes to `default`). Its body is
    // charged to that upstream's share of the buffered bytes; a body that names its own
    // stream, on a route naming no upstream, is charged to the unrouted account until read.
    let route = read_as.route.map(|(i, _)| i);
    let policy = &snapshot.policy;
    let settled = (read_as.known.is_some()
        || route.is_some_and(|i| policy.routes()[i].upstream.is_some())
        || !policy.streams_leave_default())
    .then(|| upstream_of(&snapshot.upstreams, policy, route, stream));
    let charge = settled.map_or(Charge::Unrouted, |id| {
        Charge::Upstream(snapshot.upstreams[id].account.index())
    });
    // Held until the body has been forwarded (the end of this function) or refused.
    let reservation = Reservation::new(Arc::clone(&shared.buffers), charge);
    let read = tokio::time::timeout(
        settings.body_read_timeout,
        Limited::new(Budgeted::new(body, reservation.clone()), limit).collect(),
    );
    let bytes = match read.await {
        Err(_) => return reject(&shared, &snapshot, stream, None, Rejection::BodyTimeout),
        Ok(Err(e)) if e.is::<OverBudget>() => {
            // Shed before its decision, but offered all the same: its one arrival, at its
            // upstream when that is settled; otherwise at none (its stream, in the unread
            // body, would have said which).
            if let Some(upstream) = settled {
                snapshot.upstreams[upstream].pressure.arrive();
            }
            return shed_outside_decide(&shared, settled, &snapshot, stream, ShedReason::Memory);
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            let rejection = Rejection::PayloadTooLarge {
                limit: settings.max_body,
            };
            return reject(&shared, &snapshot, stream, None, rejection);
        }
        Ok(Err(e)) => {
            let rejection = Rejection::BadBody(format!("request body: {e}"));
            return reject(&shared, &snapshot, stream, None, rejection);
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };

    // A coded body (`Content-Encoding: gzip`) is read from its inflated bytes, bounded by
    // `--max-body` after inflation; the original bytes are what is forwarded.
    let codings: Vec<&[u8]> = parts
        .headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .map(http::HeaderValue::as_bytes)
        .collect();
    // A `Content_Encoding` twin is a second reading of the coding (a CGI upstream reads it
    // as the header itself): the body's facts are unreadable, never read one way.
    let twin_coding = parts
        .headers
        .keys()
        .any(|k| crate::extract::headers::is_twin(k.as_str(), b"content-encoding"));
    let decoded = if twin_coding {
        Err(DecodeError::Unreadable(
            "Content-Encoding stated twice (an underscore twin)".into(),
        ))
    } else {
        decoded(&codings, &bytes, settings.max_body)
    };
    let readable = match decoded {
        Ok(readable) => readable,
        Err(DecodeError::TooLarge { limit }) => {
            return reject(
                &shared,
                &snapshot,
                stream,
                None,
                Rejection::PayloadTooLarge { limit },
            );
        }
        Err(DecodeError::Unreadable(why)) => {
            // Its facts are unreadable (counted as `fact="body"` below); it is forwarded
            // as it came.
            tracing::debug!(%why, "coded body not read");
            Cow::Borrowed(&[][..])
        }
    };
    let policy = &snapshot.policy;
    let (stream, facts, named) = assess_with_device(
        policy,
        read_as,
        &parts.headers,
        parts.uri.query(),
        &readable,
    );
    drop(readable); // the inflated copy is not kept while the request is forwarded
    let m = &snapshot.metrics;
    if facts.body == BodyState::Opaque {
        m.opaque(route);
    }
    let sheddable = stream
        .is_some_and(|id| policy.stream_policy(id).supersession == Supersession::SelfSuperseding);
    if facts.ambiguous || twin_coding {
        m.unreadable(stream, route, Fact::Ambiguous);
    }
    if sheddable {
        if facts.body == BodyState::NotJson {
            m.unreadable(stream, route, Fact::Body);
        }
        if !matches!(facts.coordinates, Coordinates::Valid { .. }) {
            m.unreadable(stream, route, Fact::Coordinates);
        }
        if !matches!(facts.time, EventTime::At(_)) {
            m.unreadable(stream, route, Fact::Time);
        }
    }
    // The upstream the request goes to: its clock, pressure and budgets decide it.
    let upstream = upstream_of(&snapshot.upstreams, &snapshot.policy, route, stream);
    let up = &snapshot.upstreams[upstream];
    // Ages are judged against the upstream's clock when the local one is off by more than
    // the bound (docs/decision.md "Decision rule", step 4).
    let local_now = shared.sources().now();
    let now = up.skew.correct(local_now);
    // This request's one arrival ([`crate::pressure::PressureGauge::arrive`]), and the
    // pressure it is decided at. A schedule's floor raises pressure while its window is
    // open; a pin overrides both.
    let raw = up.pressure.admission_pressure();
    let pinned = up.pressure.is_pinned();
    let (pressure, schedule) = if pinned {
        (raw, None)
    } else {
        schedule_floor(policy, local_now, raw)
    };
    // The device the request names, for a sheddable stream: its history is the decision's
    // input (a device the table does not remember starts from a draw of its own), and the
    // decision goes back into the table, under one lock of its shard. A fix the device could
    // not have made is decided as naming none, and leaves the table as it was
    // (docs/decision.md "Devices", "What is trusted").
    let mut device = facts.device.filter(|_| sheddable);
    let mut untrusted =
        (sheddable && named == NamedDevice::Placeholder).then_some(Untrusted::Placeholder);
    let (draw, mut load) = (shared.sources().draw(), up.load());
    if device.is_some() {
        // The freshness floor of this fix: its route's or stream's `max_silence`, and the
        // floor's budget now.
        let max_silence = stream.and_then(|id| policy.max_silence(id, route));
        load.floor = up.freshness.floor(
            max_silence,
            policy.freshness_share(),
            load.capacity,
            local_now,
        );
    }
    let mut given: Option<DeviceHistory> = None;
    let mut decide_with = |history: Option<DeviceHistory>| {
        given = history;
        decide(policy, stream, &facts, now, pressure, draw, &load, history)
    };
    let mut decision = match device {
        None => decide_with(None),
        Some(id) => {
            let (decision, gap) = shared.devices.decide_with(id, local_now, |history| {
                let history =
                    history.unwrap_or_else(|| DeviceHistory::new(shared.sources().draw()));
                match judge(policy, &facts, now, history) {
                    Ok(history) => decide_with(Some(history)),
                    Err(why) => {
                        untrusted = Some(why);
                        decide_with(None)
                    }
                }
            });
            if let Some(gap) = gap {
                m.device_gap(decision.area, gap);
            }
            decision
        }
    };
    if let Some(why) = untrusted {
        m.device_untrusted(stream, why);
        if why == Untrusted::Implausible {
            // Its delivery is not the device's either.
            device = None;
        }
    }
    decision.schedule = schedule;
    if let Some(floor) = decision.floor {
        m.floor(stream, floor);
        if let (FloorVerdict::Denied, Some(history)) = (floor, &decision.device) {
            up.freshness.denied(&load.floor, history, local_now);
        }
    }
    shared.preview(
        &snapshot,
        &Live {
            stream: stream.map(|id| policy.stream_policy(id).name.as_str()),
            route: route.map(|i| policy.routes()[i].prefix.as_str()),
            upstream: &up.name,
            facts: &facts,
            now,
            local: local_now,
            pressure_raw: raw,
            pinned,
            draw,
            load,
            device: device.map(|id| (id, given)),
            verdict: decision.verdict,
        },
    );
    // The access log's note: the decision and every input it read.
    let note = shared.recording().then(|| Note {
        stream,
        upstream: Some(upstream),
        outcome: None,
        reason: None,
        rule: Some(decision.rule),
        facts: Some(facts),
        decided: Some(Decided {
            decision,
            now,
            local: local_now,
            pressure_raw: raw,
            pinned,
            draw,
            load,
            buffered: shared.buffers.used(),
            history: given,
        }),
        device: match named {
            NamedDevice::Id(text) if sheddable => Some(text.into_boxed_str()),
            _ => None,
        },
        device_untrusted: untrusted,
        request_bytes: Some(bytes.len() as u64),
    });
    m.shed(stream, decision.area, decision.verdict);
    if sheddable && matches!(decision.verdict, Verdict::Admit | Verdict::WouldShed(_)) {
        m.admitted(stream, decision.area);
    }
    if let Some(age) = decision.age_ms {
        m.event_age(stream, age);
    }
    if decision.verdict == Verdict::Shed(ShedReason::Stale) && up.skew.wants_probe(local_now) {
        // Every answer stale and no recent `Date` to tell a backlog from a clock that is
        // ahead: ask the upstream for its clock, off the request path.
        up.metrics.clock_probes.increment(1);
        tokio::spawn(probe_clock(
            Arc::clone(&shared),
            inner.clone(),
            Arc::clone(up),
        ));
    }
    if decision.implausible_time {
        m.unreadable(stream, route, Fact::ImplausibleTime);
    }
    let name = stream.map(|id| policy.stream_policy(id).name.as_str());
    tracing::debug!(
        stream = name.unwrap_or(crate::policy::UNKNOWN_STREAM),
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
            let explanation = Explanation::new(policy, name, upstream, &decision);
            let rejection = if reason.superseded() {
                Rejection::Stale {
                    reason,
                    explanation,
                    status: policy.stale_status(),
                    success_body: policy.stale_body(route, stream),
                }
            } else {
                let secs = retry_after(pressure, shared.sources().draw(), policy.retry_after());
                Rejection::Shed {
                    explanation,
                    retry_after: secs,
                }
            };
            m.request(stream, Some(upstream), Outcome::Shed);
            m.counts(stream).shed(reason, local_now);
            let mut response = rejection.into_response();
            if let Some(mut note) = note {
                (note.outcome, note.reason) = (Some(Outcome::Shed), Some(reason.as_str()));
                response.extensions_mut().insert(note);
            }
            response
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
            if never && capped(up, policy, class) {
                match hold_for_room(&shared, upstream, &snapshot, stream, class).await {
                    Ok(guard) => reserved = guard,
                    Err(response) => return response,
                }
            }
            // A device's fix the upstream takes ends its silence (and is its newest
            // delivered, with its position, if newer); a floor admission holds a place in the
            // floor's budget until its answer ends.
            let delivery = device.map(|id| Delivery {
                id,
                at: match facts.time {
                    crate::extract::EventTime::At(at) => Some(at),
                    _ => None,
                },
                position: PackedPoint::of(facts.coordinates),
                floor: (decision.rule == crate::admission::Rule::Freshness)
                    .then(|| up.freshness.start(local_now)),
            });
            let mut parts = parts;
            if let Some(note) = note {
                parts.extensions.insert(note);
            }
            let response = forward(
                shared.clone(),
                inner,
                Arc::clone(&snapshot),
                upstream,
                stream,
                Request::from_parts(parts, body),
                None,
                reserved,
                delivery,
            )
            .await;
            // The body has been sent: its bytes go back to the budget.
            drop(reservation);
            response
        }
    }
}

/// Sends `OPTIONS *` (RFC 9110 section 9.3.7: a request about the server as a whole, its
/// "ping") to `upstream` and samples its clock from the answer's `Date`. Not a latency
/// sample and not a request of any stream.
async fn probe_clock<S>(shared: Arc<Shared>, inner: S, up: Arc<Upstream>)
where
    S: Service<Routed, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
{
    let body = http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut req = Request::new(body);
    *req.method_mut() = http::Method::OPTIONS;
    *req.uri_mut() = http::Uri::from_static("*");
    let routed = Routed {
        target: Target(Arc::clone(&up)),
        progress: None,
        request: req,
    };
    let call: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, Infallible>> + Send>,
    > = Box::pin(tower::ServiceExt::oneshot(inner, routed));
    let Ok(response) = call.await;
    if response
        .extensions()
        .get::<crate::upstream::UpstreamOutcome>()
        .is_some_and(|o| matches!(o, crate::upstream::UpstreamOutcome::Answered { .. }))
    {
        let date = response.headers().get(http::header::DATE);
        up.sample_clock(shared.sources(), date);
    }
}
