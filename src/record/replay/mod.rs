//! A log's decisions made again (`shedgate replay`): each line's recorded facts, pressure,
//! draw, load and device history go through the same pure [`decide`] the proxy runs.
//!
//! - A line decided under the policy given (same version) must come out the same: verdict,
//!   rule, area, rank, probability, pressure and device credit, to the bit. Anything else is a
//!   mismatch, reported with its line number.
//! - A line decided under another policy is compared: what it was then and what the policy
//!   given makes of it now, counted by stream, area and rank band ([`Tally`]). Open-loop: the
//!   recorded pressure is replayed, though a policy that admits more would raise it.
//! - A body that streamed through unread (a `never` or unknown stream's) has no facts: under a
//!   policy that makes its stream sheddable it is undecidable, counted, never guessed.
//! - Answers not decided by the policy (rejections, a capped class's wait, the buffered-bytes
//!   budget) are counted apart.
//! - A decided line is replayed at its own upstream's recorded pressure and load (the line's
//!   `upstream`; a line without one was bound for `default`). One the policy given sends to
//!   another upstream (its route's or stream's `upstream` changed) is `moved`: that upstream's
//!   pressure then is unknown, so it is counted, never decided (under the line's own policy it
//!   is a mismatch).
//!
//! Facts come back from what a line holds: a point is its resolution-4 cell's centre, which
//! is in the same cell, so the same area, under any areas file (areas are sets of
//! resolution-4 cells). A batch is replayed by its recorded deciding event.

use std::collections::BTreeMap;

use serde::Serialize;

use super::line::{Line, parse_body, parse_time};
use super::tally::{Key, Side, Tally};
use crate::admission::{
    Decision, DeviceHistory, Load, Rule, ShedReason, Untrusted, Verdict, decide, schedule_floor,
};
use crate::clock::UnixMillis;
use crate::extract::{Coordinates, EventTime, Facts};
use crate::policy::{Policy, Supersession};
use crate::pressure::Pressure;

mod run;

pub use run::{LISTED, Outcome, ReadError, Run, Torn};

/// Counts of one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Lines read (blank lines aside).
    pub lines: u64,
    /// Decisions made under the policy given, made again identically.
    pub reproduced: u64,
    /// Decisions made under the policy given that came out otherwise.
    pub mismatched: u64,
    /// Decisions made under another policy, compared.
    pub compared: u64,
    /// Bodies streamed through unread, under a policy that would need their facts.
    pub undecidable: u64,
    /// Bodies streamed through unread whose stream the policy still never sheds.
    pub unread: u64,
    /// Answers no policy decided (rejections, budget waits, buffered-bytes sheds).
    pub outside: u64,
    /// Decisions made under another policy that the policy given sends to another upstream:
    /// not decided, as that upstream's pressure then is unknown (open loop).
    pub moved: u64,
}

/// A decision that did not come out the same under its own policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    /// 1-based line number.
    pub line: u64,
    /// What the line recorded.
    pub recorded: String,
    /// What the decision is now.
    pub replayed: String,
}

/// A line that is not an access-log line, or states an impossible decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// What is wrong.
    pub why: String,
}

/// A replay in progress under one policy.
#[derive(Debug)]
pub struct Replay<'p> {
    policy: &'p Policy,
    /// Counts so far.
    pub stats: Stats,
    /// Compared decisions (lines of other policies and unread bodies).
    pub tally: Tally,
    /// Every mismatch.
    pub mismatches: Vec<Mismatch>,
    /// Lines per policy version.
    pub versions: BTreeMap<String, u64>,
    span: Option<(UnixMillis, UnixMillis)>,
}

impl<'p> Replay<'p> {
    /// A replay under `policy`.
    pub fn new(policy: &'p Policy) -> Self {
        Replay {
            policy,
            stats: Stats::default(),
            tally: Tally::default(),
            mismatches: Vec::new(),
            versions: BTreeMap::new(),
            span: None,
        }
    }

