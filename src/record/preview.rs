//! A candidate policy decided in shadow on the live traffic (`POST /policy/preview`): every
//! request the live policy decides is decided again by the candidate, with the same facts
//! (the live routes and extraction read them), the same pressure before schedules, the same
//! draw and load, and a device table of its own, then counted by stream, area and rank band
//! beside what the live decision did. The live decision never reads anything of it.
//!
//! The candidate's areas, ranks, curve, classes, budgets, modes, schedules and streams'
//! classes and supersession apply; its routes and read modes do not (a request is read once,
//! the live way), but its routes' and streams' `upstream` do: a request the candidate sends to
//! another upstream than the live one is counted `moved`, never decided, as that upstream's
//! pressure is not the one the live decision read. A live stream the candidate does not name
//! is unknown to it, so never shed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use serde::Serialize;

use super::tally::{Key, Row, Side, Tally};
use crate::admission::{Decision, DeviceHistory, Load, Verdict, decide, schedule_floor};
use crate::clock::UnixMillis;
use crate::devices::DeviceTable;
use crate::extract::{DeviceId, Facts};
use crate::policy::{Policy, StreamId, Supersession};
use crate::pressure::Pressure;

/// A preview running (or ended, its counts kept until another starts or it is stopped).
#[derive(Debug)]
pub struct Preview {
    id: Box<str>,
    by: Option<Box<str>>,
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
    /// The route's prefix, when a live route matched (the candidate's own route of it sets
    /// its `max_silence` and may name its upstream).
    pub route: Option<&'a str>,
    /// The live upstream's name: the one whose pressure and load these are.
    pub upstream: &'a str,
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
    /// The live load (its freshness floor the live policy's: the candidate's is its own).
    pub load: Load,
    /// The device, and the live table's history of it.
    pub device: Option<(DeviceId, Option<DeviceHistory>)>,
    /// What the live decision did.
    pub verdict: Verdict,
}

