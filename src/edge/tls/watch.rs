//! Reload triggers of the TLS certificate pair ([`pair`](super::pair)): a watcher on the
//! directories holding `--tls-cert` and `--tls-key`, SIGHUP, a periodic re-check, and
//! `POST /reload` (in `admin`, through [`reload`]). Beside `edge::tls` rather than in `live`,
//! which `edge` depends on.
//!
//! The directories are watched, never the files, for the reason the policy directory is
//! (`live::reload`): a cert-manager Secret mounted in Kubernetes changes by a swap of its
//! `..data` symlink, whose events name neither file, and a rename over a file leaves a watch
//! on the file behind. Any change under either directory starts a debounce; once quiet, the
//! files are read, and a pair whose bytes differ from the last one tried is checked and
//! swapped in, or refused with the serving pair kept.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use super::pair::{CertificateStore, PairError, Reload};
use crate::live::debounce::Quiet;
use crate::live::reload::{Trigger, next_trigger};
use crate::signals::Hangups;

/// Reads the files again off the async workers and swaps in a new valid pair
/// ([`CertificateStore::reload`]).
pub async fn reload(store: &Arc<CertificateStore>) -> Reload {
    let store = Arc::clone(store);
    match tokio::task::spawn_blocking(move || store.reload()).await {
        Ok(outcome) => outcome,
        Err(e) => Reload::Refused(PairError::Read {
            path: PathBuf::new(),
            reason: format!("reload task failed: {e}"),
        }),
    }
}

/// Starts the watcher now, then spawns the task that runs it, the SIGHUPs (`hangups`,
/// coalesced) and the re-check every `recheck_every` (which also restarts a dead watcher)
/// until `shutdown`.
pub fn spawn(
    store: Arc<CertificateStore>,
    recheck_every: Duration,
    mut shutdown: watch::Receiver<bool>,
    mut hangups: Option<Hangups>,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = DirsWatcher::start(&store, &tx);
    // A change between the start's read and the watch: one check now, before serving (two
    // small files, read once at start as the config read them).
    store.reload();
    tokio::spawn(async move {
        let mut recheck = tokio::time::interval(recheck_every);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        recheck.tick().await;
        loop {
            let Some(trigger) =
                next_trigger(&mut rx, &mut recheck, &mut hangups, &mut shutdown).await
            else {
                return;
            };
            match trigger {
                Trigger::Watch => settle(&mut rx).await,
                Trigger::Periodic if watcher.as_ref().is_none_or(DirsWatcher::dead) => {
                    watcher = DirsWatcher::start(&store, &tx);
                }
                _ => {}
            }
            let outcome = reload(&store).await;
            if trigger == Trigger::Signal {
                tracing::info!(?outcome, "TLS certificate reload on SIGHUP");
            }
        }
    })
}

/// Waits until no event came for the debounce's quiet period (a burst of renames).
async fn settle(rx: &mut mpsc::UnboundedReceiver<()>) {
    let mut quiet = Quiet::new(tokio::time::Instant::now());
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(()) => quiet.event(tokio::time::Instant::now()),
                None => return,
            },
            () = tokio::time::sleep_until(quiet.deadline()) => return,
        }
    }
}

/// A watcher on the directories of the certificate and key files.
struct DirsWatcher {
    _watcher: notify::RecommendedWatcher,
    dead: Arc<std::sync::atomic::AtomicBool>,
}

impl DirsWatcher {
    fn dead(&self) -> bool {
        self.dead.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Watches the directories holding the files; `None` (logged) when one cannot be
    /// watched: the periodic re-check still reloads, and tries again.
    fn start(store: &CertificateStore, tx: &mpsc::UnboundedSender<()>) -> Option<DirsWatcher> {
        let files = store.files();
        let mut dirs: Vec<PathBuf> = [&files.cert, &files.key]
            .iter()
            .map(|f| match f.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                _ => PathBuf::from("."),
            })
            .collect();
        dirs.dedup();
        let (mut watcher, dead) = crate::live::reload::signalling_watcher(
            "TLS certificate",
            tx,
            |_event: &notify::Event| (true, false),
        )?;
        for dir in &dirs {
            if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                tracing::warn!(error = %e, dir = %dir.display(), "cannot watch the TLS certificate's directory; the periodic re-check reloads it");
                return None;
            }
        }
        Some(DirsWatcher {
            _watcher: watcher,
            dead,
        })
    }
}
