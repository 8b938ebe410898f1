//! The live policy: an `ArcSwap` of compiled snapshots. A reload reads and compiles first and
//! swaps atomically; a failed reload keeps the last good snapshot (docs/operations.md
//! "Policy files and hot reload"). Each request loads one snapshot and keeps it to its end.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::clock::Sources;
use crate::metrics::{Metrics, PolicyMetrics};
use crate::policy::{Policy, PolicyError, PolicyFiles, Warning, compile};

/// A compiled policy with its metric handles.
#[derive(Debug)]
pub struct Snapshot {
    /// The policy.
    pub policy: Policy,
    /// Its metric handles, registered lazily per label set.
    pub metrics: PolicyMetrics,
}

impl Snapshot {
    /// A policy with its metric handles.
    pub fn new(metrics: &Arc<Metrics>, policy: Policy) -> Self {
        Snapshot {
            metrics: PolicyMetrics::new(metrics, &policy),
            policy,
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum ReloadOutcome {
    /// The files hash to the live version: nothing to do.
    Unchanged {
        /// The live version.
        version: String,
    },
    /// A new policy is live.
    Swapped {
        /// The version replaced.
        from: String,
        /// The version now live.
        to: String,
    },
    /// The files do not compile; the previous policy stays live.
    Failed {
        /// The version still live.
        live: String,
        /// File, line, field and what is wrong.
        error: String,
    },
}

/// The last reload attempt, for `GET /policy`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadStatus {
    /// The last error, while the files do not compile.
    pub last_error: Option<String>,
    /// When the last reload attempt that read new content ended, unix milliseconds.
    pub last_attempt_unix_ms: Option<i64>,
    /// Version of the files last seen failing (so a periodic re-check does not recompile
    /// and re-log the same broken content).
    #[serde(skip)]
    failed_version: Option<String>,
}

/// What a reload runs just before it swaps a new snapshot in ([`PolicyStore::set_prepare`]):
/// the proxy's upstreams rebuilt for it. An error fails the reload as a policy error does.
pub type Prepare = Box<dyn Fn(&Arc<Snapshot>) -> Result<(), PolicyError> + Send + Sync>;

/// The live policy of one proxy.
pub struct PolicyStore {
    dir: PathBuf,
    live: ArcSwap<Snapshot>,
    metrics: Arc<Metrics>,
    status: Mutex<ReloadStatus>,
    /// Serialises reloads (watcher, SIGHUP, admin) so two compiles never race to swap.
    reloading: Mutex<()>,
    /// The wall clock of reload times.
    sources: Sources,
    /// Run before each swap, once set.
    prepare: std::sync::OnceLock<Prepare>,
}

impl std::fmt::Debug for PolicyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyStore")
            .field("dir", &self.dir)
            .field("version", &self.live.load().policy.version())
            .finish_non_exhaustive()
    }
}

impl PolicyStore {
    /// Loads the policy in `dir`.
    ///
    /// # Errors
    /// The [`PolicyError`] of the first load: a proxy does not start on a broken policy.
    pub fn open(
        dir: &Path,
        metrics: Arc<Metrics>,
        sources: Sources,
    ) -> Result<(Self, Vec<Warning>), PolicyError> {
        let compiled = compile(&PolicyFiles::read(dir)?)?;
        let snapshot = Snapshot::new(&metrics, compiled.policy);
        let now = sources.now();
        metrics.policy_loaded(&snapshot.policy, now);
        Ok((
            PolicyStore {
                dir: dir.to_owned(),
                live: ArcSwap::from_pointee(snapshot),
                metrics,
                status: Mutex::new(ReloadStatus {
                    last_attempt_unix_ms: Some(now.0),
                    ..ReloadStatus::default()
                }),
                reloading: Mutex::new(()),
                sources,
                prepare: std::sync::OnceLock::new(),
            },
            compiled.warnings,
        ))
    }

    /// Has each reload run `prepare` on the new snapshot just before swapping it in (set
    /// once; a second call is ignored). This is how what is built for each policy (the
    /// upstream table, which this layer does not know) changes with it: a `prepare` that
    /// fails fails the reload, and the live policy is kept.
    pub fn set_prepare(&self, prepare: Prepare) {
        if self.prepare.set(prepare).is_err() {
            tracing::error!("a policy store's prepare step was set twice; the first is kept");
        }
    }

    /// The clock and draw this store (and the proxy it belongs to) reads.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The live snapshot. Hold it for the whole request.
    pub fn load(&self) -> Arc<Snapshot> {
        self.live.load_full()
    }

    /// The policy directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last reload error, while the files on disk do not compile.
    pub fn last_error(&self) -> Option<String> {
        self.status().last_error
    }

    /// The last reload attempt.
    pub fn status(&self) -> ReloadStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Re-reads the directory and swaps in the new policy if its content changed and it
    /// compiles. Content equal to the live version is `Unchanged`; content equal to the last
    /// failed attempt is reported failed again without recompiling, unless `force`.
    /// Blocking (it may tile regions): call it off the async runtime's worker threads.
    pub fn reload(&self, force: bool) -> ReloadOutcome {
        let _serial = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let live = self.live.load().policy.version().to_owned();
        let files = match PolicyFiles::read(&self.dir) {
            Ok(files) => files,
            Err(e) => return self.failed(live, None, &e),
        };
        let version = files.version();
        if version == live {
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            if status.last_error.take().is_some() {
                // The files were put back as the live policy has them: nothing is broken.
                self.metrics.policy_files_match_live();
            }
            status.failed_version = None;
            return ReloadOutcome::Unchanged { version };
        }
        if !force {
            let status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            if status.failed_version.as_deref() == Some(version.as_str()) {
                return ReloadOutcome::Failed {
                    live,
                    error: status.last_error.clone().unwrap_or_default(),
                };
            }
        }
        match compile(&files) {
            Ok(compiled) => {
                let snapshot = Arc::new(Snapshot::new(&self.metrics, compiled.policy));
                if let Some(Err(e)) = self.prepare.get().map(|prepare| prepare(&snapshot)) {
                    return self.failed(live, Some(version), &e);
                }
                for w in &compiled.warnings {
                    tracing::warn!("{w}");
                }
                self.live.store(Arc::clone(&snapshot));
                let now = self.sources.now();
                self.metrics.policy_loaded(&snapshot.policy, now);
                let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
                *status = ReloadStatus {
                    last_error: None,
                    last_attempt_unix_ms: Some(now.0),
                    failed_version: None,
                };
                tracing::info!(from = %live, to = %version, "policy reloaded");
                ReloadOutcome::Swapped {
                    from: live,
                    to: version,
                }
            }
            Err(e) => self.failed(live, Some(version), &e),
        }
    }

    fn failed(&self, live: String, version: Option<String>, e: &PolicyError) -> ReloadOutcome {
        let now = self.sources.now();
        self.metrics.policy_reload_failed(now);
        tracing::error!(error = %e, live_version = %live, "policy reload failed; the previous policy stays live");
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        *status = ReloadStatus {
            last_error: Some(e.to_string()),
            last_attempt_unix_ms: Some(now.0),
            failed_version: version,
        };
        ReloadOutcome::Failed {
            live,
            error: e.to_string(),
        }
    }
}
