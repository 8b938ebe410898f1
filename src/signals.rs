//! Process signals, handled from the first line of `main` (docs/operations.md "Signals").
//!
//! A signal that arrives before its handler exists does what the kernel's default says: SIGHUP
//! and SIGUSR1 kill the process (prometheus#14917: a SIGHUP while a slow policy compiled exited
//! 129), and as PID 1, as in the container image, a SIGTERM is ignored and lost, so the pod runs
//! until SIGKILL (consul#677). So [`Signals::install`] is the first thing `main` does, before the
//! command line is parsed, and a thread of its own receives every signal from then on
//! (signal-hook's iterator: the handler only writes to a self-pipe, so it is safe whatever the
//! process was doing):
//!
//! - SIGTERM, SIGINT: before [`Signals::serving`], the process exits at once (143 or 130, as a
//!   shell reports a process those signals killed): nothing is served yet, so there is nothing
//!   to drain. From then on, [`Signals::terminated`] resolves and `serve` shuts down gracefully.
//! - SIGHUP: a policy reload ([`Signals::hangups`]) and, with TLS, a certificate reload
//!   ([`Signals::certificate_hangups`]). Signals are remembered, not queued: any
//!   number that arrive before a reload task takes them, during start-up included, are one
//!   reload; a storm while a reload runs is one more after it. For the other commands (`check`,
//!   `explain`, …) a SIGHUP is a terminal hanging up and exits (129), as it did.
//! - SIGUSR1: counted ([`Signals::reopens`]); the access log reopens its file on it
//!   (logrotate's `postrotate`). It never kills the process, log or no log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;

/// The signals' numbers (Linux and the BSDs agree on these).
const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;
const SIGUSR1: i32 = 10;

/// The process's signals: cheap to clone, shared by the tasks that wait on them.
#[derive(Debug, Clone)]
pub struct Signals(Arc<State>);

#[derive(Debug, Default)]
struct State {
    /// `serve` has started: SIGTERM and SIGINT now stop it gracefully.
    serving: AtomicBool,
    /// A command other than `serve`: SIGHUP exits.
    hangup_exits: AtomicBool,
    /// SIGTERM or SIGINT arrived while serving.
    terminated: AtomicBool,
    terminate: Notify,
    /// A SIGHUP not yet taken by each reload task (any number of them): the policy's
    /// ([`POLICY`]) and the TLS certificate's ([`CERTIFICATE`]).
    hangup: [AtomicBool; 2],
    hangups: [Notify; 2],
    /// SIGUSR1s so far.
    reopen: AtomicU64,
    reopens: Notify,
}

