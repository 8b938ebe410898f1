//! The upstream's own load report: the utilisation it states in each answer (the ORCA
//! `endpoint-load-metrics` response header, read by `crate::upstream::load_report`), the
//! same for every replica in front of it (docs/pressure.md "Load reports").

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

/// How long a load report counts after the last one arrived: a second, then the controller
/// steers on its own readings again (an upstream that stopped reporting, or a replica with
/// no traffic).
pub const REPORT_STALE: Duration = Duration::from_secs(1);

/// Largest utilisation one report counts as: a queue 15 times the upstream's workers deep.
/// The integral's error is at its clamp from 3.25 on (`SETPOINT + ERROR_CLAMP`), so past
/// this a deeper queue would only slow the smoothed value's fall; it bounds what one report
/// from a pod that writes a percentage (85 for 0.85) does to a tick's mean, and keeps a
/// tick's sum within the 44 bits of its window for the 2^20 reports its count holds
/// (16 × 10^6 < 2^24).
pub const MAX_REPORT: f64 = 16.0;

/// The ORCA metric read as the upstream's utilisation: in-flight over its concurrency, 1.0
/// with every worker busy and none waiting, above 1 with a queue (ORCA lets utilisations
/// pass 1.0 "when the usage exceeds the reporter dependent notion of soft limits",
/// `xds/data/orca/v3/orca_load_report.proto`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadReportField {
    /// `application_utilization`.
    Application,
    /// `cpu_utilization`: busy CPU says nothing of a queue once every core is busy; read it
    /// only from an upstream that reports its queue there.
    Cpu,
    /// `named_metrics.NAME`.
    Named(String),
}

impl FromStr for LoadReportField {
    type Err = String;

    /// `application_utilization`, `cpu_utilization` or `named_metrics.NAME` (NAME not
    /// empty).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "application_utilization" => Ok(LoadReportField::Application),
            "cpu_utilization" => Ok(LoadReportField::Cpu),
            _ => match s.strip_prefix("named_metrics.") {
                Some(name) if !name.is_empty() => Ok(LoadReportField::Named(name.to_owned())),
                _ => Err(format!(
                    "{s:?} is not an ORCA utilisation: application_utilization, \
                     cpu_utilization or named_metrics.NAME"
                )),
            },
        }
    }
}

impl fmt::Display for LoadReportField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadReportField::Application => f.write_str("application_utilization"),
            LoadReportField::Cpu => f.write_str("cpu_utilization"),
            LoadReportField::Named(name) => write!(f, "named_metrics.{name}"),
        }
    }
}

/// Load reports gathered between two ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReportWindow {
    /// Number of reports.
    pub count: u64,
    /// Sum of the reported utilisations, millionths (1.0 is 1,000,000).
    pub sum_millionths: u64,
}

/// The reported utilisation, smoothed over [`LATENCY_TAU`](super::LATENCY_TAU) like the
/// latency it stands beside: in-flight over the upstream's concurrency, 1.0 with every
/// worker busy and no queue, 1.25 with a queue a quarter of the workers deep.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LoadReport {
    value: f64,
    seen: Option<Instant>,
    /// What the last update returned: `value` while fresh.
    current: Option<f64>,
}

impl LoadReport {
    /// Folds in a tick's reports (smoothed over `tau`, [`LATENCY_TAU`](super::LATENCY_TAU)
    /// by default, across the tick's `dt` seconds; after a silence it starts again from the
    /// tick's mean, `super::follow`); the smoothed utilisation while a report arrived within
    /// [`REPORT_STALE`].
    #[expect(clippy::cast_precision_loss, reason = "counts below 2^52")]
    pub(super) fn update(
        &mut self,
        now: Instant,
        window: ReportWindow,
        dt: f64,
        tau: Duration,
    ) -> Option<f64> {
        if window.count > 0 {
            let mean = window.sum_millionths as f64 / window.count as f64 / 1e6;
            self.value = super::follow(self.value, mean, dt, tau, self.seen, now);
            self.seen = Some(now);
        }
        self.current = self
            .seen
            .filter(|&seen| now.saturating_duration_since(seen) <= REPORT_STALE)
            .map(|_| self.value);
        self.current
    }

    /// The smoothed utilisation as of the last update, while it was fresh.
    pub(super) fn current(&self) -> Option<f64> {
        self.current
    }
}

#[cfg(test)]
mod tests;
