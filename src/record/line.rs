//! One access-log line: what the proxy hands over when it answers ([`Entry`], unformatted), and
//! the JSON line it becomes on the writer thread ([`Line`], also what `shedgate replay` reads
//! back). docs/operations.md "Access log" lists every field.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::admission::{Decision, DeviceHistory, Load, Rule, Verdict};
use crate::clock::UnixMillis;
use crate::extract::{BodyState, Coordinates, EventTime, Facts};
use crate::live::store::Snapshot;
use crate::metrics::Outcome;
use crate::policy::StreamId;
use crate::pressure::Pressure;

/// What the request path's stages know of one request when it is answered, carried in the
/// response's extensions to the access log (only while one is configured).
#[derive(Debug, Clone, Default)]
pub struct Note {
    /// The stream, `None` when unknown or not yet known.
    pub stream: Option<StreamId>,
    /// The outcome (`None`: read from the status).
    pub outcome: Option<Outcome>,
    /// Why it was not forwarded, or how forwarding failed: a shed reason
    /// ([`crate::admission::ShedReason::as_str`]), a rejection
    /// ([`crate::edge::rejection::Rejection::slug`]) or an upstream error kind.
    pub reason: Option<&'static str>,
    /// The rule that decided it; `never-shed` and `unknown-stream` for a body streamed
    /// through unread.
    pub rule: Option<Rule>,
    /// The body's facts, when it was read.
    pub facts: Option<Facts>,
    /// The decision and every input it read, when [`crate::admission::decide`] ran.
    pub decided: Option<Decided>,
    /// The device id as the request states it, for the keyed hash (never written as is).
    pub device: Option<Box<str>>,
    /// Request body bytes: read, or declared by `Content-Length` for a body streamed through.
    pub request_bytes: Option<u64>,
}

/// A decision with the inputs it read that the facts do not hold: what `shedgate replay`
/// passes to [`crate::admission::decide`] again.
#[derive(Debug, Clone, Copy)]
pub struct Decided {
    /// The decision (its pressure is the one decided at: a schedule's floor included).
    pub decision: Decision,
    /// `now` as the decision read it: the local clock, corrected by the upstream's `Date`
    /// when the two disagree (docs/decision.md "Decision rule", step 4).
    pub now: UnixMillis,
    /// The local clock at the decision.
    pub local: UnixMillis,
    /// The gauge's pressure before any schedule's floor.
    pub pressure_raw: Pressure,
    /// Whether an operator had pinned the pressure (schedules do not apply then).
    pub pinned: bool,
    /// The random draw, uniform in `[0, 1)`.
    pub draw: f64,
    /// In flight per class and in total, and the capacity, as the budgets read them.
    pub load: Load,
    /// Sheddable body bytes buffered at the decision.
    pub buffered: u64,
    /// The device's history the decision was given.
    pub history: Option<DeviceHistory>,
}

/// One answered request, as handed to the writer thread: [`Line`] is made from it there.
#[derive(Debug)]
pub struct Entry {
    /// The request id (`RequestIds`).
    pub id: u64,
    /// When it was answered (the decision's local clock, when one was made).
    pub at: UnixMillis,
    /// The TCP peer.
    pub peer: Option<IpAddr>,
    /// The method.
    pub method: http::Method,
    /// The request target: its path gives the route; neither path nor query is written.
    pub target: http::Uri,
    /// The sender's message id (`webhook-id`, else `ce-id`).
    pub message_id: Option<http::HeaderValue>,
    /// The policy it was decided under.
    pub snapshot: Arc<Snapshot>,
    /// What the stages noted.
    pub note: Note,
    /// The status answered.
    pub status: u16,
    /// The upstream's answer time to its response head, when the upstream answered.
    pub upstream: Option<std::time::Duration>,
    /// The response body's `Content-Length`, when it states one.
    pub response_bytes: Option<u64>,
    /// The sampling rate the line was kept at, `(0, 1]`.
    pub sample: f64,
}

/// The device history as a line states it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistoryLine {
    /// [`DeviceHistory::credit`].
    pub credit: f64,
    /// [`DeviceHistory::since_admitted_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_admitted_ms: Option<i64>,
    /// [`DeviceHistory::interval_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<i64>,
    /// [`DeviceHistory::newest_delivered`], unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_delivered_ms: Option<i64>,
}

