//! The upstreams of one proxy, by [`UpstreamId`]: the table the request path, the pressure
//! tick and the admin listener reach each upstream's state by, one per upstream of the policy
//! it was built for (`default`, `--upstream`, first), at the policy's own ids.
//!
//! A table is built whole and never changed in place: the `Arc<Upstream>`s in it are what a
//! request holds while it is in flight, so a table built anew can replace it without taking
//! an upstream away from a request that was sent to it.

use std::sync::Arc;

use super::state::Upstream;
use crate::live::store::Snapshot;

pub use crate::policy::{DEFAULT_UPSTREAM, UpstreamId};

/// The upstreams of a proxy, by [`UpstreamId`]. Cheap to clone (one reference count); the
/// clones share the table.
#[derive(Debug, Clone)]
pub struct Upstreams {
    table: Arc<[Arc<Upstream>]>,
}

// === impl Upstreams ===

impl Upstreams {
    /// A table of `upstreams`, the one at index `i` the policy's [`UpstreamId`] `i` (the
    /// default first; [`crate::policy::Policy::upstreams`] lists them in that order).
    ///
    /// # Panics
    /// With no upstream at all (every table has the default).
    pub fn new(upstreams: Vec<Arc<Upstream>>) -> Self {
        assert!(!upstreams.is_empty(), "an upstream table holds the default");
        Upstreams {
            table: upstreams.into(),
        }
    }

    /// The upstream named `name`, if the table has one: a scan of at most
    /// [`crate::policy::MAX_UPSTREAMS`] names, for the admin listener (the request path
    /// indexes by id).
    pub fn named(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.table.iter().find(|up| &*up.name == name)
    }

    /// The default upstream (`--upstream`).
    pub fn default_upstream(&self) -> &Arc<Upstream> {
        &self[UpstreamId::DEFAULT]
    }

    /// The upstream `id` names, if the table has one there.
    pub fn get(&self, id: UpstreamId) -> Option<&Arc<Upstream>> {
        self.table.get(id.index())
    }

    /// Every upstream, in id order (the default first).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.table.iter()
    }
}

impl std::ops::Index<UpstreamId> for Upstreams {
    type Output = Arc<Upstream>;

    /// The upstream `id` names. Ids come from the table they index (the default is always
    /// there), so none is out of range.
    fn index(&self, id: UpstreamId) -> &Arc<Upstream> {
        &self.table[id.index()]
    }
}

/// A policy snapshot and the upstream table built for it: what a request reads, once, as one
/// pair, so the [`UpstreamId`]s the policy gives it index the table they were issued for
/// (a reload that adds or removes an upstream renumbers them). Derefs to the snapshot.
#[derive(Debug)]
pub struct Routing {
    /// The policy and its metric handles.
    pub snapshot: Arc<Snapshot>,
    /// Its upstreams, at its ids.
    pub upstreams: Upstreams,
}

impl std::ops::Deref for Routing {
    type Target = Snapshot;

    fn deref(&self) -> &Snapshot {
        &self.snapshot
    }
}
