//! The admission middleware: a tower layer that decides in `call` (never in `poll_ready`:
//! readiness-based shedding misfires under axum and on idle keep-alive connections), forwards
//! what it admits, and keeps in-flight accounting until the response body ends.
//!
//! It only gathers inputs — the stream, a policy snapshot, the body's facts, the pressure,
//! the clock, a random draw — and calls [`decide`](crate::admission::decide); the rule itself
//! lives in [`crate::admission`].
//!
//! One stage per file, in request order (as tower splits `limit` into layer, service and
//! future): `layer.rs` (configuration), `service.rs` (the framing check, then the branch),
//! `resolve.rs` (route and stream before the body), `read.rs` (a sheddable body read and
//! decided), `memory.rs` (the budget of buffered body bytes), `budget.rs` (class budgets
//! and the capped wait), `shed.rs` (the answer when either budget runs out), `forward.rs`
//! (in-flight accounting and the upstream call), `future.rs` (the response future),
//! `body.rs` (the body wrappers), and `record.rs` (the access log's entry and the preview's
//! shadow decision).

mod body;
mod budget;
mod forward;
mod future;
mod layer;
mod memory;
mod read;
mod record;
mod resolve;
mod service;
mod shed;

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;

pub use body::{GuardedBody, TimedBody};
pub use future::ResponseFuture;
pub use layer::AdmissionLayer;
pub use memory::BufferBudget;
pub use service::Admission;

use crate::admission::Load;
use crate::clock::Sources;
use crate::live::PolicyStore;
use crate::pressure::PressureGauge;
use crate::upstream::{ClassLoad, FreshnessBudget};

/// Request-path settings of the middleware.
#[derive(Debug, Clone)]
pub struct AdmissionSettings {
    /// Header carrying the stream name (default `X-Stream`).
    pub stream_header: HeaderName,
    /// Body size limit, bytes.
    pub max_body: u64,
    /// Time allowed to receive the whole request body.
    pub body_read_timeout: Duration,
    /// The ORCA metric read from answers as the upstream's utilisation (`--load-report`).
    pub load_report: Option<crate::upstream::load_report::LoadReportField>,
}

#[derive(Debug)]
struct Shared {
    store: Arc<PolicyStore>,
    pressure: Arc<PressureGauge>,
    settings: AdmissionSettings,
    /// In flight per class, for budgets.
    classes: Arc<ClassLoad>,
    /// Floor admissions in flight, for the freshness floor's budget.
    freshness: Arc<FreshnessBudget>,
    /// Buffered body bytes (`--max-buffered-bytes`).
    buffers: Arc<BufferBudget>,
    /// What this replica remembers of each device.
    devices: Arc<crate::devices::DeviceTable>,
    /// The local clock's offset from the upstream's, from responses' `Date` headers.
    skew: crate::clock::skew::ClockSkew,
    /// Whether an unreadable load report was logged at warn yet (later ones log at debug;
    /// the counter counts them all).
    load_report_warned: std::sync::atomic::AtomicBool,
    /// The access log and the policy preview.
    records: crate::record::Records,
}

impl Shared {
    /// The proxy's clock and draw: the policy store's.
    fn sources(&self) -> &Sources {
        self.store.sources()
    }

    /// Takes a sample of the upstream's clock from a response's `Date`, and reports a change
    /// of the correction: the gauges, and one log line when it engages, is released, or is
    /// disbelieved. A response without `Date`, or within a second of the last sample, costs
    /// a header lookup or a clock read and one atomic load.
    fn sample_clock(&self, metrics: &crate::metrics::Metrics, date: Option<&http::HeaderValue>) {
        use crate::clock::skew::Change;
        let Some(change) = date.and_then(|d| self.skew.sample(self.sources().now(), d)) else {
            return;
        };
        if let Some(ms) = self.skew.estimate() {
            metrics.clock_offset.set(crate::clock::millis_to_secs(ms));
        }
        metrics
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

    fn load(&self) -> Load {
        self.classes
            .load(self.pressure.inflight(), self.pressure.capacity())
    }
}