    /// Seconds from the first compared (or moved) line to the last (0 with fewer than two).
    pub fn seconds(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
        self.span.map_or(0.0, |(first, last)| {
            last.since(first).max(0) as f64 / 1000.0
        })
    }

    /// Replays line `number` (1-based) of text `text` (one JSON line, newline optional).
    ///
    /// # Errors
    /// [`LineError`] when it is not an access-log line (bad JSON, a field out of its
    /// domain); nothing is counted for it.
    pub fn line(&mut self, number: u64, text: &str) -> Result<(), LineError> {
        let text = text.trim_end();
        if text.is_empty() {
            return Ok(());
        }
        let fail = |why: String| LineError { line: number, why };
        let line: Line<'_> = serde_json::from_str(text)
            .map_err(|e| fail(format!("not a shedgate access-log line: {e}")))?;
        let at = parse_time(&line.time)
            .ok_or_else(|| fail(format!("time {:?} is not RFC 3339", line.time)))?;
        self.stats.lines += 1;
        if let Some(n) = self.versions.get_mut(line.policy.as_ref()) {
            *n += 1;
        } else {
            self.versions.insert(line.policy.to_string(), 1);
        }
        let policy = self.policy;
        let stream = line.stream.as_deref().and_then(|n| policy.stream(n));
        let weight = 1.0 / line.sample.clamp(f64::MIN_POSITIVE, 1.0);
        let same = line.policy == policy.version();
        let Some(draw) = line.draw else {
            // Not decided by `decide`: a body streamed through, or an answer of its own.
            let streamed = line.body == "unread"
                && matches!(
                    line.rule.as_deref().and_then(Rule::parse),
                    Some(Rule::NeverShed | Rule::UnknownStream)
                );
            if !streamed {
                self.stats.outside += 1;
                return Ok(());
            }
            let sheddable = stream.is_some_and(|id| {
                policy.stream_policy(id).supersession == Supersession::SelfSuperseding
            });
            if sheddable {
                self.stats.undecidable += 1;
                let key = Key::undecided(stream, policy);
                self.tally
                    .add(key, Side::Admitted, Side::Undecidable, weight);
            } else {
                self.stats.unread += 1;
                if !same {
                    let key = Key::undecided(stream, policy);
                    self.tally.add(key, Side::Admitted, Side::Admitted, weight);
                }
            }
            return Ok(());
        };
        let recorded = recorded_verdict(&line).map_err(fail)?;
        let route = line.route.as_deref().and_then(|p| policy.route_index(p));
        // Decided at its upstream's pressure: another upstream's is not in the line.
        let bound = policy
            .upstream_spec(policy.upstream_of(route, stream))
            .name
            .as_str();
        if bound != line.bound_for() {
            if same {
                self.stats.mismatched += 1;
                self.mismatches.push(Mismatch {
                    line: number,
                    recorded: format!(
                        "{} at upstream {}",
                        describe_line(&line, recorded),
                        line.bound_for()
                    ),
                    replayed: format!("sent to upstream {bound}, not decided"),
                });
            } else {
                self.stats.moved += 1;
                self.widen(at);
                let key = Key::undecided(stream, policy);
                self.tally.add(key, Side::of(recorded), Side::Moved, weight);
            }
            return Ok(());
        }
        let max_silence = stream.and_then(|id| policy.max_silence(id, route));
        let inputs = Inputs::of(&line, at, max_silence, policy.freshness_share()).map_err(fail)?;
        let pressure = if inputs.pinned {
            inputs.raw
        } else {
            schedule_floor(policy, at, inputs.raw).0
        };
        let decision = decide(
            policy,
            stream,
            &inputs.facts,
            inputs.now,
            pressure,
            draw,
            &inputs.load,
            inputs.history,
        );
        if same {
            match differs(&line, recorded, &decision, policy) {
                None => self.stats.reproduced += 1,
                Some(replayed) => {
                    self.stats.mismatched += 1;
                    self.mismatches.push(Mismatch {
                        line: number,
                        recorded: describe_line(&line, recorded),
                        replayed,
                    });
                }
            }
        } else {
            self.stats.compared += 1;
            self.widen(at);
            let key = Key::of(stream, &decision);
            self.tally
                .add(key, Side::of(recorded), Side::of(decision.verdict), weight);
        }
        Ok(())
    }
}

