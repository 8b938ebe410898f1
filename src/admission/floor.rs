//! The freshness floor's inputs and its check (docs/decision.md "Devices"): a fresh fix of a
//! device silent longer than its `max_silence` is admitted where the curve would shed it,
//! within a budget of floor admissions in flight.

use serde::Serialize;

use super::DeviceHistory;

/// What the freshness floor reads for one decision: the route's or stream's `max_silence`
/// ([`crate::policy::Policy::max_silence`]), and the floor budget's state. Part of
/// [`super::Load`], logged with every decision that reads it so that replay reproduces it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Floor {
    /// `max_silence` in milliseconds; `None`: no floor for this fix.
    pub max_silence_ms: Option<i64>,
    /// Floor admissions in flight now (admitted by the floor, response body not ended).
    pub inflight: u32,
    /// At most this many floor admissions in flight at once:
    /// `max(1, freshness_share × capacity)` ([`Floor::limit_of`]).
    pub limit: u32,
    /// While the budget binds, a candidate's silence must exceed `threshold × max_silence`
    /// (at least 1): the devices silent longest go first, without a queue
    /// ([`crate::proxy`]'s floor state raises it after a second with denials and lowers it
    /// after one without).
    pub threshold: f64,
}

/// What the floor did with a fix the curve sheds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FloorVerdict {
    /// Silent past its floor and within the budget: admitted.
    Admitted,
    /// Silent past its floor, but the budget is spent (or the device is not silent long
    /// enough for the threshold while it binds): shed as the curve says, counted apart.
    Denied,
}

impl Floor {
    /// No floor (explain without a device, tests).
    pub const OFF: Floor = Floor {
        max_silence_ms: None,
        inflight: 0,
        limit: 1,
        threshold: 1.0,
    };

    /// A floor of `max_silence` over an idle budget (`freshness_share` of `capacity`, nothing
    /// in flight, the threshold at 1): what a decision reads before any budget state.
    pub fn idle(max_silence: std::time::Duration, freshness_share: f64, capacity: u32) -> Floor {
        Floor {
            max_silence_ms: Some(i64::try_from(max_silence.as_millis()).unwrap_or(i64::MAX)),
            inflight: 0,
            limit: Floor::limit_of(freshness_share, capacity),
            threshold: 1.0,
        }
    }

    /// The budget: `max(1, freshness_share × capacity)` floor admissions in flight, where
    /// `capacity` is the in-flight capacity class budgets share
    /// ([`crate::pressure::PressureGauge::capacity`]).
    pub fn limit_of(freshness_share: f64, capacity: u32) -> u32 {
        #[expect(clippy::cast_possible_truncation, reason = "at most capacity, a u32")]
        #[expect(clippy::cast_sign_loss, reason = "a positive share of a count")]
        let limit = (freshness_share * f64::from(capacity)).floor() as u32;
        limit.max(1)
    }

    /// The floor's verdict on a fresh fix the curve sheds, of a device with `history`;
    /// `None` when the floor does not apply (no floor, or the device delivered within its
    /// `max_silence`). A device this replica has never delivered counts as silent, but only
    /// just past its floor: while the budget binds, devices truly silent longer go first (ids
    /// new to this replica, after a restart or from a sender that changes its id, would
    /// otherwise outrank them all).
    pub fn check(&self, history: &DeviceHistory) -> Option<FloorVerdict> {
        let silence = self.silence_past(history)?;
        Some(if self.inflight < self.limit && self.long_enough(silence) {
            FloorVerdict::Admitted
        } else {
            FloorVerdict::Denied
        })
    }

    /// Whether a candidate of `history` was silent long enough for the threshold, and so was
    /// denied only because the budget was spent: the budget's state raises the threshold
    /// after a second with such a denial ([`crate::proxy`]'s floor state). `false` when the
    /// floor does not apply.
    pub fn met_a_full_budget(&self, history: &DeviceHistory) -> bool {
        self.inflight >= self.limit
            && self
                .silence_past(history)
                .is_some_and(|s| self.long_enough(s))
    }

    /// The device's silence, milliseconds, when it is past `max_silence` (never delivered:
    /// just past it).
    fn silence_past(&self, history: &DeviceHistory) -> Option<i64> {
        let max = self.max_silence_ms?;
        let silence = history
            .since_delivered_ms
            .unwrap_or_else(|| max.saturating_add(1));
        (silence > max).then_some(silence)
    }

    /// Whether `silence` (milliseconds) exceeds `threshold × max_silence`.
    fn long_enough(&self, silence: i64) -> bool {
        let max = self.max_silence_ms.unwrap_or(0);
        #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
        let needed = max as f64 * self.threshold.max(1.0);
        #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
        let long_enough = silence as f64 > needed;
        long_enough
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silent_for(ms: Option<i64>) -> DeviceHistory {
        DeviceHistory {
            since_delivered_ms: ms,
            ..DeviceHistory::new(0.5)
        }
    }

    const FIVE_S: Floor = Floor {
        max_silence_ms: Some(5_000),
        inflight: 0,
        limit: 2,
        threshold: 1.0,
    };

    #[test]
    fn only_a_device_silent_past_its_floor_is_a_candidate() {
        assert_eq!(FIVE_S.check(&silent_for(Some(5_000))), None);
        assert_eq!(
            FIVE_S.check(&silent_for(Some(5_001))),
            Some(FloorVerdict::Admitted)
        );
        // Never delivered by this replica: silent, but only just past its floor, so a binding
        // budget takes devices silent longer first.
        assert_eq!(
            FIVE_S.check(&silent_for(None)),
            Some(FloorVerdict::Admitted)
        );
        let binding = Floor {
            threshold: 2.0,
            ..FIVE_S
        };
        assert_eq!(binding.check(&silent_for(None)), Some(FloorVerdict::Denied));
        assert_eq!(Floor::OFF.check(&silent_for(None)), None);
    }

    #[test]
    fn the_budget_and_its_threshold_deny() {
        let full = Floor {
            inflight: 2,
            ..FIVE_S
        };
        assert_eq!(
            full.check(&silent_for(Some(60_000))),
            Some(FloorVerdict::Denied)
        );
        let binding = Floor {
            threshold: 2.0,
            ..FIVE_S
        };
        assert_eq!(
            binding.check(&silent_for(Some(9_000))),
            Some(FloorVerdict::Denied)
        );
        assert_eq!(
            binding.check(&silent_for(Some(10_001))),
            Some(FloorVerdict::Admitted)
        );
    }

    #[test]
    fn the_limit_is_a_share_of_capacity_and_at_least_one() {
        assert_eq!(Floor::limit_of(0.1, 64), 6);
        assert_eq!(Floor::limit_of(0.1, 5), 1);
        assert_eq!(Floor::limit_of(1.0, 7), 7);
        assert_eq!(Floor::limit_of(0.1, u32::MAX), 429_496_729);
    }
}
