//! The handshakes in progress on the TLS listener, at most `--tls-max-handshakes`: past it,
//! the oldest incomplete one is told to close first, as nginx closes its oldest reusable
//! connections when descriptors run low (`edge::descriptors`), so that a flood of slow
//! handshakes displaces itself and never holds the port from clients that complete theirs.
//! Each handshake's place is a [`Reuse`] (the descriptors' own "told to close" flag and
//! waker), queued here by age.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::edge::reuse::Reuse;

/// The handshakes in progress, oldest first.
#[derive(Debug)]
pub struct Handshakes {
    limit: usize,
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    next: u64,
    by_age: BTreeMap<u64, Arc<Reuse>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Handshakes {
    /// At most `limit` handshakes in progress (at least 1).
    pub fn new(limit: usize) -> Self {
        Handshakes {
            limit: limit.max(1),
            queue: Mutex::default(),
        }
    }

    /// Handshakes in progress now.
    pub fn len(&self) -> usize {
        lock(&self.queue).by_age.len()
    }

    /// Whether none is in progress.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A handshake begins: queued as the newest; when the limit is reached, the oldest are
    /// told to close (their [`Reuse::evicted`] resolves). Its place is freed when the
    /// returned guard drops.
    pub fn begin(self: &Arc<Self>) -> InProgress {
        let reuse = Arc::new(Reuse::default());
        let (key, displaced) = {
            let mut queue = lock(&self.queue);
            let mut displaced = Vec::new();
            while queue.by_age.len() >= self.limit {
                match queue.by_age.pop_first() {
                    Some((_, oldest)) => displaced.push(oldest),
                    None => break,
                }
            }
            queue.next += 1;
            let key = queue.next;
            queue.by_age.insert(key, Arc::clone(&reuse));
            (key, displaced)
        };
        for oldest in displaced {
            oldest.tell();
        }
        InProgress {
            handshakes: Arc::clone(self),
            key,
            reuse,
        }
    }
}

/// One handshake's place among those in progress; freed on drop.
#[derive(Debug)]
pub struct InProgress {
    handshakes: Arc<Handshakes>,
    key: u64,
    reuse: Arc<Reuse>,
}

impl InProgress {
    /// Resolves once newer handshakes displaced this one.
    pub fn displaced(&self) -> impl Future<Output = ()> + '_ {
        self.reuse.evicted()
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        lock(&self.handshakes.queue).by_age.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

    fn told(p: &InProgress) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        p.reuse.poll_evicted(&mut cx) == Poll::Ready(())
    }

    /// Past the limit the oldest incomplete handshake is told to close, one per newcomer,
    /// and a finished one frees its place without displacing anyone.
    #[test]
    fn the_oldest_is_displaced_first() {
        let h = Arc::new(Handshakes::new(2));
        let first = h.begin();
        let second = h.begin();
        assert!(!told(&first) && !told(&second));
        let third = h.begin();
        assert!(told(&first), "the oldest goes first");
        assert!(!told(&second) && !told(&third));
        assert_eq!(h.len(), 2);
        drop(first);
        drop(third);
        assert_eq!(h.len(), 1);
        let fourth = h.begin();
        assert!(!told(&second) && !told(&fourth), "room was free");
    }
}
