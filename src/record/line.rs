//! One access-log line: what the proxy hands over when it answers ([`Entry`], unformatted), and
//! the JSON line it becomes on the writer thread ([`Line`], also what `shedgate replay` reads
//! back). docs/operations.md "Access log" lists every field.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::admission::{Decision, DeviceHistory, Load, Rule};
use crate::clock::UnixMillis;
use crate::extract::{BodyState, Facts};
use crate::live::store::Snapshot;
use crate::metrics::Outcome;
use crate::policy::{StreamId, UpstreamId};
use crate::pressure::Pressure;

/// What the request path's stages know of one request when it is answered, carried in the
/// response's extensions to the access log (only while one is configured).
#[derive(Debug, Clone, Default)]
pub struct Note {
    /// The stream, `None` when unknown or not yet known.
    pub stream: Option<StreamId>,
    /// The upstream it was bound for, whose pressure it was decided at (an id of the policy
    /// the line is written with, named at write time); `None` when answered before routing (a
    /// head, framing or size refused, a body that could not be read).
    pub upstream: Option<UpstreamId>,
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
    /// Why the request's device id was not trusted, when it was not: it was decided as
    /// naming no device (`Decided::history` is `None`).
    pub device_untrusted: Option<crate::admission::Untrusted>,
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

/// The sender's message id headers, in order: Standard Webhooks' `webhook-id` (Svix and the
/// Standard Webhooks specification, "Webhook Metadata"), then CloudEvents binary mode's
/// `ce-id` (CloudEvents HTTP protocol binding, section 3.1.3).
pub const MESSAGE_ID_HEADERS: [&str; 2] = ["webhook-id", "ce-id"];

/// One answered request, as handed to the writer thread: [`Line`] is made from it there.
#[derive(Debug)]
pub struct Entry {
    /// The request id (`RequestIds`).
    pub id: u64,
    /// When it was answered (the decision's local clock, when one was made).
    pub at: UnixMillis,
    /// The TCP peer.
    pub peer: Option<IpAddr>,
    /// The method (`None`: a head refused before its method could be read).
    pub method: Option<http::Method>,
    /// The request target: its path gives the route; neither path nor query is written
    /// (`None`: a head refused before its target could be read).
    pub target: Option<http::Uri>,
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
    /// The response body's length, when its `Content-Length` or the body itself states it.
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
    /// [`DeviceHistory::since_delivered_ms`]: the device's delivery age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_delivered_ms: Option<i64>,
}

impl From<DeviceHistory> for HistoryLine {
    fn from(h: DeviceHistory) -> Self {
        HistoryLine {
            credit: h.credit,
            since_admitted_ms: h.since_admitted_ms,
            interval_ms: h.interval_ms,
            newest_delivered_ms: h.newest_delivered.map(|t| t.0),
            since_delivered_ms: h.since_delivered_ms,
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
            // Never logged: a decision given a history was judged on it already.
            newest_position: None,
            since_delivered_ms: h.since_delivered_ms,
        }
    }
}

/// [`Load`] as a line states it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadLine {
    /// In flight per class: `critical`, `important`, `best-effort` ([`crate::policy::Class`]).
    pub class_inflight: [u32; 3],
    /// In flight in total.
    pub total: u32,
    /// The upstream's in-flight capacity.
    pub capacity: u32,
    /// The freshness floor's budget as the decision read it, when the fix had a floor
    /// ([`crate::admission::Floor`]; its `max_silence` is the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<FloorLine>,
}

/// The freshness floor's budget as a line states it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FloorLine {
    /// Floor admissions in flight.
    pub inflight: u32,
    /// The most floor admissions in flight at once.
    pub limit: u32,
    /// The threshold, in `max_silence`s of silence, while the budget binds.
    pub threshold: f64,
}

impl LoadLine {
    /// The [`Load`] a decision read, its floor's `max_silence` given (from the policy
    /// replayed: `None` when it sets none for the fix). A line without a floor stands for an
    /// idle floor budget at the policy's share of the capacity.
    pub fn load(&self, max_silence: Option<std::time::Duration>, share: f64) -> Load {
        let floor = match (max_silence, self.floor) {
            (None, _) => crate::admission::Floor::OFF,
            (Some(max), None) => crate::admission::Floor::idle(max, share, self.capacity),
            (Some(max), Some(f)) => crate::admission::Floor {
                inflight: f.inflight,
                limit: f.limit,
                threshold: f.threshold,
                ..crate::admission::Floor::idle(max, share, self.capacity)
            },
        };
        Load {
            class_inflight: self.class_inflight,
            total: self.total,
            capacity: self.capacity,
            floor,
        }
    }
}