/// `GET /policy/preview`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The preview's id, as `POST` answered it.
    pub id: String,
    /// Who started it, as the `POST` said (`shedgate preview` sends user, host and pid).
    pub by: Option<String>,
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
    /// A preview of `candidate` over `window` (from when it starts to when it stops
    /// deciding), with a device table of room for `max_devices`, started by `by`. Its id is
    /// given when [`PreviewSlot::start`] starts it.
    pub fn new(
        candidate: Policy,
        window: (UnixMillis, UnixMillis),
        max_devices: usize,
        by: Option<&str>,
    ) -> Self {
        let (started, until) = window;
        Preview {
            id: Box::from(""),
            by: by.map(Box::from),
            candidate,
            started,
            until,
            devices: DeviceTable::new(max_devices, started),
            tally: Mutex::new(Tally::default()),
        }
    }

    /// Its id: 12 hex digits, given when it starts.
    pub fn id(&self) -> &str {
        &self.id
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
        let route = live.route.and_then(|p| policy.route_index(p));
        if policy.upstream_spec(policy.upstream_of(route, stream)).name != live.upstream {
            let key = Key::undecided(stream, policy);
            let (then, now) = (Side::of(live.verdict), Side::Moved);
            self.count(key, then, now);
            return (key, then, now);
        }
        let pressure = if live.pinned {
            live.pressure_raw
        } else {
            schedule_floor(policy, live.local, live.pressure_raw).0
        };
        // The candidate's freshness floor: its own `max_silence` and share, over the live
        // floor's admissions in flight and threshold.
        let mut load = live.load;
        load.floor = match stream.and_then(|id| policy.max_silence(id, route)) {
            Some(max) if live.device.is_some() => crate::admission::Floor {
                inflight: live.load.floor.inflight,
                threshold: live.load.floor.threshold,
                ..crate::admission::Floor::idle(max, policy.freshness_share(), load.capacity)
            },
            _ => crate::admission::Floor::OFF,
        };
        let decide_with = |history: Option<DeviceHistory>| {
            decide(
                policy, stream, live.facts, live.now, pressure, live.draw, &load, history,
            )
        };
        let decision: Decision = match live.device {
            None => decide_with(None),
            Some((id, live_history)) => {
                self.devices
                    .decide_with(id, live.local, |shadow| {
                        // The shadow's own credit and admissions; what the upstream took, and
                        // when, is the live table's (the shadow delivers nothing). A device new
                        // to the shadow starts from its live history.
                        let delivered = live_history.and_then(|h| h.newest_delivered);
                        let since_delivered = live_history.and_then(|h| h.since_delivered_ms);
                        let start = shadow
                            .or(live_history)
                            .unwrap_or_else(|| DeviceHistory::new(live.draw));
                        decide_with(Some(DeviceHistory {
                            newest_delivered: delivered,
                            since_delivered_ms: since_delivered,
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
            id: self.id.to_string(),
            by: self.by.as_deref().map(str::to_owned),
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

/// The one preview a proxy runs at a time, and what became of the few before it.
///
/// One at a time: each preview keeps a device table of `--max-devices` and adds a decision to
/// every request, and `shedgate_preview_decisions_total` counts one candidate's decisions
/// (its labels carry no preview id, so that the series stay bounded): a second candidate
/// would double the cost and mix its counts into the first's. A `POST` while one runs is
/// refused with its holder ([`Busy`]); one that ended is replaced, its final counts kept under
/// its id for the [`REMEMBERED`] previews that follow it, so that its owner still reads them.
/// Requests read the current one without a lock; starts and stops take one.
#[derive(Debug, Default)]
pub struct PreviewSlot {
    current: ArcSwapOption<Preview>,
    past: Mutex<VecDeque<(Box<str>, Fate)>>,
}

/// Most previews before the current one whose fate is remembered.
pub const REMEMBERED: usize = 8;

/// What became of a preview that is not the current one.
#[derive(Debug, Clone, PartialEq)]
pub enum Fate {
    /// It ran its window out and another started after it: its final counts.
    Ended(Box<Report>),
    /// Stopped by `DELETE` at this time (RFC 3339); its counts are gone.
    Stopped(String),
}

/// A preview asked for by id.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// The current preview (running, or ended), its counts now.
    Current(Box<Report>),
    /// One before it.
    Past(Fate),
    /// No preview by that id (never started here, the proxy restarted since, or it is older
    /// than the last [`REMEMBERED`]); the current one's id, if any.
    Unknown(Option<String>),
}

/// `POST` while a preview runs: its holder, as `GET` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Busy(pub Box<Report>);

impl PreviewSlot {
    /// The current preview, for a request to decide in its shadow (no lock).
    pub fn load(&self) -> arc_swap::Guard<Option<Arc<Preview>>> {
        self.current.load()
    }

    fn past(&self) -> std::sync::MutexGuard<'_, VecDeque<(Box<str>, Fate)>> {
        self.past.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(past: &mut VecDeque<(Box<str>, Fate)>, id: Box<str>, fate: Fate) {
        past.retain(|(known, _)| *known != id);
        if past.len() == REMEMBERED {
            past.pop_front();
        }
        past.push_back((id, fate));
    }

    /// Starts `preview` at `now` under a new id, 12 hex digits from `draw` (uniform in
    /// `[0, 1)`, called until the id is not one this slot knows), unless one is running.
    /// An ended one it replaces is remembered with its final counts.
    ///
    /// # Errors
    /// [`Busy`] with the running one's report.
    pub fn start(
        &self,
        mut preview: Preview,
        now: UnixMillis,
        mut draw: impl FnMut() -> f64,
    ) -> Result<Arc<Preview>, Busy> {
        let mut past = self.past();
        let current = self.current.load_full();
        if let Some(running) = current.as_deref().filter(|p| p.running(now)) {
            return Err(Busy(Box::new(running.report(now))));
        }
        let id = loop {
            #[expect(clippy::cast_possible_truncation, reason = "below 2^48")]
            #[expect(clippy::cast_sign_loss, reason = "a draw in [0, 1) is not negative")]
            let id = format!("{:012x}", (draw() * 281_474_976_710_656.0) as u64);
            let taken = current.as_deref().is_some_and(|p| *p.id == *id)
                || past.iter().any(|(known, _)| **known == *id);
            if !taken {
                break id;
            }
        };
        preview.id = id.into();
        if let Some(ended) = current {
            let report = ended.report(now);
            Self::remember(&mut past, ended.id.clone(), Fate::Ended(Box::new(report)));
        }
        let preview = Arc::new(preview);
        self.current.store(Some(Arc::clone(&preview)));
        Ok(preview)
    }

    /// The current preview's report, at `now`.
    pub fn current(&self, now: UnixMillis) -> Option<Report> {
        self.current.load().as_deref().map(|p| p.report(now))
    }

    /// The preview named `id`, at `now`.
    pub fn find(&self, id: &str, now: UnixMillis) -> Found {
        let past = self.past();
        let current = self.current.load();
        match current.as_deref() {
            Some(p) if *p.id == *id => Found::Current(Box::new(p.report(now))),
            _ => match past.iter().find(|(known, _)| **known == *id) {
                Some((_, fate)) => Found::Past(fate.clone()),
                None => Found::Unknown(current.as_deref().map(|p| p.id.to_string())),
            },
        }
    }

    /// Stops the preview named `id` at `now` and forgets its counts (remembering that it was
    /// stopped): what it was, when it was the current one or an ended one remembered.
    ///
    /// # Errors
    /// What is known of `id` otherwise ([`Found::Past`] with [`Fate::Stopped`], or
    /// [`Found::Unknown`]).
    pub fn stop(&self, id: &str, now: UnixMillis) -> Result<Report, Found> {
        let mut past = self.past();
        let stopped = Fate::Stopped(super::line::rfc3339(now));
        let current = self.current.load_full();
        if let Some(p) = current.as_deref().filter(|p| *p.id == *id) {
            let report = p.report(now);
            self.current.store(None);
            Self::remember(&mut past, p.id.clone(), stopped);
            return Ok(report);
        }
        match past.iter_mut().find(|(known, _)| **known == *id) {
            Some((_, fate)) => match fate {
                Fate::Ended(report) => {
                    let report = (**report).clone();
                    *fate = stopped;
                    Ok(report)
                }
                Fate::Stopped(_) => Err(Found::Past(fate.clone())),
            },
            None => Err(Found::Unknown(current.map(|p| p.id.to_string()))),
        }
    }
}
