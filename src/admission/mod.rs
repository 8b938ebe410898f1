//! The admission decision: a pure function of the policy, the event's facts, `now`, the
//! pressure and a random draw (docs/decision.md "Decision rule").

mod assess;
mod floor;
pub mod trust;

use serde::Serialize;

pub use assess::{NamedDevice, Reading, assess, assess_with_device};
pub use floor::{Floor, FloorVerdict};
pub use trust::Untrusted;

use crate::clock::UnixMillis;
use crate::extract::{BodyState, Coordinates, EventFacts, EventTime, Facts};
use crate::policy::{AreaId, Mode, Policy, Rank, StreamId, Supersession};
use crate::pressure::Pressure;

/// The rule that decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The stream is classified `never`: nothing resends its events.
    NeverShed,
    /// The stream is not in the policy (or the request named none): treated as `never`.
    UnknownStream,
    /// An operator disabled this sheddable stream.
    Disabled,
    /// Older than the stream's `stale_after`: its successor already arrived.
    Stale,
    /// Shed by the pressure curve.
    Pressure,
    /// Older than its device's newest delivered fix, under pressure: superseded.
    Superseded,
    /// Its class is over its concurrency budget and no capacity is idle.
    Budget,
    /// The proxy's budget of buffered body bytes (`--max-buffered-bytes`) is spent.
    Memory,
    /// Considered by the pressure curve and the budget, and kept.
    Kept,
    /// Shed by the curve, but its device was silent past its `max_silence`: admitted by the
    /// freshness floor, within its budget (an outcome, not a shed reason).
    Freshness,
}

impl Rule {
    /// Every rule.
    pub const ALL: [Rule; 10] = [
        Rule::NeverShed,
        Rule::UnknownStream,
        Rule::Disabled,
        Rule::Stale,
        Rule::Pressure,
        Rule::Superseded,
        Rule::Budget,
        Rule::Memory,
        Rule::Kept,
        Rule::Freshness,
    ];

    /// The rule [`Rule::as_str`] names `name` (`None`: no rule).
    pub fn parse(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// The shed reason this rule stands for, if it sheds.
    pub fn shed_reason(self) -> Option<ShedReason> {
        match self {
            Rule::Disabled => Some(ShedReason::Disabled),
            Rule::Stale => Some(ShedReason::Stale),
            Rule::Pressure => Some(ShedReason::Pressure),
            Rule::Superseded => Some(ShedReason::Superseded),
            Rule::Budget => Some(ShedReason::Budget),
            Rule::Memory => Some(ShedReason::Memory),
            Rule::NeverShed | Rule::UnknownStream | Rule::Kept | Rule::Freshness => None,
        }
    }

    /// Stable name, as in logs and `explain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NeverShed => "never-shed",
            Rule::UnknownStream => "unknown-stream",
            Rule::Disabled => "disabled",
            Rule::Stale => "stale",
            Rule::Pressure => "pressure",
            Rule::Superseded => "superseded",
            Rule::Budget => "budget",
            Rule::Memory => "memory",
            Rule::Kept => "kept",
            Rule::Freshness => "freshness",
        }
    }
}

/// Why a request was (or, in warn mode, would have been) shed. The `X-Shed-Reason` header
/// and the `reason` metric label carry [`ShedReason::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShedReason {
    /// Operator-disabled stream.
    Disabled,
    /// Stale event.
    Stale,
    /// Pressure curve.
    Pressure,
    /// Class over its budget.
    Budget,
    /// The proxy's buffered body bytes over `--max-buffered-bytes`.
    Memory,
    /// Older than its device's newest delivered fix (answered as stale events are).
    Superseded,
}

impl From<ShedReason> for Rule {
    /// The rule that sheds for `reason` (the inverse of [`Rule::shed_reason`]).
    fn from(reason: ShedReason) -> Rule {
        match reason {
            ShedReason::Disabled => Rule::Disabled,
            ShedReason::Stale => Rule::Stale,
            ShedReason::Pressure => Rule::Pressure,
            ShedReason::Budget => Rule::Budget,
            ShedReason::Memory => Rule::Memory,
            ShedReason::Superseded => Rule::Superseded,
        }
    }
}