/// One access-log line (JSON) as replay reads it back; [`Formatter`](super::format::Formatter) writes it. Optional
/// fields are left out when they do not apply; strings borrow from the text they were read
/// from. Field by field in docs/operations.md "Access log".
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Line<'a> {
    /// RFC 3339 UTC, milliseconds: when the request was decided (or answered, without a
    /// decision).
    #[serde(borrow)]
    pub time: Cow<'a, str>,
    /// The proxy's own request id: 16 hex digits, unique per replica.
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    /// The sender's message id (`webhook-id`, else `ce-id`): the same on every retry.
    #[serde(borrow, default)]
    pub message_id: Option<Cow<'a, str>>,
    /// The replica that answered (`--replica`).
    #[serde(borrow)]
    pub replica: Cow<'a, str>,
    /// The TCP peer, truncated to its /24 (IPv4) or /48 (IPv6) unless
    /// `--access-log-full-peer`.
    #[serde(borrow, default)]
    pub peer: Option<Cow<'a, str>>,
    /// The method; absent when a head was refused before its method could be read.
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    /// The route's prefix, when a route matched (never the path itself).
    #[serde(borrow, default)]
    pub route: Option<Cow<'a, str>>,
    /// The stream, when the policy names it.
    #[serde(borrow, default)]
    pub stream: Option<Cow<'a, str>>,
    /// The stream's priority class.
    #[serde(borrow)]
    pub class: Cow<'a, str>,
    /// The upstream it was bound for, by the policy's name (`[upstreams.NAME]`, or `default`),
    /// whose pressure and load it was decided at; absent when answered before routing. A line
    /// written before upstreams were named has none, and was bound for `default`
    /// ([`Line::bound_for`]).
    #[serde(borrow, default)]
    pub upstream: Option<Cow<'a, str>>,
    /// The status answered.
    pub status: u16,
    /// `forwarded`, `shed`, `rejected` or `upstream_error`.
    #[serde(borrow)]
    pub outcome: Cow<'a, str>,
    /// The shed reason, rejection or upstream error.
    #[serde(borrow, default)]
    pub reason: Option<Cow<'a, str>>,
    /// The rule that decided.
    #[serde(borrow, default)]
    pub rule: Option<Cow<'a, str>>,
    /// Warn mode: the reason it would have been shed for (it was forwarded).
    #[serde(borrow, default)]
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
    #[serde(default)]
    pub ambiguous: bool,
    /// The deciding event's coordinates when they were not read: `missing` or `invalid` (read
    /// bodies; readable ones are `cell`).
    #[serde(borrow, default)]
    pub points: Option<Cow<'a, str>>,
    /// Their resolution-4 H3 cell (never the coordinates).
    #[serde(borrow, default)]
    pub cell: Option<Cow<'a, str>>,
    /// The configured area the cell is in.
    #[serde(borrow, default)]
    pub area: Option<Cow<'a, str>>,
    /// The rank decided at (the area's, or the default rank).
    #[serde(default)]
    pub rank: Option<u8>,
    /// The deciding event's time when it was not read: `missing` or `invalid` (read bodies;
    /// a readable one is `event_ms`).
    #[serde(borrow, default)]
    pub event_time: Option<Cow<'a, str>>,
    /// The deciding event's time, unix milliseconds (a batch: its newest).
    #[serde(default)]
    pub event_ms: Option<i64>,
    /// Its age at the decision, milliseconds (negative: ahead of the clock); absent when not
    /// believed (more than a day off).
    #[serde(default)]
    pub age_ms: Option<i64>,
    /// The pressure decided at, schedule floor included.
    #[serde(default)]
    pub pressure: Option<f64>,
    /// The gauge's pressure before any schedule's floor.
    #[serde(default)]
    pub pressure_raw: Option<f64>,
    /// An operator had pinned the pressure.
    #[serde(default)]
    pub pinned: bool,
    /// The schedule whose floor raised the pressure.
    #[serde(borrow, default)]
    pub schedule: Option<Cow<'a, str>>,
    /// The shed probability at the rank and pressure.
    #[serde(default)]
    pub probability: Option<f64>,
    /// The random draw.
    #[serde(default)]
    pub draw: Option<f64>,
    /// The correction of the local clock by the upstream's `Date`, milliseconds (0: none).
    #[serde(default)]
    pub clock_offset_ms: Option<i64>,
    /// In flight per class, in total, and the capacity.
    #[serde(default)]
    pub load: Option<LoadLine>,
    /// Sheddable body bytes buffered at the decision.
    #[serde(default)]
    pub buffered_bytes: Option<u64>,
    /// The device, keyed-hashed (`--access-log-secret-file`): 16 hex digits. Absent
    /// without a secret.
    #[serde(borrow, default)]
    pub device: Option<Cow<'a, str>>,
    /// Why the device id was not trusted (`placeholder`, `implausible`): decided as naming
    /// no device, so without a `device_history`.
    #[serde(borrow, default)]
    pub device_untrusted: Option<Cow<'a, str>>,
    /// The device's history the decision was given.
    #[serde(default)]
    pub device_history: Option<HistoryLine>,
    /// The device's credit after the decision.
    #[serde(default)]
    pub credit_after: Option<f64>,
    /// The upstream's status, when it answered.
    #[serde(default)]
    pub upstream_status: Option<u16>,
    /// The upstream's time to its response head, milliseconds.
    #[serde(default)]
    pub upstream_ms: Option<f64>,
    /// Request body bytes (read, or as declared for a body streamed through).
    #[serde(default)]
    pub request_bytes: Option<u64>,
    /// Response body bytes, as its `Content-Length` states.
    #[serde(default)]
    pub response_bytes: Option<u64>,
}

impl Line<'_> {
    /// The upstream a routed line was bound for: its `upstream`, else `default` (a line
    /// written before the access log named upstreams, when every request went to
    /// `--upstream`).
    pub fn bound_for(&self) -> &str {
        self.upstream
            .as_deref()
            .unwrap_or(crate::policy::DEFAULT_UPSTREAM)
    }
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
