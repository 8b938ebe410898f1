//! The reload debounce as a pure state machine over event times: when a burst of file
//! events has gone quiet long enough to read the directory.

use std::time::Duration;

use tokio::time::Instant;

/// Quiet time after the last file event before reading.
pub const DEBOUNCE: Duration = Duration::from_millis(250);
/// Longest wait for a quiet directory, from the first event of a burst: a file written to
/// continuously must not postpone the reload forever.
pub const MAX_QUIET_WAIT: Duration = Duration::from_secs(5);

/// One burst of file events. The directory counts as quiet at [`Quiet::deadline`]:
/// [`DEBOUNCE`] after the last event, and never later than [`MAX_QUIET_WAIT`] after the
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiet {
    first: Instant,
    last: Instant,
}

impl Quiet {
    /// A burst whose first event came at `at`.
    pub fn new(at: Instant) -> Self {
        Quiet {
            first: at,
            last: at,
        }
    }

    /// Another event of the burst, at `at` (an earlier time than the last changes nothing).
    pub fn event(&mut self, at: Instant) {
        self.last = self.last.max(at);
    }

    /// When to read the directory if no further event comes.
    pub fn deadline(&self) -> Instant {
        (self.last + DEBOUNCE).min(self.first + MAX_QUIET_WAIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_event_waits_the_debounce() {
        let t0 = Instant::now();
        assert_eq!(Quiet::new(t0).deadline(), t0 + DEBOUNCE);
    }

    #[tokio::test(start_paused = true)]
    async fn each_event_restarts_the_wait() {
        let t0 = Instant::now();
        let mut q = Quiet::new(t0);
        q.event(t0 + Duration::from_millis(200));
        assert_eq!(q.deadline(), t0 + Duration::from_millis(200) + DEBOUNCE);
        q.event(t0 + Duration::from_millis(100));
        assert_eq!(
            q.deadline(),
            t0 + Duration::from_millis(200) + DEBOUNCE,
            "an event out of order does not move the deadline back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_continuous_writer_is_read_after_the_longest_wait() {
        let t0 = Instant::now();
        let mut q = Quiet::new(t0);
        let mut at = t0;
        while at < t0 + Duration::from_secs(20) {
            at += Duration::from_millis(100);
            q.event(at);
            assert!(q.deadline() <= t0 + MAX_QUIET_WAIT);
        }
        assert_eq!(q.deadline(), t0 + MAX_QUIET_WAIT);
    }
}
