//! The live policy: an `ArcSwap` of compiled snapshots. A reload reads and compiles first and
//! swaps atomically; a failed reload keeps the last good snapshot (docs/operations.md
//! "Policy files and hot reload"). Each request loads one snapshot and keeps it to its end.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::clock::Sources;
use crate::metrics::{Metrics, PolicyMetrics};
use crate::policy::{Compiled, Policy, PolicyError, PolicyFiles, Warning, compile};

/// Why a reload that changes the policy's upstreams is refused: each upstream's state (its
/// pressure, pool and budgets) is built at start for the upstreams the policy names then.
pub const UPSTREAMS_CHANGE_REFUSED: &str = "the upstreams ([upstreams.NAME] tables) differ \
     from the ones this process serves, and changing them takes a restart in this version; \
     the live policy is kept (moving a route or stream between the upstreams it has needs \
     no restart)";

/// Compiles `files` for serving: as `shedgate check` does, and then, for a reload (`live`:
/// the policy served now), refuses a policy whose upstreams differ from the live one's
/// ([`UPSTREAMS_CHANGE_REFUSED`], at the first place the files name one).
fn compile_served(files: &PolicyFiles, live: Option<&Policy>) -> Result<Compiled, PolicyError> {
    let compiled = compile(files)?;
    if let Some(live) = live
        && live.upstreams() != compiled.policy.upstreams()
    {
        let location = compiled
            .policy
            .upstreams_named_at()
            .cloned()
            .unwrap_or_else(|| crate::policy::Location {
                file: files.dir().join("streams.toml"),
                line_col: None,
                field: Some("upstreams".into()),
            });
        return Err(PolicyError {
            location,
            message: UPSTREAMS_CHANGE_REFUSED.into(),
        });
    }
    Ok(compiled)
}

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

/// The live policy of one proxy.
#[derive(Debug)]
pub struct PolicyStore {
    dir: PathBuf,
    live: ArcSwap<Snapshot>,
    metrics: Arc<Metrics>,
    status: Mutex<ReloadStatus>,
    /// Serialises reloads (watcher, SIGHUP, admin) so two compiles never race to swap.
    reloading: Mutex<()>,
    /// The wall clock of reload times.
    sources: Sources,
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
        let compiled = compile_served(&PolicyFiles::read(dir)?, None)?;
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
            },
            compiled.warnings,
        ))
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
        match compile_served(&files, Some(&self.live.load().policy)) {
            Ok(compiled) => {
                for w in &compiled.warnings {
                    tracing::warn!("{w}");
                }
                let snapshot = Arc::new(Snapshot::new(&self.metrics, compiled.policy));
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
