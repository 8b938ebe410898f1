//! The proxy's own memory: a budget of buffered body bytes (`--max-buffered-bytes`) that every
//! sheddable body read draws on, frame by frame, so a thousand slow senders cannot hold a
//! gigabyte (docs/responses.md "The proxy's own resources"). A body that would take the
//! total over the budget, or its upstream past its share into a busy upstream's
//! ([`BufferBudget`]), is shed with reason `memory` (503 + `Retry-After`); `never` streams
//! named in a header stream through unbuffered and never draw on it.
//!
//! The seed's shedder sheds on its own memory as well as on queue depth (seed 002); the
//! shares borrow as class budgets do (docs/decision.md "Priority classes and budgets").

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::BoxError;

/// Buffered body bytes: the process-wide limit, what is held now, and each upstream's
/// account of it. Shared by every request of a proxy.
///
/// Each upstream has a **share** of the limit, in proportion to its in-flight capacity
/// ([`BufferBudget::rebalance`], every pressure tick; equal shares until one is learned), and
/// a body bound for it takes memory from its account:
///
/// - within its share it always may, so long as the process total stays within the limit;
/// - past its share it borrows, but only memory no *active* upstream's share claims:
///   `claimed = Σ_u max(used_u, share_u)` over the accounts in use within the last
///   [`IDLE_AFTER`] (plus `used_u` of the idle ones) stays within the limit. An upstream whose
///   slow bodies hold memory cannot take what a busy upstream's share needs; an upstream
///   alone uses the whole limit. An idle upstream's share is lent: the first body it takes
///   claims the share back at once, and what a borrower already holds returns as its bodies
///   end (a borrower takes no more while the claim is over the limit).
/// - A body whose upstream is not known before it is read (its stream named in the body,
///   its route naming no upstream) is charged to the **unrouted** account. Where the policy
///   allows such bodies (`unrouted` in [`BufferBudget::rebalance`]: a route naming no
///   upstream while a stream names one other than `default`), it has a share as an upstream
///   of the mean capacity has, claimed and lent as theirs are, so busy upstreams never starve
///   those routes; elsewhere its share is 0.
///
/// The total is a hard limit (a compare-and-swap on it). Cost per data frame: one relaxed
/// load of the account's flags and share, one `fetch_add` on its bytes, one `fetch_add` on
/// the claim only when the frame takes the account past its share, and the CAS on the total;
/// no lock. Measured uncontended (a copy of this code built with `rustc -O`, one thread, on a
/// busy 2-core host): a take and its give-back 55–70 ns, within the share or borrowing,
/// against 27–35 ns for one process-wide counter. A share change races frames in flight: [`BufferBudget::rebalance`] recomputes the
/// claim from the accounts, so an error lasts at most one tick.
#[derive(Debug)]
pub struct BufferBudget {
    limit: u64,
    used: AtomicU64,
    /// `Σ_u max(used_u, share_u)` over claiming accounts, `used_u` over the others; signed, as
    /// racing updates may briefly take it below 0.
    claimed: AtomicI64,
    /// One per upstream account ([`crate::upstream::Upstream::account`]); the unrouted one
    /// last.
    accounts: Box<[Account]>,
}

/// The ticks ([`crate::pressure::TICK`], 50 ms) an account keeps its share claimed after its
/// last body: 1 s.
pub const IDLE_AFTER: u32 = 20;

/// Which account of a [`BufferBudget`] a body is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// The upstream the request goes to, known before its body is read: its account's index
    /// ([`crate::upstream::Upstream::account`], kept by the upstream across reloads, unlike
    /// its [`crate::upstream::UpstreamId`]).
    Upstream(usize),
    /// Not known before the body is read: share 0, borrows only unclaimed memory.
    Unrouted,
}

#[derive(Debug, Default)]
struct Account {
    used: AtomicU64,
    share: AtomicU64,
    /// Whether its share counts in the claim (it took memory within [`IDLE_AFTER`] ticks).
    claiming: AtomicBool,
    /// Whether it took memory since the last tick.
    touched: AtomicBool,
    /// Ticks since it last took memory (the tick alone writes it).
    idle_ticks: AtomicU32,
}

impl Account {
    /// What it adds to the claim when it holds `used`.
    fn claim(&self, used: u64, share: u64, claiming: bool) -> u64 {
        if claiming { used.max(share) } else { used }
    }
}

impl BufferBudget {
    /// A budget of `limit` bytes with `upstreams` upstream accounts (at least 1), in equal
    /// shares until [`BufferBudget::rebalance`] is given their capacities; none claims its
    /// share before it takes memory.
    pub fn new(limit: u64, upstreams: usize) -> Self {
        let upstreams = upstreams.max(1);
        let accounts: Box<[Account]> = (0..=upstreams).map(|_| Account::default()).collect();
        let budget = BufferBudget {
            limit,
            used: AtomicU64::new(0),
            claimed: AtomicI64::new(0),
            accounts,
        };
        budget.set_shares(&vec![u32::MAX; upstreams], false);
        budget
    }

