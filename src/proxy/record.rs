//! The access log's stage: what the request says of itself when it comes in ([`Start`]), the
//! stages' [`Note`] carried in the response's extensions, and the entry handed to the writer
//! when the answer's head is ready. Nothing of it runs without `--access-log`. The policy
//! preview's shadow decisions are counted here too.

use std::sync::Arc;

use http::{Request, Response};

use super::Shared;
use super::future::ResponseFuture;
use crate::edge::rejection::Body;
use crate::live::store::Snapshot;
use crate::record::preview::Live;
use crate::record::tally::{Key, Side, band_name};
use crate::record::{AccessLog, Entry, Note};

/// What a request says of itself before anything is decided.
#[derive(Debug)]
pub(super) struct Start {
    id: u64,
    method: http::Method,
    target: http::Uri,
    peer: Option<std::net::IpAddr>,
    message_id: Option<http::HeaderValue>,
    declared: Option<u64>,
}

impl Start {
    pub(super) fn of<B>(log: &AccessLog, req: &Request<B>) -> Start {
        let headers = req.headers();
        Start {
            id: log.request_id(),
            method: req.method().clone(),
            target: req.uri().clone(),
            peer: req
                .extensions()
                .get::<crate::edge::serve::ClientInfo>()
                .map(|c| c.peer.ip()),
            message_id: crate::record::line::MESSAGE_ID_HEADERS
                .iter()
                .find_map(|h| headers.get(*h).cloned()),
            declared: headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse().ok()),
        }
    }
}

/// Awaits the answer, then hands its entry to the access log (when sampled).
pub(super) fn finish(
    shared: Arc<Shared>,
    log: Arc<AccessLog>,
    start: Start,
    snapshot: Arc<Snapshot>,
    answer: ResponseFuture,
) -> ResponseFuture {
    ResponseFuture::boxed(async move {
        let Ok(mut response) = answer.await;
        let note = response
            .extensions_mut()
            .remove::<Note>()
            .unwrap_or_default();
        let status = response.status();
        let outcome = note
            .outcome
            .unwrap_or_else(|| crate::record::line::outcome_of_status(status));
        let draw = if log.samples_all() {
            0.0
        } else {
            shared.sources().draw()
        };
        let Some(sample) = log.sampled(outcome, draw) else {
            return response;
        };
        let upstream = match response
            .extensions()
            .get::<crate::upstream::UpstreamOutcome>()
        {
            Some(crate::upstream::UpstreamOutcome::Answered { latency }) => Some(*latency),
            _ => None,
        };
        let at = note
            .decided
            .map_or_else(|| shared.sources().now(), |d| d.local);
        let response_bytes = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .or_else(|| http_body::Body::size_hint(response.body()).exact());
        let mut note = note;
        note.request_bytes = note.request_bytes.or(start.declared);
        log.submit(&Entry {
            id: start.id,
            at,
            peer: start.peer,
            method: Some(start.method),
            target: Some(start.target),
            message_id: start.message_id,
            snapshot,
            note,
            status: status.as_u16(),
            upstream,
            response_bytes,
            sample,
        });
        response
    })
}

impl Shared {
    /// Whether answers carry a [`Note`] (an access log is configured).
    pub(super) fn recording(&self) -> bool {
        self.records.log.is_some()
    }

    /// Puts `note` on `response` for the access log, when one is configured.
    pub(super) fn note(&self, response: &mut Response<Body>, note: impl FnOnce() -> Note) {
        if self.recording() {
            response.extensions_mut().insert(note());
        }
    }

    /// Decides `live`'s request again under the running preview's candidate, if one runs,
    /// and counts it in the metrics.
    pub(super) fn preview(&self, snapshot: &Snapshot, live: &Live<'_>) {
        let preview = self.records.preview.load();
        let Some(preview) = preview.as_deref() else {
            return;
        };
        if !preview.running(live.local) {
            return;
        }
        let counted = preview.shadow(live);
        count(snapshot, preview.candidate(), counted);
    }

    /// Counts a body that streamed through unread in the running preview, if one runs.
    pub(super) fn preview_unread(&self, snapshot: &Snapshot, stream: Option<&str>) {
        let preview = self.records.preview.load();
        let Some(preview) = preview.as_deref() else {
            return;
        };
        if !preview.running(self.sources().now()) {
            return;
        }
        let counted = preview.unread(stream);
        count(snapshot, preview.candidate(), counted);
    }
}

fn count(
    snapshot: &Snapshot,
    candidate: &crate::policy::Policy,
    (key, live, now): (Key, Side, Side),
) {
    let stream = key.stream.map_or(crate::policy::UNKNOWN_STREAM, |id| {
        candidate.stream_policy(id).name.as_str()
    });
    let area = key.area.map_or("none", |a| candidate.area(a).name.as_str());
    snapshot.metrics.global().preview_decision(
        stream,
        area,
        band_name(key.band),
        live.as_str(),
        now.as_str(),
    );
}