impl ShedReason {
    /// All reasons, in metric-slot order.
    pub const ALL: [ShedReason; 6] = [
        ShedReason::Disabled,
        ShedReason::Stale,
        ShedReason::Pressure,
        ShedReason::Budget,
        ShedReason::Memory,
        ShedReason::Superseded,
    ];

    /// Stable name: `disabled`, `stale`, `pressure`, `budget`, `memory`, `superseded`.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::Disabled => "disabled",
            ShedReason::Stale => "stale",
            ShedReason::Pressure => "pressure",
            ShedReason::Budget => "budget",
            ShedReason::Memory => "memory",
            ShedReason::Superseded => "superseded",
        }
    }

    /// The reason [`ShedReason::as_str`] names `name` (`None`: no reason).
    pub fn parse(name: &str) -> Option<ShedReason> {
        ShedReason::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether the event was worthless, its successor already come (stale, superseded): it is
    /// answered as delivered (the sender must not resend it), counted apart from the sheds
    /// that cost a delivery, and left out of shed rates and completeness objectives.
    pub fn superseded(self) -> bool {
        matches!(self, ShedReason::Stale | ShedReason::Superseded)
    }

    /// Index into [`ShedReason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What happens to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "verdict", content = "reason")]
pub enum Verdict {
    /// Forward it.
    Admit,
    /// Answer it here; it never reaches the upstream.
    Shed(ShedReason),
    /// Warn mode: it would have been shed for this reason; it is forwarded.
    WouldShed(ShedReason),
}

/// One decision and everything needed to explain it (docs/decision.md "Decision rule": "every
/// decision can explain itself").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// What happens.
    pub verdict: Verdict,
    /// The rule that fired.
    pub rule: Rule,
    /// The configured area the event fell in, `None` for unconfigured places and unreadable
    /// coordinates.
    pub area: Option<AreaId>,
    /// The resolution-4 cell of the event's point, when the decision located it: a point far
    /// from every configured area is not located ([`Policy::locate`]), its area is none.
    pub cell: Option<h3o::CellIndex>,
    /// The rank used: the area's, or the policy's default rank.
    pub rank: Rank,
    /// Pressure-shed probability in `[0, 1]` at this rank and pressure (0 when the curve was
    /// not consulted).
    pub probability: f64,
    /// The pressure the decision saw.
    pub pressure: Pressure,
    /// Event age in milliseconds when its time was readable and plausible (negative: in the
    /// future).
    pub age_ms: Option<i64>,
    /// The schedule (index into [`Policy::schedules`]) whose floor raised the pressure, if
    /// one did ([`schedule_floor`]).
    pub schedule: Option<usize>,
    /// The event's time was more than [`IMPLAUSIBLE_AFTER`] from `now`: not believed, so
    /// not stale.
    pub implausible_time: bool,
    /// The device's history the decision read, when the request names one.
    pub device: Option<DeviceHistory>,
    /// The device's credit after this decision ([`DeviceHistory::credit`]), when the curve
    /// read it: the table keeps it for the device's next fix.
    pub credit: Option<f64>,
    /// What the freshness floor did, when the curve shed a fix of a device silent past its
    /// `max_silence` ([`Floor::check`]).
    pub floor: Option<FloorVerdict>,
    /// The `max_silence` of a fresh fix of a device, milliseconds, when it has one: the device
    /// table keeps it to count the devices past their floor.
    pub max_silence_ms: Option<i64>,
}

