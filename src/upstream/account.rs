//! Each upstream's account of the buffered body bytes (`proxy::BufferBudget`), by an index
//! the upstream keeps for as long as it exists: a reload renumbers the policy's
//! [`super::UpstreamId`]s, but a body read for an upstream is given back to the account it
//! was taken from, and an upstream a reload removed keeps its account until its last request
//! has ended.

use std::sync::{Arc, Mutex};

use crate::policy::MAX_UPSTREAMS;

/// How many accounts there are: one per upstream a policy may have, and as many again for
/// upstreams that reloads removed while requests to them are still in flight.
pub const ACCOUNTS: usize = 2 * MAX_UPSTREAMS;

/// The accounts in use, shared by every [`Account`] taken from them.
#[derive(Debug, Clone, Default)]
pub struct Accounts(Arc<Mutex<Vec<bool>>>);

/// One upstream's account: its index in the budget, free again when dropped (with the last
/// upstream holding it).
#[derive(Debug)]
pub struct Account {
    index: usize,
    taken: Arc<Mutex<Vec<bool>>>,
}

// === impl Accounts ===

impl Accounts {
    /// The lowest free account, if one is free: a proxy's first table takes 0, 1, 2, … in
    /// its upstreams' id order.
    pub fn take(&self) -> Option<Arc<Account>> {
        let mut taken = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if taken.is_empty() {
            taken.resize(ACCOUNTS, false);
        }
        let index = taken.iter().position(|t| !t)?;
        taken[index] = true;
        Some(Arc::new(Account {
            index,
            taken: Arc::clone(&self.0),
        }))
    }
}

// === impl Account ===

impl Account {
    /// Its index in the budget's accounts (below [`ACCOUNTS`]).
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = taken.get_mut(self.index) {
            *t = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_taken_lowest_first_and_freed_when_dropped() {
        let accounts = Accounts::default();
        let (a, b, c) = (
            accounts.take().unwrap(),
            accounts.take().unwrap(),
            accounts.take().unwrap(),
        );
        assert_eq!((a.index(), b.index(), c.index()), (0, 1, 2));
        drop(b);
        assert_eq!(accounts.take().unwrap().index(), 1, "freed, taken again");
        let held: Vec<_> = std::iter::from_fn(|| accounts.take()).collect();
        assert_eq!(
            held.len() + 2,
            ACCOUNTS,
            "then every other one, and none more"
        );
    }
}
