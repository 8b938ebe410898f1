//! The clock and random seam: wall-clock unix milliseconds and uniform random draws, read
//! only through [`Sources`], so that tests inject both.
//!
//! Monotonic time is `tokio::time::Instant`, which tests control with paused tokio time
//! (`#[tokio::test(start_paused = true)]`); `std::time::Instant::now` and
//! `std::time::SystemTime::now` are banned outside this file by `clippy.toml`.

use std::fmt;
use std::sync::Arc;

pub mod skew;

/// Unix time in milliseconds (UTC). Signed: times before 1970 are representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct UnixMillis(pub i64);

impl UnixMillis {
    /// The system's wall clock. Only [`Sources::system`] reads it; everything else is given
    /// a [`Sources`] or takes `now` as an argument.
    #[expect(clippy::disallowed_methods, reason = "the Sources seam's wall clock")]
    fn system() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        UnixMillis(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// Milliseconds from `earlier` to `self` (negative when `earlier` is later).
    pub fn since(self, earlier: UnixMillis) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Unix seconds, with fractions (for gauges).
    pub fn as_secs_f64(self) -> f64 {
        millis_to_secs(self.0)
    }
}

/// A duration or offset in milliseconds as seconds, with fractions: the one conversion
/// behind every seconds-valued metric and explanation.
pub fn millis_to_secs(ms: i64) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "exact below 2^52 ms")]
    let secs = ms as f64 / 1000.0;
    secs
}

/// The wall clock and the random draw that the request path, the policy store, the admin
/// listener and the CLI read. Cloning is cheap (two `Arc`s).
#[derive(Clone)]
pub struct Sources {
    clock: Arc<dyn Fn() -> UnixMillis + Send + Sync>,
    draw: Arc<dyn Fn() -> f64 + Send + Sync>,
}

impl Sources {
    /// The system wall clock and `fastrand`'s thread-local generator.
    #[expect(clippy::disallowed_methods, reason = "the Sources seam's random draw")]
    pub fn system() -> Self {
        Sources::new(UnixMillis::system, fastrand::f64)
    }

    /// Sources from a clock and a draw. `draw` must return values in `[0, 1)`.
    pub fn new(
        clock: impl Fn() -> UnixMillis + Send + Sync + 'static,
        draw: impl Fn() -> f64 + Send + Sync + 'static,
    ) -> Self {
        Sources {
            clock: Arc::new(clock),
            draw: Arc::new(draw),
        }
    }

    /// The same draw with another wall clock (a test's fixed instant, say).
    #[must_use]
    pub fn with_clock(self, clock: impl Fn() -> UnixMillis + Send + Sync + 'static) -> Self {
        Sources {
            clock: Arc::new(clock),
            draw: self.draw,
        }
    }

    /// The wall clock now.
    pub fn now(&self) -> UnixMillis {
        (self.clock)()
    }

    /// A uniform random draw in `[0, 1)`.
    pub fn draw(&self) -> f64 {
        (self.draw)()
    }
}

impl Default for Sources {
    fn default() -> Self {
        Sources::system()
    }
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}
