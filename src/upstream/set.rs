//! The upstreams of one proxy, by [`UpstreamId`]: the table the request path, the pressure
//! tick and the admin listener reach each upstream's state by. Today it holds one upstream,
//! `default` (`--upstream`).
//!
//! A table is built whole and never changed in place: the `Arc<Upstream>`s in it are what a
//! request holds while it is in flight, so a table built anew can replace it without taking
//! an upstream away from a request that was sent to it.

use std::sync::Arc;

use super::state::Upstream;

/// The name of the upstream `--upstream` names.
pub const DEFAULT_NAME: &str = "default";

/// An upstream's place in its [`Upstreams`] table: an index, so the request path reaches an
/// upstream without hashing a name. [`UpstreamId::DEFAULT`] is always `default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamId(u16);

// === impl UpstreamId ===

impl UpstreamId {
    /// The default upstream (`--upstream`), first in every table.
    pub const DEFAULT: UpstreamId = UpstreamId(0);

    /// The index in the table.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The upstreams of a proxy, by [`UpstreamId`]. Cheap to clone (one reference count); the
/// clones share the table.
#[derive(Debug, Clone)]
pub struct Upstreams {
    table: Arc<[Arc<Upstream>]>,
}

// === impl Upstreams ===

impl Upstreams {
    /// A table of one upstream, the default one (named [`DEFAULT_NAME`]).
    pub fn of_default(default: Upstream) -> Self {
        Upstreams {
            table: Arc::new([Arc::new(default)]),
        }
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