impl Replay<'_> {
    /// Widens the compared lines' span to `at`.
    fn widen(&mut self, at: UnixMillis) {
        self.span = Some(match self.span {
            None => (at, at),
            Some((first, last)) => (first.min(at), last.max(at)),
        });
    }
}

/// The verdict a decided line records: its rule and any warn-mode would-shed.
fn recorded_verdict(line: &Line<'_>) -> Result<Verdict, String> {
    let rule = line.rule.as_deref().ok_or("a decision without a rule")?;
    let rule = Rule::parse(rule).ok_or_else(|| format!("rule {rule:?} is not a rule"))?;
    let would = match line.would_shed.as_deref() {
        None => None,
        Some(r) => Some(ShedReason::parse(r).ok_or_else(|| format!("{r:?} is not a reason"))?),
    };
    Ok(match (would, rule.shed_reason()) {
        (Some(reason), _) => Verdict::WouldShed(reason),
        (None, Some(reason)) => Verdict::Shed(reason),
        (None, None) => Verdict::Admit,
    })
}

/// The inputs of [`decide`] a line holds besides the stream.
struct Inputs {
    facts: Facts,
    now: UnixMillis,
    raw: Pressure,
    pinned: bool,
    load: Load,
    history: Option<DeviceHistory>,
}

impl Inputs {
    /// The inputs `line` records, decided at `at`; `max_silence` and `share` are the replayed
    /// policy's freshness floor for its fix.
    fn of(
        line: &Line<'_>,
        at: UnixMillis,
        max_silence: Option<std::time::Duration>,
        share: f64,
    ) -> Result<Self, String> {
        let body = parse_body(&line.body).ok_or_else(|| format!("body {:?}", line.body))?;
        let coordinates = match (line.cell.as_deref(), line.points.as_deref()) {
            (Some(cell), None) => {
                let cell: h3o::CellIndex = cell
                    .parse()
                    .map_err(|e| format!("cell {cell:?} is not an H3 cell: {e}"))?;
                let centre = h3o::LatLng::from(cell);
                Coordinates::new(centre.lat(), centre.lng())
            }
            (None, Some("invalid")) => Coordinates::Invalid,
            (None, Some("missing") | None) => Coordinates::Missing,
            (_, Some(other)) => return Err(format!("points {other:?} with cell {:?}", line.cell)),
        };
        let time = match (line.event_ms, line.event_time.as_deref()) {
            (Some(ms), None) => EventTime::At(UnixMillis(ms)),
            (None, Some("invalid")) => EventTime::Invalid,
            (None, Some("missing") | None) => EventTime::Missing,
            (_, Some(other)) => {
                return Err(format!(
                    "event_time {other:?} with event_ms {:?}",
                    line.event_ms
                ));
            }
        };
        let raw = line
            .pressure_raw
            .or(line.pressure)
            .ok_or("a decision without its pressure")?;
        let load = line.load.ok_or("a decision without its load")?;
        // An untrusted id was decided as naming no device: its judgement is the line's (the
        // id itself and the exact point are never written), and it had no history.
        if let Some(why) = line.device_untrusted.as_deref() {
            if Untrusted::parse(why).is_none() {
                return Err(format!("device_untrusted {why:?} is not a reason"));
            }
            if line.device_history.is_some() {
                return Err(format!(
                    "device_untrusted {why:?} with a device_history: an untrusted id is decided \
                     without one"
                ));
            }
        }
        Ok(Inputs {
            facts: Facts {
                body,
                coordinates,
                time,
                ambiguous: line.ambiguous,
                device: None,
            },
            now: UnixMillis(at.0 + line.clock_offset_ms.unwrap_or(0)),
            raw: Pressure::new(raw).ok_or_else(|| format!("pressure {raw} is not in [0, 1]"))?,
            pinned: line.pinned,
            load: load.load(max_silence, share),
            history: line.device_history.map(DeviceHistory::from),
        })
    }
}

