//! Everything one upstream owns: its client, its pressure, its class and freshness budgets,
//! its clock, how its load reports are read, and its metric series. Nothing here is shared between upstreams
//! (one control loop per resource it protects); what one process shares (the policy, the
//! buffered-bytes budget, the device table, the descriptors) lives elsewhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Proxy;
use super::account::Account;
use super::classes::ClassLoad;
use super::freshness::FreshnessBudget;
use super::load_report::LoadReportField;
use super::settings::{ClientOptions, Settings};
use crate::admission::Load;
use crate::clock::Sources;
use crate::clock::skew::{Change, ClockSkew};
use crate::metrics::{Metrics, UpstreamMetrics};
use crate::pressure::PressureGauge;

/// One upstream and the state it owns: the requests bound to it are decided against its
/// pressure and its budgets, sent through its client, and judged by its clock.
#[derive(Debug)]
pub struct Upstream {
    /// Its name (`default` for `--upstream`).
    pub name: Arc<str>,
    /// Its settings, the policy's merged with the command line's.
    pub settings: Settings,
    /// Its account of the buffered body bytes, kept across reloads that keep its name.
    pub account: Arc<Account>,
    /// The pooled client that sends requests to it (pool, authority, path prefix, timeout).
    pub proxy: Proxy,
    /// Its pressure: the controller fed by its latencies, in-flight count and load reports.
    pub pressure: Arc<PressureGauge>,
    /// Its requests in flight per class, for class budgets.
    pub classes: Arc<ClassLoad>,
    /// Its floor admissions in flight, for the freshness floor's budget.
    pub freshness: Arc<FreshnessBudget>,
    /// The local clock's offset from its clock, from its responses' `Date` headers.
    pub skew: ClockSkew,
    /// The ORCA metric read from its answers as its utilisation (`--load-report`), if any.
    pub load_report: Option<LoadReportField>,
    /// Its series, labelled `upstream="NAME"`: pressure, in-flight count, rank cut-off,
    /// shedding seconds, latency, clock and load reports.
    pub metrics: UpstreamMetrics,
    /// Whether an unreadable load report was logged at warn yet (later ones log at debug;
    /// the counter counts them all).
    load_report_warned: AtomicBool,
}

// === impl Upstream ===

impl Upstream {
    /// An upstream named `name`, of `settings`, reached through a client of `client`'s,
    /// its bodies charged to `account`, its series registered in `metrics`; cold, as at
    /// start: its pressure learned nothing yet, its budgets empty, its clock not sampled.
    pub fn build(
        name: &str,
        settings: Settings,
        client: &ClientOptions,
        account: Arc<Account>,
        metrics: &Metrics,
    ) -> Self {
        Upstream {
            name: name.into(),
            proxy: client.proxy(&settings),
            pressure: Arc::new(PressureGauge::new(settings.controller)),
            classes: Arc::new(ClassLoad::default()),
            freshness: Arc::new(FreshnessBudget::default()),
            skew: ClockSkew::default(),
            load_report: settings.load_report.clone(),
            metrics: UpstreamMetrics::new(metrics, name),
            load_report_warned: AtomicBool::new(false),
            settings,
            account,
        }
    }

    /// This upstream reached anew, as `settings` say (a new URL or timeouts; the controller's
    /// settings as its own, [`Settings::same_controller`]): a new client with a pool of its
    /// own and a clock not yet sampled (the host may be another), and the same pressure,
    /// budgets, account and series, so the requests in flight to the old client stay
    /// counted where the new ones are.
    pub fn reached_anew(&self, settings: Settings, client: &ClientOptions) -> Self {
        Upstream {
            name: Arc::clone(&self.name),
            proxy: client.proxy(&settings),
            pressure: Arc::clone(&self.pressure),
            classes: Arc::clone(&self.classes),
            freshness: Arc::clone(&self.freshness),
            skew: ClockSkew::default(),
            load_report: self.load_report.clone(),
            metrics: self.metrics.clone(),
            load_report_warned: AtomicBool::new(self.load_report_warned.load(Ordering::Relaxed)),
            settings,
            account: Arc::clone(&self.account),
        }
    }

