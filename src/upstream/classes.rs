//! Class budgets' counts: requests in flight per priority class, and the guard of one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::admission::Load;
use crate::policy::Class;

/// Requests in flight per class; wakes `never` requests waiting for room under a cap.
#[derive(Debug, Default)]
pub struct ClassLoad {
    inflight: [AtomicU32; 3],
    room: tokio::sync::Notify,
}

impl ClassLoad {
    /// The load the budgets see, given the total in flight and the capacity (no freshness
    /// floor: the decision of a device's fix sets its own).
    pub fn load(&self, total: u32, capacity: u32) -> Load {
        Load {
            class_inflight: std::array::from_fn(|i| self.inflight[i].load(Ordering::Relaxed)),
            total,
            capacity,
            floor: crate::admission::Floor::OFF,
        }
    }

    /// Counts a request of `class` in flight until the returned guard drops.
    pub fn start(self: &Arc<Self>, class: Class) -> ClassGuard {
        self.inflight[class.index()].fetch_add(1, Ordering::Relaxed);
        ClassGuard {
            load: Arc::clone(self),
            class,
        }
    }

    /// Takes a place in `class` if it has fewer than `limit` in flight, or if `full` says
    /// the upstream's capacity is not all taken: the check and the increment are one atomic
    /// step on the class count (`full` is asked only when the class is at its limit).
    pub fn try_start(
        self: &Arc<Self>,
        class: Class,
        limit: u32,
        full: impl Fn() -> bool,
    ) -> Option<ClassGuard> {
        let count = &self.inflight[class.index()];
        let mut current = count.load(Ordering::Relaxed);
        loop {
            if current >= limit && full() {
                return None;
            }
            match count.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(ClassGuard {
                        load: Arc::clone(self),
                        class,
                    });
                }
                Err(seen) => current = seen,
            }
        }
    }

    /// Resolves when a request of any class ends (a place may be free).
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }
}

/// One request in flight in a class; dropping it ends it and wakes waiters.
#[derive(Debug)]
pub struct ClassGuard {
    load: Arc<ClassLoad>,
    class: Class,
}

impl Drop for ClassGuard {
    fn drop(&mut self) {
        self.load.inflight[self.class.index()].fetch_sub(1, Ordering::Relaxed);
        self.load.room.notify_waiters();
    }
}
