//! Decisions counted by stream, area and rank band, as they were and as a policy makes them
//! now: what `shedgate replay` prints for another policy and what `GET /policy/preview` shows.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::admission::{Decision, Verdict};
use crate::policy::{AreaId, BANDS, Policy, StreamId, band};

/// What a decision did with a request, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Forwarded (warn mode's would-sheds included).
    Admitted,
    /// Answered here (stale and superseded included).
    Shed,
    /// Not decidable: the policy needs facts the request's body never gave (a body that
    /// streamed through unread).
    Undecidable,
    /// Not decided: the policy counted sends it to another upstream than the one it was
    /// decided at, whose pressure then is unknown (open loop: never guessed).
    Moved,
}

impl Side {
    /// The side of a decision's verdict.
    pub fn of(verdict: Verdict) -> Side {
        match verdict {
            Verdict::Admit | Verdict::WouldShed(_) => Side::Admitted,
            Verdict::Shed(_) => Side::Shed,
        }
    }

    /// `admitted`, `shed`, `undecidable` or `moved`: the preview metric's label values.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Admitted => "admitted",
            Side::Shed => "shed",
            Side::Undecidable => "undecidable",
            Side::Moved => "moved",
        }
    }
}

/// A row's key: the stream, area and rank band the policy counted now puts the request in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The stream (`None`: one the policy does not name).
    pub stream: Option<StreamId>,
    /// The configured area (`None`: the default rank's places, or coordinates unread).
    pub area: Option<AreaId>,
    /// Index into [`BANDS`].
    pub band: usize,
}

impl Key {
    /// The row of a decision under `policy`.
    pub fn of(stream: Option<StreamId>, decision: &Decision) -> Key {
        Key {
            stream,
            area: decision.area,
            band: band(decision.rank),
        }
    }

    /// The row of a request the policy could not decide: its default rank's band.
    pub fn undecided(stream: Option<StreamId>, policy: &Policy) -> Key {
        Key {
            stream,
            area: None,
            band: band(policy.default_rank()),
        }
    }
}

/// Weighted counts of one row (a line kept at rate `r` counts `1 / r`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Admitted then.
    pub then_admitted: f64,
    /// Shed then.
    pub then_shed: f64,
    /// Admitted now.
    pub now_admitted: f64,
    /// Shed now.
    pub now_shed: f64,
    /// Not decidable now.
    pub undecidable: f64,
    /// Sent to another upstream now, so not decided (its pressure there is unknown).
    pub moved: f64,
}

impl Counts {
    fn add(&mut self, then: Side, now: Side, weight: f64) {
        match then {
            Side::Admitted => self.then_admitted += weight,
            Side::Shed => self.then_shed += weight,
            Side::Undecidable | Side::Moved => {}
        }
        match now {
            Side::Admitted => self.now_admitted += weight,
            Side::Shed => self.now_shed += weight,
            Side::Undecidable => self.undecidable += weight,
            Side::Moved => self.moved += weight,
        }
    }
}

/// Counts by [`Key`].
#[derive(Debug, Clone, Default)]
pub struct Tally {
    rows: BTreeMap<Key, Counts>,
}

/// One row as printed and served: names instead of ids.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The stream's name (`(unknown)` for none the policy names).
    pub stream: String,
    /// The area's name (`-` for the default rank's places).
    pub area: String,
    /// The rank band, `1-10`, `11-30`, `31-50` or `51-100`.
    pub band: String,
    /// The counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// Admitted now per second of the window (open-loop: at the pressure recorded).
    pub now_admitted_per_second: f64,
}

impl Tally {
    /// Counts one request.
    pub fn add(&mut self, key: Key, then: Side, now: Side, weight: f64) {
        self.rows.entry(key).or_default().add(then, now, weight);
    }

    /// Adds another tally's counts (a fleet's replicas).
    pub fn merge(&mut self, other: &Tally) {
        for (key, c) in &other.rows {
            let row = self.rows.entry(*key).or_default();
            row.then_admitted += c.then_admitted;
            row.then_shed += c.then_shed;
            row.now_admitted += c.now_admitted;
            row.now_shed += c.now_shed;
            row.undecidable += c.undecidable;
            row.moved += c.moved;
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows, names from `policy`, with rates over `seconds` (0: no rate).
    pub fn rows(&self, policy: &Policy, seconds: f64) -> Vec<Row> {
        self.rows
            .iter()
            .map(|(key, counts)| Row {
                stream: key.stream.map_or_else(
                    || "(unknown)".to_owned(),
                    |id| policy.stream_policy(id).name.clone(),
                ),
                area: key
                    .area
                    .map_or_else(|| "-".to_owned(), |a| policy.area(a).name.clone()),
                band: band_name(key.band).to_owned(),
                counts: *counts,
                now_admitted_per_second: if seconds > 0.0 {
                    counts.now_admitted / seconds
                } else {
                    0.0
                },
            })
            .collect()
    }

    /// The rows as a text table, with a total line.
    pub fn table(&self, policy: &Policy, seconds: f64) -> String {
        use std::fmt::Write as _;
        let rows = self.rows(policy, seconds);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<24} {:<20} {:>6} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}",
            "stream",
            "area",
            "band",
            "admitted",
            "shed",
            "admitted",
            "shed",
            "undecidable",
            "moved",
            "admitted/s"
        );
        let _ = writeln!(
            out,
            "{:<24} {:<20} {:>6} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}",
            "", "", "", "(then)", "(then)", "(now)", "(now)", "(now)", "(now)", "(now)"
        );
        let mut total = Counts::default();
        for r in &rows {
            let c = r.counts;
            let _ = writeln!(
                out,
                "{:<24} {:<20} {:>6} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>11.0} {:>10.0} {:>10.1}",
                r.stream,
                r.area,
                r.band,
                c.then_admitted,
                c.then_shed,
                c.now_admitted,
                c.now_shed,
                c.undecidable,
                c.moved,
                r.now_admitted_per_second
            );
            total.then_admitted += c.then_admitted;
            total.then_shed += c.then_shed;
            total.now_admitted += c.now_admitted;
            total.now_shed += c.now_shed;
            total.undecidable += c.undecidable;
            total.moved += c.moved;
        }
        let rate = if seconds > 0.0 {
            total.now_admitted / seconds
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "{:<24} {:<20} {:>6} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>11.0} {:>10.0} {:>10.1}",
            "total",
            "",
            "",
            total.then_admitted,
            total.then_shed,
            total.now_admitted,
            total.now_shed,
            total.undecidable,
            total.moved,
            rate
        );
        out
    }
}

/// A band's name, `1-10` ([`crate::policy::curve::BAND_NAMES`]).
pub fn band_name(index: usize) -> &'static str {
    crate::policy::curve::BAND_NAMES[index.min(BANDS.len() - 1)]
}
