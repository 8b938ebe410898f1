//! Reload triggers: a watcher on the policy directory, SIGHUP, and a periodic re-check
//! (docs/operations.md "Policy files and hot reload"). `POST /reload` on the admin listener is the
//! fourth, in `admin`.
//!
//! The watcher watches the directory (recursively), never the files: a Kubernetes ConfigMap
//! update is an atomic swap of the `..data` symlink, whose events name no policy file, and an
//! editor's save-by-rename replaces the file a file watch would be attached to. Any event
//! under the directory starts a debounce; once the directory has been quiet for
//! [`DEBOUNCE`](super::debounce::DEBOUNCE) and its content hashes the same twice [`SETTLE`] apart, it is reloaded if
//! the content changed (docs/dependencies.md "notify"). A periodic re-check is the safety net for
//! events a watcher misses (a directory deleted and re-created kills an inotify watch
//! silently), and re-creates the watcher when it died.
//!
//! The watcher watches the canonical places the directory's symlinks lead to
//! ([`WatchSet`]), resolved again after each reload: when a link swapped (`ln -sfn v2
//! current`), it moves to the new places at once rather than at the next re-check.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use super::debounce::Quiet;
use super::store::{PolicyStore, ReloadOutcome};
use super::watched::WatchSet;
use crate::policy::PolicyFiles;
use crate::signals::Hangups;

/// Interval between the two reads that must agree before compiling.
pub const SETTLE: Duration = Duration::from_millis(100);
/// Default safety-net re-check interval.
pub const RECHECK: Duration = Duration::from_secs(10);

/// Why a reload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A file event (debounced).
    Watch,
    /// SIGHUP.
    Signal,
    /// The periodic re-check.
    Periodic,
    /// `POST /reload`.
    Admin,
}

/// Reloads off the async worker threads (compiling may tile regions for seconds).
pub async fn reload(store: &Arc<PolicyStore>, trigger: Trigger) -> ReloadOutcome {
    let store = Arc::clone(store);
    let force = matches!(trigger, Trigger::Signal | Trigger::Admin);
    match tokio::task::spawn_blocking(move || store.reload(force)).await {
        Ok(outcome) => outcome,
        Err(e) => ReloadOutcome::Failed {
            live: String::new(),
            error: format!("reload task failed: {e}"),
        },
    }
}

/// Starts the watcher now (so that no save after this call is missed), then spawns the task
/// that runs it, the SIGHUPs (`hangups`, coalesced: any number pending are one reload) and the
/// periodic re-check until `shutdown`.
pub fn spawn(
    store: Arc<PolicyStore>,
    recheck_every: Duration,
    shutdown: watch::Receiver<bool>,
    hangups: Option<Hangups>,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = mpsc::unbounded_channel::<()>();
    let watcher = DirWatcher::start(store.dir(), &tx);
    // Anything saved between the first load and the watch is caught by one check at once.
    let _ = tx.send(());
    tokio::spawn(run(
        store,
        recheck_every,
        shutdown,
        (tx, rx),
        watcher,
        hangups,
    ))
}

async fn run(
    store: Arc<PolicyStore>,
    recheck_every: Duration,
    mut shutdown: watch::Receiver<bool>,
    (tx, mut rx): (mpsc::UnboundedSender<()>, mpsc::UnboundedReceiver<()>),
    mut watcher: Option<DirWatcher>,
    mut hangups: Option<Hangups>,
) {
    let dir = store.dir().to_owned();
    let mut recheck = tokio::time::interval(recheck_every);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.tick().await;
    loop {
        let Some(trigger) = next_trigger(&mut rx, &mut recheck, &mut hangups, &mut shutdown).await
        else {
            return;
        };
        match trigger {
            Trigger::Watch => {
                settle(&store, &mut rx).await;
            }
            Trigger::Periodic if watcher.as_ref().is_none_or(|w| w.dead()) => {
                tracing::warn!(dir = %dir.display(), "policy watcher is not running; starting it again");
                watcher = DirWatcher::start(&dir, &tx);
            }
            _ => {}
        }
        let outcome = reload(&store, trigger).await;
        if trigger == Trigger::Signal {
            // An operator asked: say what it did, changed or not.
            tracing::info!(?outcome, "policy reload on SIGHUP");
        } else if let ReloadOutcome::Swapped { .. } | ReloadOutcome::Failed { .. } = &outcome {
            tracing::debug!(?trigger, ?outcome, "policy reload");
        }
        if let Some(moved) = follow(&dir, watcher.as_ref(), &tx).await {
            watcher = moved;
            // A save in the new places between the reload and this watch: one check now.
            let _ = tx.send(());
        }
    }
}