    /// This upstream with a new controller, as `settings` say (a new latency target,
    /// in-flight cap or load report; the URL and timeouts may be new too): the controller
    /// cold, as at start (nothing learned, no pin), a new client, its clock not yet sampled;
    /// but the counts of its load carry over, since they describe the upstream, not the
    /// controller: the new gauge shares the old one's in-flight count
    /// ([`PressureGauge::succeeding`]) and the class and freshness budgets are the same, so
    /// the requests in flight under the old controller still take their places under the
    /// cap and the budgets, and free them when they end. Its account and series are kept.
    pub fn controlled_anew(&self, settings: Settings, client: &ClientOptions) -> Self {
        Upstream {
            name: Arc::clone(&self.name),
            proxy: client.proxy(&settings),
            pressure: Arc::new(PressureGauge::succeeding(
                settings.controller,
                &self.pressure,
            )),
            classes: Arc::clone(&self.classes),
            freshness: Arc::clone(&self.freshness),
            skew: ClockSkew::default(),
            load_report: settings.load_report.clone(),
            metrics: self.metrics.clone(),
            load_report_warned: AtomicBool::new(false),
            settings,
            account: Arc::clone(&self.account),
        }
    }

    /// The load its budgets see now: its requests in flight per class, in all, and its
    /// capacity (no freshness floor: the decision of a device's fix sets its own).
    pub fn load(&self) -> Load {
        self.classes
            .load(self.pressure.inflight(), self.pressure.capacity())
    }

    /// Takes a sample of its clock from a response's `Date`, and reports a change of the
    /// correction: the gauges, and one log line when it engages, is released, or is
    /// disbelieved. A response without `Date`, or within a second of the last sample, costs
    /// a header lookup or a clock read (of `sources`) and one atomic load.
    pub fn sample_clock(&self, sources: &Sources, date: Option<&http::HeaderValue>) {
        let Some(change) = date.and_then(|d| self.skew.sample(sources.now(), d)) else {
            return;
        };
        if let Some(ms) = self.skew.estimate() {
            self.metrics
                .clock_offset
                .set(crate::clock::millis_to_secs(ms));
        }
        self.metrics
            .clock_corrected
            .set(if self.skew.corrected() { 1.0 } else { 0.0 });
        match change {
            Change::None => {}
            Change::Engaged(ms) => tracing::warn!(
                offset_ms = ms,
                "the local clock is off from the upstream's Date by more than 5 s: event \
                 ages are judged against the upstream's clock until it agrees again"
            ),
            Change::Released => {
                tracing::info!("the local clock agrees with the upstream's again");
            }
            Change::Disbelieved(ms) => tracing::warn!(
                offset_ms = ms,
                "the upstream's Date is more than 24 h off the local clock: neither is \
                 believed, event ages are judged against the local clock"
            ),
        }
    }

    /// Feeds its load report in an answer's `headers` to its controller and counts it, when
    /// one is read (`--load-report`); a report that is there but unreadable is counted,
    /// logged (at warn the first time, then at debug), and not read: the controller steers
    /// on its own readings while none is fresh.
    pub fn read_load_report(&self, headers: &http::HeaderMap) {
        let Some(field) = &self.load_report else {
            return;
        };
        match super::load_report::read(headers, field) {
            Ok(None) => {}
            Ok(Some(utilisation)) => {
                self.pressure.record_load_report(utilisation);
                self.metrics.load_report(true);
            }
            Err(error) => {
                self.metrics.load_report(false);
                if self.load_report_warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, "upstream load report not read");
                } else {
                    tracing::warn!(
                        %error,
                        "upstream load report not read (counted in \
                         shedgate_upstream_load_reports_total{{outcome=\"invalid\"}}; \
                         later ones log at debug)"
                    );
                }
            }
        }
    }
}
