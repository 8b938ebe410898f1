//! A client connection's place among the reusable ones (accepted with no request yet, or
//! parked between requests: `edge::descriptors` has the rule), which are closed oldest first
//! when descriptors run low: held in the connection's
//! [`Activity`](super::keepalive::Activity), queued and told to close by
//! [`Descriptors`](super::descriptors::Descriptors).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A connection's place among the reusable ones, held in its
/// [`Activity`](super::keepalive::Activity).
#[derive(Debug, Default)]
pub struct Reuse {
    /// Its key in the queue of reusable connections (when it became reusable), 0 when it is
    /// not queued.
    pub(super) key: AtomicU64,
    /// Set when the connection is told to close (to free a descriptor).
    pub(super) evicted: AtomicBool,
    /// The connection's task, woken when it is told.
    waker: Mutex<Option<Waker>>,
}

impl Reuse {
    /// Ready once the connection has been told to close; registers the task to be woken
    /// then. Cheap to poll on every wake of the task: one uncontended lock.
    pub fn poll_evicted(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.evicted.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        {
            let mut waker = lock(&self.waker);
            match &*waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        if self.evicted.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Whether the connection is queued as reusable now.
    pub fn queued(&self) -> bool {
        self.key.load(Ordering::Acquire) != 0
    }

    /// Resolves once the connection has been told to close ([`Reuse::poll_evicted`]).
    pub fn evicted(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_evicted(cx))
    }

    /// Tells the connection to close: marks it and wakes its task (a handshake displaced by
    /// newer ones, `edge::tls::handshakes`).
    pub(super) fn tell(&self) {
        self.evicted.store(true, Ordering::Release);
        self.wake();
    }

    /// Wakes the connection's task (after
    /// [`Descriptors::drain`](super::descriptors::Descriptors::drain) marked it told).
    pub(super) fn wake(&self) {
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }
}

/// The mutex's data, also after a panic while it was held (as in `descriptors.rs`).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