    /// Bytes held now by bodies being read or forwarded.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now on `charge`'s account.
    pub fn used_by(&self, charge: Charge) -> u64 {
        self.account(charge).used.load(Ordering::Relaxed)
    }

    /// `charge`'s share of the limit now, bytes (0 for [`Charge::Unrouted`]).
    pub fn share_of(&self, charge: Charge) -> u64 {
        self.account(charge).share.load(Ordering::Relaxed)
    }

    /// Once a tick: sets each upstream's share from `capacities` (its in-flight capacity, by
    /// account index; `u32::MAX` while not learned: such an upstream weighs as the mean of
    /// the learned ones, and all weigh alike while none is; 0, or past the slice's end: no
    /// upstream has that account now, share 0) and, when `unrouted` (the
    /// policy can leave a body's upstream unknown until it is read), the unrouted account's
    /// as an upstream of the mean capacity; lets the share of an account idle for
    /// [`IDLE_AFTER`] ticks go, and recomputes the claim.
    pub fn rebalance(&self, capacities: &[u32], unrouted: bool) {
        self.set_shares(capacities, unrouted);
        for account in self.accounts.iter() {
            let idle = if account.touched.swap(false, Ordering::Relaxed)
                || account.used.load(Ordering::Relaxed) > 0
            {
                0
            } else {
                account.idle_ticks.load(Ordering::Relaxed).saturating_add(1)
            };
            account.idle_ticks.store(idle, Ordering::Relaxed);
            if idle >= IDLE_AFTER {
                account.claiming.store(false, Ordering::Relaxed);
            }
        }
        let claimed: u64 = self
            .accounts
            .iter()
            .map(|a| {
                a.claim(
                    a.used.load(Ordering::Relaxed),
                    a.share.load(Ordering::Relaxed),
                    a.claiming.load(Ordering::Relaxed),
                )
            })
            .sum();
        self.claimed.store(
            i64::try_from(claimed).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
    }

    fn set_shares(&self, capacities: &[u32], unrouted: bool) {
        let learned: Vec<u64> = capacities
            .iter()
            .filter(|c| **c != u32::MAX && **c != 0)
            .map(|c| u64::from(*c))
            .collect();
        let unlearned = match learned.len() {
            0 => 1,
            n => (learned.iter().sum::<u64>() / n as u64).max(1),
        };
        // The unrouted account weighs as an upstream of the mean capacity where the policy
        // can leave a body's upstream unknown until it is read, and nothing elsewhere.
        let upstreams = self.accounts.len() - 1;
        let weights: Vec<u64> = (0..upstreams)
            .map(|i| match capacities.get(i) {
                Some(&u32::MAX) => unlearned,
                Some(c) => u64::from(*c),
                None => 0,
            })
            .chain(std::iter::once(if unrouted { unlearned } else { 0 }))
            .collect();
        let sum: u128 = weights.iter().map(|w| u128::from(*w)).sum::<u128>().max(1);
        for (account, weight) in self.accounts.iter().zip(&weights) {
            let share = u128::from(self.limit) * u128::from(*weight) / sum;
            account
                .share
                .store(u64::try_from(share).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }

    fn account(&self, charge: Charge) -> &Account {
        let unrouted = self.accounts.len() - 1;
        let i = match charge {
            Charge::Upstream(i) => i.min(unrouted),
            Charge::Unrouted => unrouted,
        };
        &self.accounts[i]
    }

    /// Takes `n` bytes on `charge`'s account if that keeps the claim and the total within
    /// the limit.
    fn try_take(&self, charge: Charge, n: u64) -> bool {
        let account = self.account(charge);
        if !account.touched.load(Ordering::Relaxed) {
            account.touched.store(true, Ordering::Relaxed);
        }
        let share = account.share.load(Ordering::Relaxed);
        if !account.claiming.load(Ordering::Relaxed) {
            // Back from idle: its share counts again, at once.
            if account
                .claiming
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let used = account.used.load(Ordering::Relaxed);
                self.add_claim(share.saturating_sub(used));
            }
        }
        let claiming = true;
        let before = account.used.fetch_add(n, Ordering::AcqRel);
        let grow = account.claim(before.saturating_add(n), share, claiming)
            - account.claim(before, share, claiming);
        if grow > 0 {
            let after = self.add_claim(grow);
            if after > i64::try_from(self.limit).unwrap_or(i64::MAX) {
                self.release(account, n, share, claiming);
                return false;
            }
        }
        let mut current = self.used.load(Ordering::Relaxed);
        loop {
            let next = current.saturating_add(n);
            if next > self.limit {
                self.release(account, n, share, claiming);
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

    /// Adds `n` to the claim; the claim after.
    fn add_claim(&self, n: u64) -> i64 {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.claimed
            .fetch_add(n, Ordering::AcqRel)
            .saturating_add(n)
    }

    /// Gives `n` bytes back to `account` (not to the total).
    fn release(&self, account: &Account, n: u64, share: u64, claiming: bool) {
        let before = account.used.fetch_sub(n, Ordering::AcqRel);
        let shrink = account.claim(before, share, claiming)
            - account.claim(before.saturating_sub(n), share, claiming);
        let shrink = i64::try_from(shrink).unwrap_or(i64::MAX);
        self.claimed.fetch_sub(shrink, Ordering::AcqRel);
    }

    fn give_back(&self, charge: Charge, n: u64) {
        if n == 0 {
            return;
        }
        let account = self.account(charge);
        let claiming = account.claiming.load(Ordering::Relaxed);
        self.release(account, n, account.share.load(Ordering::Relaxed), claiming);
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// One request's share of the budget: what its body has taken so far on its account, given
/// back when the last clone is dropped (after the body was read and forwarded, or refused).
#[derive(Debug, Clone)]
pub(super) struct Reservation(Arc<Held>);

#[derive(Debug)]
struct Held {
    budget: Arc<BufferBudget>,
    charge: Charge,
    bytes: AtomicU64,
}

impl Reservation {
    pub(super) fn new(budget: Arc<BufferBudget>, charge: Charge) -> Self {
        Reservation(Arc::new(Held {
            budget,
            charge,
            bytes: AtomicU64::new(0),
        }))
    }

    fn take(&self, n: u64) -> bool {
        let ok = self.0.budget.try_take(self.0.charge, n);
        if ok {
            self.0.bytes.fetch_add(n, Ordering::Relaxed);
        }
        ok
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.charge, *self.bytes.get_mut());
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

    fn up(i: usize) -> Charge {
        Charge::Upstream(i)
    }

    #[test]
    fn reservations_take_within_the_limit_and_give_back_on_drop() {
        let budget = Arc::new(BufferBudget::new(100, 1));
        let a = Reservation::new(Arc::clone(&budget), up(0));
        let b = Reservation::new(Arc::clone(&budget), up(0));
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
        assert_eq!(budget.used_by(up(0)), 0);
    }

    #[test]
    fn a_busy_upstream_keeps_its_share_from_a_borrower() {
        // Capacities 30 and 10: shares 75 and 25 of 100.
        let budget = Arc::new(BufferBudget::new(100, 2));
        budget.rebalance(&[30, 10], false);
        assert_eq!((budget.share_of(up(0)), budget.share_of(up(1))), (75, 25));
        // B is busy (it took memory): its share is claimed.
        let b = Reservation::new(Arc::clone(&budget), up(1));
        assert!(b.take(1));
        // A reads its share, then may borrow nothing B's share needs.
        let a = Reservation::new(Arc::clone(&budget), up(0));
        assert!(a.take(75));
        assert!(!a.take(1), "A past its share, into B's");
        // B reads up to its share, whatever A holds.
        assert!(b.take(24));
        assert_eq!(budget.used(), 100);
        assert!(!b.take(1), "the total is a hard limit");
        drop(b);
        // A request of B gets B's share back at once.
        let b2 = Reservation::new(Arc::clone(&budget), up(1));
        assert!(b2.take(25));
        assert_eq!(budget.used(), 100);
    }

    #[test]
    fn an_upstream_alone_borrows_the_whole_limit_and_an_idle_one_claims_its_share_back() {
        let budget = Arc::new(BufferBudget::new(100, 2));
        // Equal shares before any capacity is learned.
        budget.rebalance(&[u32::MAX, u32::MAX], false);
        assert_eq!((budget.share_of(up(0)), budget.share_of(up(1))), (50, 50));
        let a = Reservation::new(Arc::clone(&budget), up(0));
        assert!(a.take(100), "B never took memory: its share is lent");
        assert!(!a.take(1));
        // B comes back: its claim stops A from borrowing more, and B gets its share as A's
        // bodies end.
        let b = Reservation::new(Arc::clone(&budget), up(1));
        assert!(!b.take(10), "the total holds");
        drop(a);
        let a = Reservation::new(Arc::clone(&budget), up(0));
        assert!(a.take(50));
        assert!(!a.take(1), "B's share is claimed now");
        assert!(b.take(50));
        drop((a, b));
        // Idle for IDLE_AFTER ticks after the one that saw it busy, B's share is lent again.
        for _ in 0..=IDLE_AFTER {
            budget.rebalance(&[u32::MAX, u32::MAX], false);
        }
        let a = Reservation::new(Arc::clone(&budget), up(0));
        assert!(a.take(100));
    }

    #[test]
    fn unrouted_bodies_have_a_share_of_their_own() {
        // Two upstreams of 10 and 30, the unrouted account weighing as their mean (20): 100
        // bytes shared 16, 50 and 33.
        let budget = Arc::new(BufferBudget::new(100, 2));
        budget.rebalance(&[10, 30], true);
        assert_eq!(budget.share_of(Charge::Unrouted), 33);
        let a = Reservation::new(Arc::clone(&budget), up(0));
        let b = Reservation::new(Arc::clone(&budget), up(1));
        assert!(a.take(16) && b.take(50), "both busy, within their shares");
        let u = Reservation::new(Arc::clone(&budget), Charge::Unrouted);
        assert!(u.take(33), "busy upstreams leave the unrouted share");
        assert!(!u.take(2), "and no more: the others' shares are claimed");
        drop((a, b, u));
        assert_eq!(budget.used(), 0);
    }
}