/// What the proxy's table remembers of the request's device (docs/decision.md "Devices"): an
/// input of the decision, like the pressure and the draw, so that the decision stays a pure
/// function and a logged one can be replayed.
///
/// Which of a rank's fresh fixes the curve sheds is chosen by device, not by an independent
/// draw per request: each device carries a credit, and at shed probability `P` a fix is
/// admitted when the credit is at least `P` (the credit then falls by `P`), and shed otherwise
/// (it rises by `1 - P`). A device reporting every `I` seconds is then admitted every
/// `1 / (1 - P)` fixes, evenly, dark for at most about `I / (1 - P)`, and the devices together
/// keep the curve's share exactly (error diffusion, as deficit round robin spreads a share
/// over flows: Shreedhar and Varghese, SIGCOMM 1995). A device not admitted for longer than
/// its share requires (`I / (1 - P)`, as when it was silent) is admitted whatever its credit:
/// the devices admitted most recently are the ones shed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeviceHistory {
    /// In `[0, 1)`; a new device's is the request's draw.
    pub credit: f64,
    /// Milliseconds since its last admitted fix (`None`: none remembered).
    pub since_admitted_ms: Option<i64>,
    /// Its report interval, milliseconds: the smoothed time between its fixes (`None`: one
    /// seen so far).
    pub interval_ms: Option<i64>,
    /// The event time of its newest fix the upstream answered 2xx (never one ahead of the
    /// proxy's clock).
    pub newest_delivered: Option<UnixMillis>,
    /// Where that fix was, when it had a position: what [`trust::judge`] compares a fix
    /// with. Never shown (an explanation goes to the sender, who may not be that device)
    /// nor logged.
    #[serde(skip)]
    pub newest_position: Option<trust::PackedPoint>,
    /// Milliseconds since the upstream last answered 2xx to one of its fixes, by the proxy's
    /// own clock (`None`: never, on this replica): its silence, for the freshness floor.
    pub since_delivered_ms: Option<i64>,
}

impl DeviceHistory {
    /// A device the table does not remember: `draw` (uniform in `[0, 1)`) is its credit, so
    /// its first fix is shed as a request of no device would be.
    pub fn new(draw: f64) -> Self {
        DeviceHistory {
            credit: draw,
            since_admitted_ms: None,
            interval_ms: None,
            newest_delivered: None,
            newest_position: None,
            since_delivered_ms: None,
        }
    }
}

/// A time further than this from `now`, in the past or the future, cannot be right (a device
/// clock reset to 1970, a local time sent as UTC across the date line): it counts as no
/// readable time, so one device with a broken clock is not shed as stale forever. 24 hours
/// covers every time-zone error (at most 14 hours) with room to spare.
pub const IMPLAUSIBLE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Reduces the events of one request to the facts of one decision (docs/decision.md "Areas",
/// batches): the request is sheddable only if every event is of a sheddable stream (else the
/// first `never` or unknown stream is returned and the request is never shed); it takes the
/// most important rank of its points (the coordinates returned are that point's); it is stale
/// only if its newest event is (the time returned is the newest, and the stream returned is
/// that event's, whose `stale_after` applies).
///
/// `events` must not be empty; `stream_of` gives each event's stream (`None`: unknown).
pub fn summarise(
    policy: &Policy,
    body: BodyState,
    events: &[EventFacts],
    stream_of: impl Fn(&EventFacts) -> Option<StreamId>,
) -> (Option<StreamId>, Facts) {
    let first = events.first().and_then(&stream_of);
    let mut facts = Facts {
        body,
        coordinates: Coordinates::Missing,
        time: EventTime::Missing,
        ambiguous: events.iter().any(|e| e.ambiguous),
        device: None,
    };
    for event in events {
        let stream = stream_of(event);
        let sheddable = stream.is_some_and(|id| {
            policy.stream_policy(id).supersession == Supersession::SelfSuperseding
        });
        if !sheddable {
            return (stream, facts);
        }
    }
    if let [event] = events {
        facts.coordinates = event.coordinates;
        facts.time = event.time;
        return (first, facts);
    }
    let mut best: Option<Rank> = None;
    let mut newest: Option<(UnixMillis, Option<StreamId>)> = None;
    let mut untimed = false;
    for event in events {
        match event.coordinates {
            Coordinates::Valid { lat, lon } => {
                let (_, rank) = policy.area_at(lat, lon);
                if best.is_none_or(|b| rank < b) {
                    best = Some(rank);
                    facts.coordinates = event.coordinates;
                }
            }
            // An unreadable point counts at the default rank: a batch never ranks less
            // important than the default because one of its points could not be read.
            _ if best.is_none_or(|b| policy.default_rank() < b) => {
                best = Some(policy.default_rank());
                facts.coordinates = match event.coordinates {
                    Coordinates::Invalid => Coordinates::Invalid,
                    _ => Coordinates::Missing,
                };
            }
            _ => {}
        }
        if !matches!(event.time, EventTime::At(_)) {
            untimed = true;
        }
        match event.time {
            EventTime::At(at) if newest.is_none_or(|(n, _)| at > n) => {
                newest = Some((at, stream_of(event)));
            }
            EventTime::Invalid if newest.is_none() => facts.time = EventTime::Invalid,
            _ => {}
        }
    }
    match newest {
        // An event without a readable time is not stale, so neither is its batch.
        Some((at, stream)) if !untimed => {
            facts.time = EventTime::At(at);
            (stream, facts)
        }
        Some((_, stream)) => {
            facts.time = EventTime::Missing;
            (stream, facts)
        }
        None => (first, facts),
    }
}

impl Decision {
    /// A shed the middleware decides outside [`decide`], because it needs what `decide` does
    /// not see: a capped `never` class that stayed over its budget for its whole wait
    /// ([`ShedReason::Budget`]), or the buffered body bytes running out while a body was read
    /// ([`ShedReason::Memory`]).
    pub fn shed_by(reason: ShedReason, policy: &Policy, pressure: Pressure) -> Self {
        Decision {
            verdict: Verdict::Shed(reason),
            rule: Rule::from(reason),
            ..Decision::unknown_stream(policy, pressure)
        }
    }

    /// Where every decision starts: admitted as an unknown stream, at the default rank.
    fn unknown_stream(policy: &Policy, pressure: Pressure) -> Self {
        Decision {
            verdict: Verdict::Admit,
            rule: Rule::UnknownStream,
            area: None,
            cell: None,
            rank: policy.default_rank(),
            probability: 0.0,
            pressure,
            age_ms: None,
            schedule: None,
            implausible_time: false,
            device: None,
            credit: None,
            floor: None,
            max_silence_ms: None,
        }
    }
}

/// Upstream concurrency as the budgets see it: requests in flight per class (indexed by
/// [`crate::policy::Class::index`]), in total, and the capacity
/// ([`crate::pressure::PressureGauge::capacity`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// In flight per class.
    pub class_inflight: [u32; 3],
    /// In flight in total.
    pub total: u32,
    /// The upstream's in-flight capacity.
    pub capacity: u32,
    /// The freshness floor of this fix and its budget.
    pub floor: Floor,
}

