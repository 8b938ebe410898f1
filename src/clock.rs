//! Time for the logic: wall-clock unix milliseconds, read only through the seam here.

/// Unix time in milliseconds (UTC). Signed: times before 1970 are representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMillis(pub i64);

impl UnixMillis {
    /// The current system time. Only the edges (middleware, CLI) call this; decision code
    /// takes `now` as an argument.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        UnixMillis(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// Milliseconds from `earlier` to `self` (negative when `earlier` is later).
    pub fn since(self, earlier: UnixMillis) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}
