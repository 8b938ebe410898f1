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
pub use memory::{BufferBudget, Charge, IDLE_AFTER};
pub use service::Admission;

use crate::clock::Sources;
use crate::live::PolicyStore;
use crate::upstream::LiveUpstreams;

/// Request-path settings of the middleware.
#[derive(Debug, Clone)]
pub struct AdmissionSettings {
    /// Header carrying the stream name (default `X-Stream`).
    pub stream_header: HeaderName,
    /// Body size limit, bytes.
    pub max_body: u64,
    /// Time allowed to receive the whole request body.
    pub body_read_timeout: Duration,
}

#[derive(Debug)]
struct Shared {
    store: Arc<PolicyStore>,
    settings: AdmissionSettings,
    /// The upstreams requests go to, each with its own pressure, class and freshness
    /// budgets, clock and client, read with the policy they were built for (each request
    /// loads the pair once).
    upstreams: Arc<LiveUpstreams>,
    /// Buffered body bytes (`--max-buffered-bytes`).
    buffers: Arc<BufferBudget>,
    /// What this replica remembers of each device.
    devices: Arc<crate::devices::DeviceTable>,
    /// The access log and the policy preview.
    records: crate::record::Records,
}

impl Shared {
    /// The proxy's clock and draw: the policy store's.
    fn sources(&self) -> &Sources {
        self.store.sources()
    }
}