impl Load {
    /// Nothing in flight (explain, tests).
    pub const IDLE: Load = Load {
        class_inflight: [0; 3],
        total: 0,
        capacity: u32::MAX,
        floor: Floor::OFF,
    };

    /// Whether `class` is over its budget with no idle capacity to borrow: it may exceed its
    /// share while the upstream has room, and gives the room back as soon as others need it.
    pub fn over_budget(
        &self,
        class: crate::policy::Class,
        policy: &crate::policy::ClassPolicy,
    ) -> bool {
        policy.limit(self.capacity).is_some_and(|limit| {
            self.class_inflight[class.index()] >= limit && self.total >= self.capacity
        })
    }
}

/// The pressure a decision sees at `now`: at least the floor of the schedules open then
/// (docs/decision.md "Schedules"), and which schedule raised it, if one did.
pub fn schedule_floor(
    policy: &Policy,
    now: UnixMillis,
    pressure: Pressure,
) -> (Pressure, Option<usize>) {
    match crate::policy::schedule::floor_at(policy.schedules(), now) {
        Some((i, floor)) if floor > pressure => (floor, Some(i)),
        _ => (pressure, None),
    }
}

/// Decides one request (docs/decision.md "Decision rule", steps 2–7, and "Priority classes and
/// budgets": after the pressure curve, a class over its budget with no idle capacity is shed
/// with reason `budget`).
///
/// - `stream`: the stream's id in `policy`, `None` when unknown or missing (→ never shed).
/// - `facts`: what the body said; [`Facts::UNREAD`] for a body not read.
/// - `now`: the current time, for staleness.
/// - `pressure`: current pressure.
/// - `draw`: a uniform random number in `[0, 1)`; an event of no device is pressure-shed
///   when `draw < probability`, a superseded fix when `draw` is under
///   [`crate::policy::Curve::superseded_probability`].
/// - `device`: the history of the device the request names ([`DeviceHistory`]), `None` for
///   none; the curve's share of its fresh fixes is chosen by its credit.
#[expect(clippy::too_many_arguments, reason = "every decision input, by name")]
pub fn decide(
    policy: &Policy,
    stream: Option<StreamId>,
    facts: &Facts,
    now: UnixMillis,
    pressure: Pressure,
    draw: f64,
    load: &Load,
    device: Option<DeviceHistory>,
) -> Decision {
    let mut decision = Decision::unknown_stream(policy, pressure);
    let Some(id) = stream else {
        return decision;
    };
    let stream = policy.stream_policy(id);
    if stream.supersession == Supersession::Never {
        decision.rule = Rule::NeverShed;
        return decision;
    }
    if let Coordinates::Valid { lat, lon } = facts.coordinates
        && let Some(cell) = policy.locate(lat, lon)
    {
        let (area, rank) = policy.area_of_cell(cell);
        decision.cell = Some(cell);
        decision.area = area;
        decision.rank = rank;
    }
    if let EventTime::At(at) = facts.time {
        let age = now.since(at);
        let limit = i64::try_from(IMPLAUSIBLE_AFTER.as_millis()).unwrap_or(i64::MAX);
        if age.abs() > limit {
            decision.implausible_time = true;
        } else {
            decision.age_ms = Some(age);
        }
    }
    let class = policy.class(stream.class);
    let warn =
        stream.mode == Mode::Warn || class.mode == Some(Mode::Warn) || policy.mode() == Mode::Warn;
    let shed = |d: &mut Decision, rule: Rule, reason: ShedReason| {
        d.rule = rule;
        d.verdict = if warn {
            Verdict::WouldShed(reason)
        } else {
            Verdict::Shed(reason)
        };
    };
    if stream.disabled.active(now) || class.disabled.active(now) {
        shed(&mut decision, Rule::Disabled, ShedReason::Disabled);
        return decision;
    }
    if let Some(age) = decision.age_ms {
        let stale_after = i64::try_from(stream.stale_after.as_millis()).unwrap_or(i64::MAX);
        if age > stale_after {
            shed(&mut decision, Rule::Stale, ShedReason::Stale);
            return decision;
        }
    }
    decision.device = device;
    if let (Some(d), EventTime::At(at)) = (device, facts.time)
        && d.newest_delivered.is_some_and(|newest| at < newest)
    {
        // A retry of a fix its device has already delivered a newer one of: under pressure,
        // shed before any fresh fix, ramping in with the curve's floor.
        decision.probability = policy.curve().superseded_probability(pressure);
        if draw < decision.probability {
            shed(&mut decision, Rule::Superseded, ShedReason::Superseded);
            return decision;
        }
    }
    decision.probability = policy.curve().shed_probability(decision.rank, pressure);
    let pressure_shed = match device {
        None => draw < decision.probability,
        Some(d) => {
            let p = decision.probability;
            // Dark for longer than its share requires: admitted whatever its credit.
            // (A device never admitted is not: its credit admits it within 1 / (1 - P)
            // fixes, and admitting every such device at once would be a burst.)
            let overdue = match (d.since_admitted_ms, d.interval_ms) {
                (Some(since), Some(interval)) if p < 1.0 => {
                    #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
                    let overdue = since as f64 >= interval as f64 / (1.0 - p);
                    overdue
                }
                _ => false,
            };
            let shed = p >= 1.0 || (d.credit < p && !overdue);
            let credit = if shed {
                d.credit + (1.0 - p)
            } else {
                d.credit - p
            };
            decision.credit = Some(credit.clamp(0.0, 1.0 - f64::EPSILON));
            shed
        }
    };
    // The freshness floor overrides the curve only: a device silent past its
    // `max_silence` is admitted within the floor's budget; budgets still apply.
    decision.max_silence_ms = device.and(load.floor.max_silence_ms);
    decision.floor = device
        .filter(|_| pressure_shed)
        .and_then(|d| load.floor.check(&d));
    let floored = decision.floor == Some(FloorVerdict::Admitted);
    if pressure_shed && !floored {
        shed(&mut decision, Rule::Pressure, ShedReason::Pressure);
    } else if load.over_budget(stream.class, class) {
        // Its class's budget sheds it, floor or not: the floor admitted nothing.
        decision.floor = None;
        shed(&mut decision, Rule::Budget, ShedReason::Budget);
    } else if floored {
        decision.rule = Rule::Freshness;
    } else {
        decision.rule = Rule::Kept;
    }
    decision
}

#[cfg(test)]
mod tests;