impl From<DeviceHistory> for HistoryLine {
    fn from(h: DeviceHistory) -> Self {
        HistoryLine {
            credit: h.credit,
            since_admitted_ms: h.since_admitted_ms,
            interval_ms: h.interval_ms,
            newest_delivered_ms: h.newest_delivered.map(|t| t.0),
        }
    }
}

impl From<HistoryLine> for DeviceHistory {
    fn from(h: HistoryLine) -> Self {
        DeviceHistory {
            credit: h.credit,
            since_admitted_ms: h.since_admitted_ms,
            interval_ms: h.interval_ms,
            newest_delivered: h.newest_delivered_ms.map(UnixMillis),
        }
    }
}

/// [`Load`] as a line states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadLine {
    /// In flight per class: `critical`, `important`, `best-effort` ([`crate::policy::Class`]).
    pub class_inflight: [u32; 3],
    /// In flight in total.
    pub total: u32,
    /// The upstream's in-flight capacity.
    pub capacity: u32,
}

/// One access-log line (JSON). Optional fields are left out when they do not apply; strings
/// borrow from the text they were read from. Field by field in docs/operations.md "Access
/// log".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line<'a> {
    /// RFC 3339 UTC, milliseconds: when the request was decided (or answered, without a
    /// decision).
    #[serde(borrow)]
    pub time: Cow<'a, str>,
    /// The proxy's own request id: 16 hex digits, unique per replica.
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    /// The sender's message id (`webhook-id`, else `ce-id`): the same on every retry.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Cow<'a, str>>,
    /// The replica that answered (`--replica`).
    #[serde(borrow)]
    pub replica: Cow<'a, str>,
    /// The TCP peer, truncated to its /24 (IPv4) or /48 (IPv6) unless
    /// `--access-log-full-peer`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<Cow<'a, str>>,
    /// The method.
    #[serde(borrow)]
    pub method: Cow<'a, str>,
    /// The route's prefix, when a route matched (never the path itself).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Cow<'a, str>>,
    /// The stream, when the policy names it.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Cow<'a, str>>,
    /// The stream's priority class.
    #[serde(borrow)]
    pub class: Cow<'a, str>,
    /// The status answered.
    pub status: u16,
    /// `forwarded`, `shed`, `rejected` or `upstream_error`.
    #[serde(borrow)]
    pub outcome: Cow<'a, str>,
    /// The shed reason, rejection or upstream error.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Cow<'a, str>>,
    /// The rule that decided.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<Cow<'a, str>>,
    /// Warn mode: the reason it would have been shed for (it was forwarded).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub would_shed: Option<Cow<'a, str>>,
    /// The policy version (content hash) it was decided under.
    #[serde(borrow)]
    pub policy: Cow<'a, str>,
    /// The rate this line was kept at: it stands for `1 / sample` requests like it.
    pub sample: f64,
    /// `json`, `params`, `opaque`, `not-json`, or `unread` (streamed through).
    #[serde(borrow)]
    pub body: Cow<'a, str>,
    /// A fact was stated twice, differently.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ambiguous: bool,
    /// The deciding event's coordinates: `valid`, `missing` or `invalid` (read bodies).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub points: Option<Cow<'a, str>>,
    /// Their resolution-4 H3 cell (never the coordinates).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<Cow<'a, str>>,
    /// The configured area the cell is in.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub area: Option<Cow<'a, str>>,
    /// The rank decided at (the area's, or the default rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u8>,
    /// The deciding event's time, `read`, `missing` or `invalid` (read bodies): the newest
    /// of a batch.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<Cow<'a, str>>,
    /// That time, unix milliseconds, when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_ms: Option<i64>,
    /// Its age at the decision, milliseconds (negative: ahead of the clock); absent when not
    /// believed (more than a day off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<i64>,
    /// The pressure decided at, schedule floor included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<f64>,
    /// The gauge's pressure before any schedule's floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_raw: Option<f64>,
    /// An operator had pinned the pressure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// The schedule whose floor raised the pressure.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Cow<'a, str>>,
    /// The shed probability at the rank and pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// The random draw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw: Option<f64>,
    /// The correction of the local clock by the upstream's `Date`, milliseconds (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<i64>,
    /// In flight per class, in total, and the capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadLine>,
    /// Sheddable body bytes buffered at the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffered_bytes: Option<u64>,
    /// The device, keyed-hashed (`--access-log-secret-file`): 16 hex digits. Absent
    /// without a secret.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Cow<'a, str>>,
    /// The device's history the decision was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_history: Option<HistoryLine>,
    /// The device's credit after the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credit_after: Option<f64>,
    /// The upstream's status, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// The upstream's time to its response head, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ms: Option<f64>,
    /// Request body bytes (read, or as declared for a body streamed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    /// Response body bytes, as its `Content-Length` states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_bytes: Option<u64>,
}