/// Resolves `dir` again after a reload: when a symlink on the way or under it now leads
/// elsewhere (`ln -sfn`), a watcher on the new places, else `None`. Without a running
/// watcher it does nothing: the periodic re-check restarts one.
async fn follow(
    dir: &Path,
    watcher: Option<&DirWatcher>,
    tx: &mpsc::UnboundedSender<()>,
) -> Option<Option<DirWatcher>> {
    let current = Arc::clone(&watcher?.set);
    let (dir, tx) = (dir.to_owned(), tx.clone());
    tokio::task::spawn_blocking(move || {
        let set = WatchSet::of(&dir).ok()?;
        if set == *current {
            return None;
        }
        tracing::info!(
            dir = %dir.display(),
            from = ?current.root(),
            to = ?set.root(),
            "the policy path leads elsewhere now: watching the new places"
        );
        Some(DirWatcher::on(set, &tx))
    })
    .await
    .ok()
    .flatten()
}

/// Waits until the directory is quiet and its content stable.
async fn settle(store: &PolicyStore, rx: &mut mpsc::UnboundedReceiver<()>) {
    // Quiet period: the burst's deadline moves with every further event (see `Quiet`).
    let mut quiet = Quiet::new(tokio::time::Instant::now());
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(()) => quiet.event(tokio::time::Instant::now()),
                None => break,
            },
            () = tokio::time::sleep_until(quiet.deadline()) => break,
        }
    }
    // Stable content: two reads SETTLE apart agree (a save in progress does not).
    for _ in 0..20 {
        let a = fingerprint(store.dir().to_owned()).await;
        tokio::time::sleep(SETTLE).await;
        let b = fingerprint(store.dir().to_owned()).await;
        while rx.try_recv().is_ok() {}
        if a == b {
            return;
        }
    }
}

async fn fingerprint(dir: PathBuf) -> Option<String> {
    tokio::task::spawn_blocking(move || PolicyFiles::read(&dir).ok().map(|f| f.version()))
        .await
        .ok()
        .flatten()
}

/// A running watcher on the places of a [`WatchSet`]; it notes when notify reports an
/// error or the policy directory itself is removed.
struct DirWatcher {
    _watcher: notify::RecommendedWatcher,
    set: Arc<WatchSet>,
    dead: Arc<AtomicBool>,
}

impl DirWatcher {
    fn dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Resolves `dir` and watches what it leads to; `None` (logged) when it cannot.
    fn start(dir: &Path, tx: &mpsc::UnboundedSender<()>) -> Option<DirWatcher> {
        match WatchSet::of(dir) {
            Ok(set) => DirWatcher::on(set, tx),
            Err(e) => {
                tracing::warn!(error = %e, dir = %dir.display(), "cannot resolve the policy directory to watch it");
                None
            }
        }
    }

