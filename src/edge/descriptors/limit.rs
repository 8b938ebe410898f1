//! The open-files limit: read, raised to the hard one at start, and checked against what the
//! configured connections need (`edge::descriptors`).

use super::reserve_for;

/// Client connections assumed for the start-up check when `--max-inflight` is not set: the
/// soft limit systemd gives services.
pub const NOMINAL_CONNECTIONS: u64 = 1024;

/// The open-files limits (`RLIMIT_NOFILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The soft limit: what the process may open.
    pub soft: u64,
    /// The hard limit: how far the process may raise the soft one.
    pub hard: u64,
}

/// The process's open-files limits now, `None` where they cannot be read.
pub fn current_limits() -> Option<Limits> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, hard)| Limits { soft, hard })
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Raises the soft open-files limit to the hard one (`rlimit::increase_nofile_limit`);
/// returns the limits before and after.
///
/// # Errors
/// The limits cannot be read or set (`getrlimit`/`setrlimit`'s error).
pub fn raise_limit() -> std::io::Result<(Limits, Limits)> {
    #[cfg(unix)]
    {
        let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
        let raised = rlimit::increase_nofile_limit(hard)?;
        Ok((Limits { soft, hard }, Limits { soft: raised, hard }))
    }
    #[cfg(not(unix))]
    {
        Err(std::io::Error::other(
            "no open-files limit on this platform",
        ))
    }
}

/// Descriptors the configuration needs under a limit of `limit`: two for each request in
/// flight (the client's connection and the upstream's), up to `--max-inflight`, or
/// [`NOMINAL_CONNECTIONS`] without it, plus the reserve. Idle connections need none: they
/// are closed when descriptors run low.
pub fn needed(max_inflight: Option<u32>, limit: u64) -> u64 {
    let connections = max_inflight.map_or(NOMINAL_CONNECTIONS, u64::from);
    2 * connections + reserve_for(limit)
}

/// Raises the soft limit at start and logs it: the limits before and after at info, a
/// warning when it cannot be raised, and one when the hard limit is below what [`needed`]
/// says.
pub fn raise_and_log(max_inflight: Option<u32>) {
    match raise_limit() {
        Ok((before, after)) if before.soft < after.soft => tracing::info!(
            soft_before = before.soft,
            soft = after.soft,
            hard = after.hard,
            "open-files limit: soft raised to the hard limit"
        ),
        Ok((_, after)) => tracing::info!(
            soft = after.soft,
            hard = after.hard,
            "open-files limit: soft already at the hard limit"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-files soft limit"),
    }
    if let Some(after) = current_limits() {
        let needed = needed(max_inflight, after.hard);
        if after.hard < needed {
            tracing::warn!(
                hard = after.hard,
                needed,
                "open-files hard limit below what the configured connections need (two \
                 a request in flight, --max-inflight or 1024, plus a reserve): raise \
                 LimitNOFILE or the container's nofile ulimit"
            );
        }
    }
}