impl Signals {
    /// Handles SIGTERM, SIGINT, SIGHUP and SIGUSR1 from now on, on a thread of its own.
    ///
    /// # Errors
    /// The handlers cannot be registered (the self-pipe cannot be made).
    #[cfg(unix)]
    pub fn install() -> std::io::Result<Self> {
        let mut incoming = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1])?;
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in incoming.forever() {
                    shared.receive(signal);
                }
            })?;
        Ok(Signals(state))
    }

    /// No handlers on a platform without Unix signals.
    #[cfg(not(unix))]
    pub fn install() -> std::io::Result<Self> {
        Ok(Self::none())
    }

    /// Signals as a test or an embedding sees them: nothing is installed, nothing arrives.
    pub fn none() -> Self {
        Signals(Arc::new(State::default()))
    }

    /// From now on SIGTERM and SIGINT stop `serve` gracefully ([`Signals::terminated`]),
    /// instead of exiting at once.
    pub fn serving(&self) {
        self.0.serving.store(true, Ordering::SeqCst);
    }

    /// For a command other than `serve`: SIGHUP exits (129), including one that already came.
    pub fn hangup_exits(&self) {
        self.0.hangup_exits.store(true, Ordering::SeqCst);
        if self.0.hangup[POLICY].load(Ordering::SeqCst) {
            std::process::exit(128 + SIGHUP);
        }
    }

    /// Resolves once SIGTERM or SIGINT has arrived while serving.
    pub async fn terminated(&self) {
        loop {
            let notified = self.0.terminate.notified();
            if self.0.terminated.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// The SIGHUPs, for the policy reload task.
    pub fn hangups(&self) -> Hangups {
        Hangups(Arc::clone(&self.0), POLICY)
    }

    /// The SIGHUPs, for the TLS certificate reload task (each task sees every SIGHUP).
    pub fn certificate_hangups(&self) -> Hangups {
        Hangups(Arc::clone(&self.0), CERTIFICATE)
    }

    /// How many SIGUSR1s have arrived.
    pub fn reopens(&self) -> u64 {
        self.0.reopen.load(Ordering::SeqCst)
    }

    /// Resolves when a SIGUSR1 arrives after `seen` of them.
    pub async fn reopened_after(&self, seen: u64) -> u64 {
        loop {
            let notified = self.0.reopens.notified();
            let now = self.reopens();
            if now != seen {
                return now;
            }
            notified.await;
        }
    }

    /// Delivers `signal` as the signal thread does (for tests of what each one does).
    pub fn deliver(&self, signal: i32) {
        self.0.receive(signal);
    }
}

impl State {
    fn receive(&self, signal: i32) {
        match signal {
            SIGTERM | SIGINT if !self.serving.load(Ordering::SeqCst) => {
                // Nothing is served yet: nothing to drain. Exit as the signal would have.
                std::process::exit(128 + signal);
            }
            SIGTERM | SIGINT => {
                self.terminated.store(true, Ordering::SeqCst);
                self.terminate.notify_waiters();
            }
            SIGHUP if self.hangup_exits.load(Ordering::SeqCst) => std::process::exit(128 + SIGHUP),
            SIGHUP => {
                // One stored permit at most: a storm wakes each task once.
                for (hangup, hangups) in self.hangup.iter().zip(&self.hangups) {
                    hangup.store(true, Ordering::SeqCst);
                    hangups.notify_one();
                }
            }
            SIGUSR1 => {
                self.reopen.fetch_add(1, Ordering::SeqCst);
                self.reopens.notify_waiters();
            }
            _ => {}
        }
    }
}

/// The SIGHUPs, coalesced: [`Hangups::next`] resolves once for any number that arrived since
/// it last resolved.
#[derive(Debug)]
pub struct Hangups(Arc<State>, usize);

/// The policy reload task's slot of the SIGHUPs.
const POLICY: usize = 0;
/// The TLS certificate reload task's slot.
const CERTIFICATE: usize = 1;

impl Hangups {
    /// Resolves when one or more SIGHUPs are pending, and takes them all.
    pub async fn next(&mut self) {
        loop {
            if self.0.hangup[self.1].swap(false, Ordering::SeqCst) {
                return;
            }
            self.0.hangups[self.1].notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storm of SIGHUPs before anyone waits is one reload, and one more storm while it runs
    /// is one more: never a queue of them.
    #[tokio::test]
    async fn hangups_coalesce() {
        let s = Signals::none();
        s.serving();
        for _ in 0..50 {
            s.deliver(SIGHUP);
        }
        let mut h = s.hangups();
        h.next().await;
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), h.next()).await;
        assert!(again.is_err(), "fifty SIGHUPs were one");
        for _ in 0..50 {
            s.deliver(SIGHUP);
        }
        h.next().await;
    }

    #[tokio::test]
    async fn terminate_while_serving_resolves_and_usr1_counts() {
        let s = Signals::none();
        s.serving();
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.terminated().await }
        });
        s.deliver(SIGUSR1);
        assert_eq!(s.reopens(), 1);
        assert_eq!(s.reopened_after(0).await, 1);
        s.deliver(SIGTERM);
        waiter.await.unwrap();
        // Once terminated, it stays so for a late waiter.
        s.terminated().await;
    }
}