    /// Watches the places of `set`; `None` (logged) when the policy directory cannot be
    /// watched. A place beside it that cannot be watched is logged and left to the periodic
    /// re-check.
    fn on(set: WatchSet, tx: &mpsc::UnboundedSender<()>) -> Option<DirWatcher> {
        let set = Arc::new(set);
        let seen = Arc::clone(&set);
        let (mut watcher, dead) = signalling_watcher("policy", tx, move |event| {
            // The directory itself removed: this watch is over; the re-check restarts it.
            let over = event.kind.is_remove()
                && event.paths.iter().any(|p| Some(p.as_path()) == seen.root());
            // A directory holding a link is watched for everything in it: only the link's
            // own changes count. An event without paths (the kernel's queue overflowed) may
            // have been anything.
            let ours = event.paths.is_empty() || event.paths.iter().any(|p| seen.covers(p));
            (ours, over)
        })?;
        let places = set
            .trees()
            .iter()
            .map(|t| (t.as_path(), RecursiveMode::Recursive))
            .chain(set.entry_dirs().map(|d| (d, RecursiveMode::NonRecursive)));
        for (i, (place, mode)) in places.enumerate() {
            if let Err(e) = watcher.watch(place, mode) {
                tracing::warn!(error = %e, place = %place.display(), "cannot watch a place the policy comes from");
                if i == 0 {
                    return None;
                }
            }
        }
        Some(DirWatcher {
            _watcher: watcher,
            set,
            dead,
        })
    }
}

/// What wakes a reload loop next: a file event on `rx` ([`Trigger::Watch`]), the periodic
/// `recheck`, or SIGHUP (`hangups`, when the process has them); `None` once `shutdown` is set.
pub(crate) async fn next_trigger(
    rx: &mut mpsc::UnboundedReceiver<()>,
    recheck: &mut tokio::time::Interval,
    hangups: &mut Option<Hangups>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Trigger> {
    let hangup = async {
        match hangups {
            Some(h) => h.next().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        Some(()) = rx.recv() => Some(Trigger::Watch),
        _ = recheck.tick() => Some(Trigger::Periodic),
        () = hangup => Some(Trigger::Signal),
        _ = shutdown.wait_for(|s| *s) => None,
    }
}

/// A file watcher (notify's recommended one, not yet watching anything) that sends one
/// reload signal on `tx` for each event `judge` calls ours (its first answer) that can mean
/// new content ([`changes`]), and marks the returned flag dead when `judge` says the watch is
/// over (its second answer) or the watcher reports an error (logged, naming `what`): the
/// periodic re-check then starts a new one. `None` (logged) when no watcher can start.
pub(crate) fn signalling_watcher(
    what: &'static str,
    tx: &mpsc::UnboundedSender<()>,
    judge: impl Fn(&notify::Event) -> (bool, bool) + Send + 'static,
) -> Option<(notify::RecommendedWatcher, Arc<AtomicBool>)> {
    let dead = Arc::new(AtomicBool::new(false));
    let handler = {
        let (flag, tx) = (Arc::clone(&dead), tx.clone());
        move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                let (ours, over) = judge(&event);
                if over {
                    flag.store(true, Ordering::Relaxed);
                }
                if ours && changes(&event.kind) {
                    let _ = tx.send(());
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "{what} watcher error");
                flag.store(true, Ordering::Relaxed);
            }
        }
    };
    match notify::recommended_watcher(handler) {
        Ok(w) => Some((w, dead)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start a file watcher for the {what}");
            None
        }
    }
}

/// Whether an event can mean new content. notify 8 also reports opens and read-only closes
/// (inotify `IN_OPEN`, `IN_CLOSE_NOWRITE`), which every reload's own reads cause: reacting to
/// them re-read the policy about ten times a second forever. A close after writing still
/// counts, as does everything else (creates, renames, removes, modifications, attributes).
pub(crate) fn changes(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    !matches!(
        kind,
        EventKind::Access(
            AccessKind::Open(_)
                | AccessKind::Read
                | AccessKind::Close(AccessMode::Read | AccessMode::Execute)
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reading the policy files is not a change (a reload reads them, and reacting to its own
    /// reads re-read the policy about ten times a second forever); writing one is.
    #[tokio::test]
    async fn reads_do_not_trigger_a_reload_and_writes_do() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("streams.toml");
        std::fs::write(&file, "# v1\n").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _watcher = DirWatcher::start(dir.path(), &tx).expect("a watcher");
        for _ in 0..3 {
            std::fs::read(&file).unwrap();
        }
        let quiet = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(quiet.is_err(), "reading the policy triggered a reload");
        std::fs::write(&file, "# v2\n").unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        assert!(
            matches!(seen, Ok(Some(()))),
            "a write did not trigger a reload"
        );
    }
}
