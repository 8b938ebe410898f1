//! Priority classes, their compiled budgets and the live-disable switch (docs/decision.md
//! "Priority classes and budgets").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Mode;

/// Priority class (docs/decision.md "Priority classes and budgets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// Must get through. Unknown streams are `never` and `critical`.
    Critical,
    /// The default for a classified stream.
    Important,
    /// First to go.
    BestEffort,
}

impl Class {
    /// All classes, in index order.
    pub const ALL: [Class; 3] = [Class::Critical, Class::Important, Class::BestEffort];

    /// Index into per-class tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::Important => "important",
            Class::BestEffort => "best-effort",
        }
    }
}

/// A live-disable switch (docs/decision.md "Priority classes and budgets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Disable {
    /// Enabled.
    #[default]
    No,
    /// Disabled until an operator re-enables it.
    Indefinitely,
    /// Disabled until this time, then enabled again by itself (a forgotten switch must not
    /// shed forever).
    Until(crate::clock::UnixMillis),
}

impl Disable {
    /// Whether the switch is on at `now`.
    pub fn active(self, now: crate::clock::UnixMillis) -> bool {
        match self {
            Disable::No => false,
            Disable::Indefinitely => true,
            Disable::Until(until) => now < until,
        }
    }
}

/// A class's compiled policy.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassPolicy {
    /// Share of the in-flight capacity ([`crate::pressure::PressureGauge::capacity`]) this
    /// class may hold, `(0, 1]`; `None`: unlimited.
    pub budget: Option<f64>,
    /// How long a `never` request over the budget waits for room; `None`: it does not wait
    /// and ignores the budget.
    pub wait: Option<Duration>,
    /// Longest an admitted request may wait for the upstream's answer to begin, from
    /// admission; `None`: only `--upstream-timeout` applies.
    pub max_request_time: Option<Duration>,
    /// Warn mode for the whole class.
    pub mode: Option<Mode>,
    /// Live disable of the class's sheddable streams.
    pub disabled: Disable,
}

impl ClassPolicy {
    /// In-flight requests the class may hold out of `capacity` (at least 1), if budgeted.
    pub fn limit(&self, capacity: u32) -> Option<u32> {
        #[expect(clippy::cast_possible_truncation, reason = "a [0, 1] share of a u32")]
        #[expect(clippy::cast_sign_loss, reason = "a [0, 1] share of a u32")]
        self.budget
            .map(|b| ((b * f64::from(capacity)).ceil() as u32).max(1))
    }
}