/// How a line names a body state.
pub fn body_name(state: BodyState) -> &'static str {
    match state {
        BodyState::Json => "json",
        BodyState::Params => "params",
        BodyState::Opaque => "opaque",
        BodyState::NotJson => "not-json",
        BodyState::Unread => "unread",
    }
}

/// The body state a line names (`None`: not a name [`body_name`] writes).
pub fn parse_body(name: &str) -> Option<BodyState> {
    Some(match name {
        "json" => BodyState::Json,
        "params" => BodyState::Params,
        "opaque" => BodyState::Opaque,
        "not-json" => BodyState::NotJson,
        "unread" => BodyState::Unread,
        _ => return None,
    })
}

/// The outcome named by a line (`None`: not a name [`Outcome::as_str`] writes).
pub fn parse_outcome(name: &str) -> Option<Outcome> {
    Outcome::ALL.into_iter().find(|o| o.as_str() == name)
}

/// The outcome of an answer the stages noted none for: from its status.
pub fn outcome_of_status(status: http::StatusCode) -> Outcome {
    match status.as_u16() {
        502 | 504 => Outcome::UpstreamError,
        503 => Outcome::Shed,
        400..=499 if status != http::StatusCode::TOO_MANY_REQUESTS => Outcome::Rejected,
        _ => Outcome::Forwarded,
    }
}

/// How the proxy's stages and the line turn into each other: what [`Entry::line`] needs that
/// the entry does not carry.
#[derive(Debug, Clone)]
pub struct Format {
    /// `--replica`.
    pub replica: Arc<str>,
    /// `--access-log-full-peer`.
    pub full_peer: bool,
    /// The device key (`--access-log-secret-file`).
    pub device_key: Option<super::privacy::DeviceKey>,
}

impl Entry {
    /// The line for this entry, as JSON text with its newline appended to `out`.
    pub fn write_line(&self, format: &Format, out: &mut Vec<u8>) {
        let id = format!("{:016x}", self.id);
        let time = rfc3339(self.at);
        let peer = self
            .peer
            .map(|ip| super::privacy::peer_text(ip, format.full_peer));
        let device = match (&format.device_key, &self.note.device) {
            (Some(key), Some(text)) => Some(Cow::Owned(key.hash(text))),
            _ => None,
        };
        let line = self.line(format, &id, &time, peer.as_deref(), device);
        if serde_json::to_writer(&mut *out, &line).is_ok() {
            out.push(b'\n');
        }
    }

