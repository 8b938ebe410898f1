//! The cold probe: how a replica that has not yet seen its upstream calm finds out whether
//! the latency it holds at the target is a queue or the upstream's own latency.
//!
//! Such a replica steers on latency alone (`COLD_SETPOINT`): what it learned at rest may be
//! the queue its fleet holds. When the upstream's own latency, as the proxy sees it, is near
//! the target, shedding cannot bring latency under the target, and the loop settles with
//! latency at the target and part of the upstream idle (docs/operations.md "Sizing").
//!
//! The two cases read the same to one replica at rest; they differ when it admits more. An
//! upstream with idle workers answers the extra requests as fast as the others; a queue
//! answers them later. So, like Envoy `adaptive_concurrency`'s minRTT window but the other
//! way round (concurrency raised, not pinned low), a replica whose loop has settled on
//! latency alone for [`SETTLE_TICKS`] lowers its shedding effort by [`STEP`] and holds it for
//! [`PROBE_TICKS`]: if it then holds [`MORE`] more in flight, its arrivals did not change by
//! as much (more in flight because more arrived, a scale-in or a balancer's new weights, says
//! nothing), and latency rose by at most [`RISE`] of the target, the latency
//! it held was the upstream's own and becomes the verified no-load latency (`noload`; as with
//! any re-measure under load, the effort is then cut to `ENGAGED_EFFORT`); else the integral
//! resumes, and the replica may settle again after
//! [`REST_HOLD_TICKS`](super::noload::REST_HOLD_TICKS) (two seconds, as learning at rest holds
//! after shedding) and probe a second after
//! that. A probe whose replica stops being eligible midway (its effort reached 0, its latency
//! lost confidence) ends without a verdict and backs off the same way. Only a
//! replica holding [`MIN_INFLIGHT`] requests or more probes: one that holds a request or two
//! (one of many replicas) cannot tell a rise of its own from noise, and would take its
//! fleet's queue for the upstream's latency.

use super::tuning::Tuning;

// The probe's tuned values are defined with the controller's other constants
// (`constants.rs`), so that `tuning.rs` defaults to them without naming this module (which
// reads a `Tuning`); their paths stay here.
pub use super::constants::{MIN_INFLIGHT, MORE, PROBE_TICKS, RISE, SETTLE_TICKS, SETTLED, STEP};

/// What the controller sees of a cold replica at a tick.
#[derive(Debug, Clone, Copy)]
pub struct ProbeInput {
    /// The replica has not seen its upstream calm, its no-load latency is not verified, its
    /// latency signal has full confidence and it sheds (effort above 0).
    pub eligible: bool,
    /// Smoothed latency over the target, confidence-weighted (the controller's `lc`; 1.0 is
    /// at the target).
    pub latency_ratio: f64,
    /// The tick's mean in-flight count, requests.
    pub inflight: f64,
    /// Decisions per second over the tick: the arrivals this replica is offered.
    pub offered: f64,
}

/// What the controller does with the effort at a tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Nothing: the integral runs as usual.
    None,
    /// Lower the effort by [`STEP`] and hold it.
    Start,
    /// Hold the effort (the integral waits).
    Hold,
    /// The upstream had room: its latency, this share of the target, is the no-load latency.
    Verified(f64),
}

#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    ticks: u32,
    lc: f64,
    n: f64,
    offered: f64,
}

impl Sums {
    fn add(&mut self, t: &ProbeInput) {
        self.ticks += 1;
        self.lc += t.latency_ratio;
        self.n += t.inflight;
        self.offered += t.offered;
    }

