//! One upstream's series: its pressure, its controller's state, its latency, its clock and
//! its load reports, each labelled `upstream="NAME"` with the policy's name for it (at most
//! [`crate::policy::MAX_UPSTREAMS`] names, so the series stay bounded by the policy).

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label};

use super::{
    CLOCK_CORRECTED, CLOCK_OFFSET, CLOCK_PROBES, INFLIGHT, Metrics, PRESSURE, PRESSURE_PINNED,
    RANK_CUTOFF, SHEDDING_SECONDS, UPSTREAM_LATENCY, UPSTREAM_LOAD_REPORTS,
};

/// The handles of one upstream's series, registered once when the upstream is built (a
/// handle costs a few nanoseconds to use; a `counter!` macro with a dynamic label about a
/// hundred). Registering the same name again on the same [`Metrics`] gives handles to the
/// same series, so an upstream built anew under its old name continues its counts.
#[derive(Clone)]
pub struct UpstreamMetrics {
    /// [`PRESSURE`].
    pub pressure: Gauge,
    /// [`PRESSURE_PINNED`].
    pub pressure_pinned: Gauge,
    /// [`INFLIGHT`].
    pub inflight: Gauge,
    /// [`RANK_CUTOFF`].
    pub rank_cutoff: Gauge,
    /// [`SHEDDING_SECONDS`].
    pub shedding_seconds: Counter,
    /// [`UPSTREAM_LATENCY`].
    latency: Histogram,
    /// [`CLOCK_OFFSET`].
    pub clock_offset: Gauge,
    /// [`CLOCK_CORRECTED`].
    pub clock_corrected: Gauge,
    /// [`CLOCK_PROBES`].
    pub clock_probes: Counter,
    /// [`UPSTREAM_LOAD_REPORTS`]: `read`, `invalid`.
    load_reports: [Counter; 2],
}

impl std::fmt::Debug for UpstreamMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamMetrics").finish_non_exhaustive()
    }
}

// === impl UpstreamMetrics ===

impl UpstreamMetrics {
    /// The series of the upstream named `name` (a policy name, or `default`) in `metrics`,
    /// with its rank cut-off at 100 (nothing shed) until its first tick.
    pub fn new(metrics: &Metrics, name: &str) -> Self {
        let label = || vec![Label::new("upstream", name.to_owned())];
        let gauge = |key: &'static str| metrics.gauge(key, label());
        let counter = |key: &'static str| metrics.counter(key, label());
        let load_reports = ["read", "invalid"].map(|outcome| {
            metrics.counter(
                UPSTREAM_LOAD_REPORTS,
                vec![
                    Label::new("upstream", name.to_owned()),
                    Label::new("outcome", outcome),
                ],
            )
        });
        let m = UpstreamMetrics {
            pressure: gauge(PRESSURE),
            pressure_pinned: gauge(PRESSURE_PINNED),
            inflight: gauge(INFLIGHT),
            rank_cutoff: gauge(RANK_CUTOFF),
            shedding_seconds: counter(SHEDDING_SECONDS),
            latency: metrics.histogram(UPSTREAM_LATENCY, label()),
            clock_offset: gauge(CLOCK_OFFSET),
            clock_corrected: gauge(CLOCK_CORRECTED),
            clock_probes: counter(CLOCK_PROBES),
            load_reports,
        };
        m.rank_cutoff.set(100.0);
        m
    }

    /// Records a latency sample: the time the upstream took to its response headers.
    pub fn observe_latency(&self, latency: Duration) {
        self.latency.record(latency.as_secs_f64());
    }

    /// Counts a load report of the upstream: read, or there but not readable.
    pub fn load_report(&self, read: bool) {
        self.load_reports[usize::from(!read)].increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two upstreams on one recorder are two sets of series, each labelled with its own
    /// name: what one records never shows on the other's.
    #[test]
    fn each_upstream_has_its_own_series() {
        let metrics = Metrics::new();
        let default = UpstreamMetrics::new(&metrics, "default");
        let billing = UpstreamMetrics::new(&metrics, "billing");
        default.pressure.set(0.25);
        billing.pressure.set(0.75);
        billing.pressure_pinned.set(1.0);
        billing.inflight.set(7.0);
        default.observe_latency(Duration::from_millis(3));
        billing.load_report(false);
        billing.clock_probes.increment(2);
        let text = metrics.render();
        for line in [
            "shedgate_pressure{upstream=\"default\"} 0.25",
            "shedgate_pressure{upstream=\"billing\"} 0.75",
            "shedgate_pressure_pinned{upstream=\"default\"} 0",
            "shedgate_pressure_pinned{upstream=\"billing\"} 1",
            "shedgate_inflight_requests{upstream=\"billing\"} 7",
            "shedgate_rank_cutoff{upstream=\"default\"} 100",
            "shedgate_rank_cutoff{upstream=\"billing\"} 100",
            "shedgate_upstream_latency_seconds_count{upstream=\"default\"} 1",
            "shedgate_upstream_load_reports_total{upstream=\"billing\",outcome=\"invalid\"} 1",
            "shedgate_upstream_load_reports_total{upstream=\"default\",outcome=\"invalid\"} 0",
            "shedgate_clock_probes_total{upstream=\"billing\"} 2",
            "shedgate_clock_probes_total{upstream=\"default\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // No series of these metrics without the label.
        assert!(
            !text.lines().any(|l| l.starts_with("shedgate_pressure ")
                || l.starts_with("shedgate_inflight_requests ")),
            "{text}"
        );
        // Built again under its name, an upstream continues its series.
        let again = UpstreamMetrics::new(&metrics, "billing");
        again.clock_probes.increment(1);
        assert!(
            metrics
                .render()
                .lines()
                .any(|l| l == "shedgate_clock_probes_total{upstream=\"billing\"} 3")
        );
    }
}