    fn line<'s>(
        &'s self,
        format: &'s Format,
        id: &'s str,
        time: &'s str,
        peer: Option<&'s str>,
        device: Option<Cow<'s, str>>,
    ) -> Line<'s> {
        let policy = &self.snapshot.policy;
        let note = &self.note;
        let stream = note.stream.map(|id| policy.stream_policy(id).name.as_str());
        let route = policy
            .route_index(&crate::policy::path::route_path(self.target.path()))
            .map(|i| policy.routes()[i].prefix.as_str());
        let outcome = note.outcome.unwrap_or_else(|| {
            outcome_of_status(http::StatusCode::from_u16(self.status).unwrap_or_default())
        });
        let upstream_status = self.upstream.map(|_| self.status);
        let mut line = Line {
            time: Cow::Borrowed(time),
            id: Cow::Borrowed(id),
            message_id: self
                .message_id
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .map(|v| Cow::Borrowed(truncate(v, MAX_MESSAGE_ID))),
            replica: Cow::Borrowed(&format.replica),
            peer: peer.map(Cow::Borrowed),
            method: Cow::Borrowed(self.method.as_str()),
            route: route.map(Cow::Borrowed),
            stream: stream.map(Cow::Borrowed),
            class: Cow::Borrowed(policy.class_of(note.stream).as_str()),
            status: self.status,
            outcome: Cow::Borrowed(outcome.as_str()),
            reason: note.reason.map(Cow::Borrowed),
            rule: note.rule.map(|r| Cow::Borrowed(r.as_str())),
            would_shed: None,
            policy: Cow::Borrowed(policy.version()),
            sample: self.sample,
            body: Cow::Borrowed(body_name(note.facts.map_or(BodyState::Unread, |f| f.body))),
            ambiguous: note.facts.is_some_and(|f| f.ambiguous),
            points: None,
            cell: None,
            area: None,
            rank: None,
            event_time: None,
            event_ms: None,
            age_ms: None,
            pressure: None,
            pressure_raw: None,
            pinned: false,
            schedule: None,
            probability: None,
            draw: None,
            clock_offset_ms: None,
            load: None,
            buffered_bytes: None,
            device,
            device_history: None,
            credit_after: None,
            upstream_status,
            upstream_ms: self.upstream.map(|d| d.as_secs_f64() * 1000.0),
            request_bytes: note.request_bytes,
            response_bytes: self.response_bytes,
        };
        if let Some(facts) = note.facts {
            let (points, cell) = match facts.coordinates {
                Coordinates::Valid { lat, lon } => (
                    "valid",
                    h3o::LatLng::new(lat, lon)
                        .ok()
                        .map(|ll| ll.to_cell(crate::policy::AREA_RESOLUTION).to_string()),
                ),
                Coordinates::Missing => ("missing", None),
                Coordinates::Invalid => ("invalid", None),
            };
            line.points = Some(Cow::Borrowed(points));
            line.cell = cell.map(Cow::Owned);
            let (event_time, event_ms) = match facts.time {
                EventTime::At(at) => ("read", Some(at.0)),
                EventTime::Missing => ("missing", None),
                EventTime::Invalid => ("invalid", None),
            };
            line.event_time = Some(Cow::Borrowed(event_time));
            line.event_ms = event_ms;
        }
        if let Some(d) = &note.decided {
            let decision = &d.decision;
            line.area = decision
                .area
                .map(|a| Cow::Borrowed(policy.area(a).name.as_str()));
            line.rank = Some(decision.rank.get());
            line.age_ms = decision.age_ms;
            line.pressure = Some(decision.pressure.get());
            line.pressure_raw = Some(d.pressure_raw.get());
            line.pinned = d.pinned;
            line.schedule = decision
                .schedule
                .and_then(|i| policy.schedules().get(i))
                .map(|s| Cow::Borrowed(s.name.as_str()));
            line.probability = Some(decision.probability);
            line.draw = Some(d.draw);
            line.clock_offset_ms = Some(d.now.since(d.local));
            line.load = Some(LoadLine {
                class_inflight: d.load.class_inflight,
                total: d.load.total,
                capacity: d.load.capacity,
            });
            line.buffered_bytes = Some(d.buffered);
            line.device_history = d.history.map(HistoryLine::from);
            line.credit_after = decision.credit;
            if let Verdict::WouldShed(reason) = decision.verdict {
                line.would_shed = Some(Cow::Borrowed(reason.as_str()));
            }
        }
        line
    }
}

/// Longest message id written, bytes: a sender's ids are UUIDs or similar (Standard Webhooks'
/// `msg_` + 27 characters); a longer one is cut, on a character boundary.
const MAX_MESSAGE_ID: usize = 128;

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `at` as RFC 3339 UTC with milliseconds (`2026-12-04T17:02:03.123Z`).
pub fn rfc3339(at: UnixMillis) -> String {
    match jiff::Timestamp::from_millisecond(at.0) {
        Ok(t) => format!("{t:.3}"),
        Err(_) => format!("{}", at.0),
    }
}

/// The unix milliseconds of a line's `time` (`None`: not RFC 3339).
pub fn parse_time(text: &str) -> Option<UnixMillis> {
    text.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| UnixMillis(t.as_millisecond()))
}