    fn mean(&self) -> (f64, f64, f64) {
        let n = f64::from(self.ticks.max(1));
        (self.lc / n, self.n / n, self.offered / n)
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Settling(Sums),
    Probing {
        ticks: u32,
        base: Sums,
        measured: Sums,
    },
    Waiting(u32),
}

/// The probe's state machine, stepped once a tick.
#[derive(Debug, Clone, Copy)]
pub struct ColdProbe(State);

impl Default for ColdProbe {
    fn default() -> Self {
        ColdProbe(State::Settling(Sums::default()))
    }
}

impl ColdProbe {
    /// Folds in one tick and says what to do with the effort.
    /// `k`: the tuned values it reads ([`SETTLE_TICKS`] and the others of this module).
    pub fn update(&mut self, t: ProbeInput, k: &Tuning) -> Action {
        match &mut self.0 {
            State::Waiting(ticks) => {
                *ticks = ticks.saturating_sub(1);
                if *ticks == 0 {
                    *self = ColdProbe::default();
                }
                Action::None
            }
            State::Settling(sums) => {
                if !t.eligible || (t.latency_ratio - k.cold_setpoint).abs() > k.settled {
                    *self = ColdProbe::default();
                    return Action::None;
                }
                sums.add(&t);
                if sums.ticks < k.settle_ticks {
                    return Action::None;
                }
                let base = *sums;
                if base.mean().1 < k.min_inflight {
                    *self = ColdProbe(State::Waiting(k.rest_hold_ticks));
                    return Action::None;
                }
                self.0 = State::Probing {
                    ticks: 0,
                    base,
                    measured: Sums::default(),
                };
                Action::Start
            }
            State::Probing {
                ticks,
                base,
                measured,
            } => {
                if !t.eligible {
                    *self = ColdProbe(State::Waiting(k.rest_hold_ticks));
                    return Action::None;
                }
                *ticks += 1;
                if *ticks > k.probe_ticks / 2 {
                    measured.add(&t);
                }
                if *ticks < k.probe_ticks {
                    return Action::Hold;
                }
                let (base_lc, base_n, base_offered) = base.mean();
                let (lc, n, offered) = measured.mean();
                // Arrivals that moved by the growth the probe needs would explain it. This was a
                // constant of its own (0.2); at half (0.1, now) and twice the value the
                // ablation's scenarios and fleet report did not change (docs/pressure.md).
                let same_offer = (offered / base_offered.max(1e-9) - 1.0).abs() <= k.more;
                let room = same_offer && n >= base_n * (1.0 + k.more) && lc <= base_lc + k.rise;
                self.0 = State::Waiting(k.rest_hold_ticks);
                if room {
                    Action::Verified(base_lc)
                } else {
                    Action::None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(latency_ratio: f64, inflight: f64, offered: f64) -> ProbeInput {
        ProbeInput {
            eligible: true,
            latency_ratio,
            inflight,
            offered,
        }
    }

    /// Settles for a second at the target with `n` in flight, then runs the probe with
    /// `during` each tick; returns the actions of the probe's ticks.
    fn probe(n: f64, during: ProbeInput) -> Vec<Action> {
        let mut p = ColdProbe::default();
        for _ in 1..SETTLE_TICKS {
            assert_eq!(
                p.update(tick(1.0, n, 1000.0), &Tuning::DEFAULT),
                Action::None
            );
        }
        assert_eq!(
            p.update(tick(1.0, n, 1000.0), &Tuning::DEFAULT),
            Action::Start
        );
        (0..PROBE_TICKS)
            .map(|_| p.update(during, &Tuning::DEFAULT))
            .collect()
    }

    #[test]
    fn more_in_flight_answered_as_fast_verifies_the_latency() {
        let actions = probe(6.0, tick(1.02, 7.0, 1000.0));
        assert!(
            actions[..actions.len() - 1]
                .iter()
                .all(|a| *a == Action::Hold)
        );
        assert_eq!(actions.last(), Some(&Action::Verified(1.0)));
    }

    #[test]
    fn latency_rising_with_the_extra_requests_is_a_queue() {
        let actions = probe(6.0, tick(1.2, 7.0, 1000.0));
        assert_eq!(actions.last(), Some(&Action::None));
    }

    #[test]
    fn no_more_in_flight_says_nothing() {
        let actions = probe(6.0, tick(1.0, 6.3, 1000.0));
        assert_eq!(actions.last(), Some(&Action::None));
    }

    #[test]
    fn more_in_flight_because_more_arrived_says_nothing() {
        let actions = probe(6.0, tick(1.0, 9.0, 1500.0));
        assert_eq!(actions.last(), Some(&Action::None));
    }

    #[test]
    fn a_replica_holding_a_request_or_two_does_not_probe() {
        let mut p = ColdProbe::default();
        for _ in 0..(SETTLE_TICKS + Tuning::DEFAULT.rest_hold_ticks) * 3 {
            assert_eq!(
                p.update(tick(1.0, 1.5, 100.0), &Tuning::DEFAULT),
                Action::None
            );
        }
    }

    #[test]
    fn a_loop_not_settled_at_the_target_does_not_probe() {
        let mut p = ColdProbe::default();
        for i in 0..SETTLE_TICKS * 3 {
            let lc = if i % 10 == 9 { 1.3 } else { 1.0 };
            assert_eq!(
                p.update(tick(lc, 6.0, 1000.0), &Tuning::DEFAULT),
                Action::None
            );
        }
    }
}