/// `None` when `decision` is the one `line` records; else the decision, described.
fn differs(
    line: &Line<'_>,
    recorded: Verdict,
    decision: &Decision,
    policy: &Policy,
) -> Option<String> {
    let area = decision.area.map(|a| policy.area(a).name.as_str());
    let bits = |x: Option<f64>| x.map(f64::to_bits);
    let same = recorded == decision.verdict
        && line.rule.as_deref() == Some(decision.rule.as_str())
        && line.rank == Some(decision.rank.get())
        && line.area.as_deref() == area
        && bits(line.probability) == Some(decision.probability.to_bits())
        && bits(line.pressure) == Some(decision.pressure.get().to_bits())
        && bits(line.credit_after) == bits(decision.credit);
    (!same).then(|| {
        format!(
            "{} by rule {}, area {}, rank {}, probability {}, pressure {}, credit {}",
            verdict_text(decision.verdict),
            decision.rule.as_str(),
            area.unwrap_or("-"),
            decision.rank,
            decision.probability,
            decision.pressure.get(),
            decision
                .credit
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
        )
    })
}

fn describe_line(line: &Line<'_>, recorded: Verdict) -> String {
    format!(
        "{} by rule {}, area {}, rank {}, probability {}, pressure {}, credit {}",
        verdict_text(recorded),
        line.rule.as_deref().unwrap_or("-"),
        line.area.as_deref().unwrap_or("-"),
        line.rank.map_or_else(|| "-".to_owned(), |r| r.to_string()),
        line.probability
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
        line.pressure
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
        line.credit_after
            .map_or_else(|| "-".to_owned(), |c| c.to_string()),
    )
}

fn verdict_text(v: Verdict) -> String {
    match v {
        Verdict::Admit => "admit".to_owned(),
        Verdict::Shed(r) => format!("shed ({})", r.as_str()),
        Verdict::WouldShed(r) => format!("would-shed ({})", r.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `device_untrusted` is the line's judgement: a reason replay knows, never beside a
    /// device history (an untrusted id is decided without one).
    #[test]
    fn an_untrusted_device_is_read_from_the_line() {
        let files = crate::policy::PolicyFiles::from_texts(
            "[streams.a]\nsupersession = \"self-superseding\"\n",
            None,
        );
        let policy = crate::policy::compile(&files).unwrap().policy;
        let line = |extra: &str| {
            format!(
                r#"{{"time":"2026-12-04T17:02:03.123Z","id":"0000000000000001","replica":"r","method":"POST","class":"critical","status":200,"outcome":"forwarded","rule":"unknown-stream","policy":"{}","sample":1,"body":"json","points":"missing","event_time":"missing","rank":50,"pressure":0,"probability":0,"draw":0.5,"load":{{"class_inflight":[0,0,0],"total":0,"capacity":100}}{extra}}}"#,
                policy.version()
            )
        };
        let mut replay = Replay::new(&policy);
        replay
            .line(1, &line(r#","device_untrusted":"placeholder""#))
            .unwrap();
        replay
            .line(2, &line(r#","device_untrusted":"implausible""#))
            .unwrap();
        assert_eq!(replay.stats.reproduced, 2, "{:?}", replay.mismatches);
        let e = replay
            .line(3, &line(r#","device_untrusted":"shared""#))
            .unwrap_err();
        assert!(e.why.contains("not a reason"), "{e}");
        let e = replay
            .line(
                4,
                &line(r#","device_untrusted":"implausible","device_history":{"credit":0.5}"#),
            )
            .unwrap_err();
        assert!(e.why.contains("without one"), "{e}");
    }
}
