//! A candidate policy decided in shadow on the live traffic (`POST /policy/preview`): every
//! request the live policy decides is decided again by the candidate, with the same facts
//! (the live routes and extraction read them), the same pressure before schedules, the same
//! draw and load, and a device table of its own, then counted by stream, area and rank band
//! beside what the live decision did. The live decision never reads anything of it.
//!
//! The candidate's areas, ranks, curve, classes, budgets, modes, schedules and streams'
//! classes and supersession apply; its routes and read modes do not (a request is read once,
//! the live way). A live stream the candidate does not name is unknown to it, so never shed.

use std::sync::Mutex;

use serde::Serialize;

use super::tally::{Key, Row, Side, Tally};
use crate::admission::{Decision, DeviceHistory, Load, Verdict, decide, schedule_floor};
use crate::clock::UnixMillis;
use crate::devices::DeviceTable;
use crate::extract::{DeviceId, Facts};
use crate::policy::{Policy, StreamId, Supersession};
use crate::pressure::Pressure;

/// A preview running (or ended, its counts kept until replaced or deleted).
#[derive(Debug)]
pub struct Preview {
    candidate: Policy,
    started: UnixMillis,
    until: UnixMillis,
    devices: DeviceTable,
    tally: Mutex<Tally>,
}

/// What a live decision was given and did, for the shadow one.
#[derive(Debug, Clone, Copy)]
pub struct Live<'a> {
    /// The stream's name, when the live policy names it.
    pub stream: Option<&'a str>,
    /// The facts read.
    pub facts: &'a Facts,
    /// `now`, corrected as the live decision's.
    pub now: UnixMillis,
    /// The local clock (for the candidate's schedules).
    pub local: UnixMillis,
    /// The gauge's pressure before schedules.
    pub pressure_raw: Pressure,
    /// Whether the pressure is pinned (schedules then do not apply).
    pub pinned: bool,
    /// The live draw.
    pub draw: f64,
    /// The live load.
    pub load: Load,
    /// The device, and the live table's history of it.
    pub device: Option<(DeviceId, Option<DeviceHistory>)>,
    /// What the live decision did.
    pub verdict: Verdict,
}

/// `GET /policy/preview`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The candidate's version (content hash).
    pub candidate: String,
    /// When it started, RFC 3339.
    pub started: String,
    /// When it stops deciding, RFC 3339.
    pub until: String,
    /// Whether it still decides.
    pub running: bool,
    /// Seconds it has decided for.
    pub seconds: f64,
    /// Counts by stream, area and band: `then_*` is the live policy's, `now_*` the
    /// candidate's.
    pub rows: Vec<Row>,
}

impl Preview {
    /// A preview of `candidate` from `started` to `until`, with a device table of room for
    /// `max_devices`.
    pub fn new(
        candidate: Policy,
        started: UnixMillis,
        until: UnixMillis,
        max_devices: usize,
    ) -> Self {
        Preview {
            candidate,
            started,
            until,
            devices: DeviceTable::new(max_devices, started),
            tally: Mutex::new(Tally::default()),
        }
    }

    /// The candidate policy.
    pub fn candidate(&self) -> &Policy {
        &self.candidate
    }

    /// Whether it decides at `now`.
    pub fn running(&self, now: UnixMillis) -> bool {
        now < self.until
    }

    /// Decides a request the live policy decided, in shadow, and counts both. Returns the key
    /// and sides counted (for the metric).
    pub fn shadow(&self, live: &Live<'_>) -> (Key, Side, Side) {
        let policy = &self.candidate;
        let stream = live.stream.and_then(|n| policy.stream(n));
        let pressure = if live.pinned {
            live.pressure_raw
        } else {
            schedule_floor(policy, live.local, live.pressure_raw).0
        };
        let decide_with = |history: Option<DeviceHistory>| {
            decide(
                policy, stream, live.facts, live.now, pressure, live.draw, &live.load, history,
            )
        };
        let decision: Decision = match live.device {
            None => decide_with(None),
            Some((id, live_history)) => {
                self.devices
                    .decide_with(id, live.local, |shadow| {
                        // The shadow's own credit and admissions; what the upstream took is
                        // the live table's (the shadow delivers nothing). A device new to the
                        // shadow starts from its live history.
                        let delivered = live_history.and_then(|h| h.newest_delivered);
                        let start = shadow
                            .or(live_history)
                            .unwrap_or_else(|| DeviceHistory::new(live.draw));
                        decide_with(Some(DeviceHistory {
                            newest_delivered: delivered,
                            ..start
                        }))
                    })
                    .0
            }
        };
        let key = Key::of(stream, &decision);
        let (then, now) = (Side::of(live.verdict), Side::of(decision.verdict));
        self.count(key, then, now);
        (key, then, now)
    }

    /// Counts a request whose body streamed through unread (a `never` or unknown stream's):
    /// undecidable when the candidate would shed its stream, else admitted by both.
    pub fn unread(&self, stream: Option<&str>) -> (Key, Side, Side) {
        let policy = &self.candidate;
        let id = stream.and_then(|n| policy.stream(n));
        let key = Key::undecided(id, policy);
        let now = if sheddable(policy, id) {
            Side::Undecidable
        } else {
            Side::Admitted
        };
        self.count(key, Side::Admitted, now);
        (key, Side::Admitted, now)
    }

    fn count(&self, key: Key, then: Side, now: Side) {
        self.tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(key, then, now, 1.0);
    }

    /// The counts so far, at `now`.
    pub fn report(&self, now: UnixMillis) -> Report {
        let end = if self.running(now) { now } else { self.until };
        #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
        let seconds = end.since(self.started).max(0) as f64 / 1000.0;
        let tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        Report {
            candidate: self.candidate.version().to_owned(),
            started: super::line::rfc3339(self.started),
            until: super::line::rfc3339(self.until),
            running: self.running(now),
            seconds,
            rows: tally.rows(&self.candidate, seconds),
        }
    }
}

fn sheddable(policy: &Policy, stream: Option<StreamId>) -> bool {
    stream.is_some_and(|id| policy.stream_policy(id).supersession == Supersession::SelfSuperseding)
}
