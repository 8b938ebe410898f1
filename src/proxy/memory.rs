//! The proxy's own memory: a budget of buffered body bytes (`--max-buffered-bytes`) that every
//! sheddable body read draws on, frame by frame, so a thousand slow senders cannot hold a
//! gigabyte (docs/responses.md "The proxy's own resources"). A body that would take the
//! total over the budget is shed with reason `memory` (503 + `Retry-After`); `never` streams
//! named in a header stream through unbuffered and never draw on it.
//!
//! The seed's shedder sheds on its own memory as well as on queue depth (seed 002).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::BoxError;

/// Buffered body bytes: the limit and what is held now. Shared by every request of a proxy.
#[derive(Debug)]
pub struct BufferBudget {
    limit: u64,
    used: AtomicU64,
}

impl BufferBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        BufferBudget {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// Bytes held now by bodies being read or forwarded.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Takes `n` bytes if that keeps the total within the limit.
    fn try_take(&self, n: u64) -> bool {
        let mut current = self.used.load(Ordering::Relaxed);
        loop {
            let next = current.saturating_add(n);
            if next > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// One request's share of the budget: what its body has taken so far, given back when the
/// last clone is dropped (after the body was read and forwarded, or refused).
#[derive(Debug, Clone)]
pub(super) struct Reservation(Arc<Held>);

#[derive(Debug)]
struct Held {
    budget: Arc<BufferBudget>,
    bytes: AtomicU64,
}

impl Reservation {
    pub(super) fn new(budget: Arc<BufferBudget>) -> Self {
        Reservation(Arc::new(Held {
            budget,
            bytes: AtomicU64::new(0),
        }))
    }

    fn take(&self, n: u64) -> bool {
        let ok = self.0.budget.try_take(n);
        if ok {
            self.0.bytes.fetch_add(n, Ordering::Relaxed);
        }
        ok
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(*self.bytes.get_mut());
    }
}

/// The error a [`Budgeted`] body ends with when the budget is spent.
#[derive(Debug, thiserror::Error)]
#[error("the budget of buffered body bytes is spent")]
pub(super) struct OverBudget;

/// A body whose data frames are taken from a [`Reservation`] as they arrive.
#[derive(Debug)]
pub(super) struct Budgeted<B> {
    inner: B,
    reservation: Reservation,
}

impl<B> Budgeted<B> {
    pub(super) fn new(inner: B, reservation: Reservation) -> Self {
        Budgeted { inner, reservation }
    }
}

impl<B> HttpBody for Budgeted<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if this.reservation.take(n) {
                    Poll::Ready(Some(Ok(frame)))
                } else {
                    Poll::Ready(Some(Err(Box::new(OverBudget))))
                }
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_take_within_the_limit_and_give_back_on_drop() {
        let budget = Arc::new(BufferBudget::new(100));
        let a = Reservation::new(Arc::clone(&budget));
        let b = Reservation::new(Arc::clone(&budget));
        assert!(a.take(60));
        assert!(!b.take(41), "over the limit");
        assert!(b.take(40));
        assert_eq!(budget.used(), 100);
        let a2 = a.clone();
        drop(a);
        assert_eq!(budget.used(), 100, "a clone still holds it");
        drop(a2);
        assert_eq!(budget.used(), 40);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
