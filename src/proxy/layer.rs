//! The layer: configuration only, shared by every service it builds.

use std::sync::Arc;

use tower::Layer;

use super::memory::BufferBudget;
use super::service::Admission;
use super::{AdmissionSettings, Shared};
use crate::live::PolicyStore;
use crate::upstream::LiveUpstreams;

/// Wraps a proxy service with admission control.
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    shared: Arc<Shared>,
}

impl AdmissionLayer {
    /// A layer deciding with the live policy and the pressure and budgets of each request's
    /// upstream in `upstreams` (read as one pair per request; `store` gives the clock) (the
    /// inner service gets each request with its upstream, a [`crate::upstream::Routed`]:
    /// [`crate::upstream::Dispatch`] sends it there), sheddable bodies drawing on `buffers`,
    /// devices remembered in `devices`, answers written to the access log and decided in the preview's shadow as `records`
    /// says. The clock and the draw are the store's ([`PolicyStore::sources`]): one per
    /// proxy.
    pub fn new(
        store: Arc<PolicyStore>,
        upstreams: Arc<LiveUpstreams>,
        buffers: Arc<BufferBudget>,
        devices: Arc<crate::devices::DeviceTable>,
        settings: AdmissionSettings,
        records: crate::record::Records,
    ) -> Self {
        AdmissionLayer {
            shared: Arc::new(Shared {
                store,
                settings,
                upstreams,
                buffers,
                devices,
                records,
            }),
        }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Admission<S> {
        Admission {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}
