//! The layer: configuration only, shared by every service it builds.

use std::sync::Arc;

use tower::Layer;

use super::memory::BufferBudget;
use super::service::Admission;
use super::{AdmissionSettings, Shared};
use crate::live::PolicyStore;
use crate::pressure::PressureGauge;
use crate::upstream::{ClassLoad, FreshnessBudget};

/// Wraps a proxy service with admission control.
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    shared: Arc<Shared>,
}

impl AdmissionLayer {
    /// A layer deciding with the live policy in `store` and the pressure in `pressure`,
    /// sheddable bodies drawing on `buffers`, devices remembered in `devices`, answers written
    /// to the access log and decided in the preview's shadow as `records` says. The clock and
    /// the draw are the store's ([`PolicyStore::sources`]): one per proxy.
    pub fn new(
        store: Arc<PolicyStore>,
        pressure: Arc<PressureGauge>,
        buffers: Arc<BufferBudget>,
        devices: Arc<crate::devices::DeviceTable>,
        settings: AdmissionSettings,
        records: crate::record::Records,
    ) -> Self {
        AdmissionLayer {
            shared: Arc::new(Shared {
                store,
                pressure,
                settings,
                classes: Arc::new(ClassLoad::default()),
                freshness: Arc::new(FreshnessBudget::default()),
                buffers,
                devices,
                skew: crate::clock::skew::ClockSkew::default(),
                load_report_warned: std::sync::atomic::AtomicBool::new(false),
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
