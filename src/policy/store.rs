//! The live policy: an `ArcSwap` of compiled snapshots. A reload compiles first and swaps
//! atomically; a failed reload keeps the last good snapshot (PRODUCT.md "Policy files and
//! hot reload"). Each request loads one snapshot and keeps it to its end.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::{Policy, PolicyError, Warning, load_dir};
use crate::metrics::{Metrics, PolicyMetrics};

/// A compiled policy with its pre-registered metric handles.
#[derive(Debug)]
pub struct Snapshot {
    /// The policy.
    pub policy: Policy,
    /// Its metric handles, registered lazily per label set.
    pub metrics: PolicyMetrics,
}

/// The live policy of one proxy.
#[derive(Debug)]
pub struct PolicyStore {
    dir: PathBuf,
    live: ArcSwap<Snapshot>,
    metrics: Arc<Metrics>,
    last_error: Mutex<Option<String>>,
}

impl PolicyStore {
    /// Loads the policy in `dir`.
    ///
    /// # Errors
    /// The [`PolicyError`] of the first load: a proxy does not start on a broken policy.
    pub fn open(dir: &Path, metrics: Arc<Metrics>) -> Result<(Self, Vec<Warning>), PolicyError> {
        let compiled = load_dir(dir)?;
        let snapshot = Snapshot {
            metrics: PolicyMetrics::new(&metrics, &compiled.policy),
            policy: compiled.policy,
        };
        metrics.policy_loaded(snapshot.policy.version());
        Ok((
            PolicyStore {
                dir: dir.to_owned(),
                live: ArcSwap::from_pointee(snapshot),
                metrics,
                last_error: Mutex::new(None),
            },
            compiled.warnings,
        ))
    }

    /// The live snapshot. Hold it for the whole request.
    pub fn load(&self) -> Arc<Snapshot> {
        self.live.load_full()
    }

    /// The policy directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last reload error, if the last reload failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().map(|e| e.clone()).unwrap_or(None)
    }

    /// Re-reads the directory; swaps in the new policy if it compiles, keeps the old one if
    /// not. Returns the live snapshot after the attempt.
    ///
    /// # Errors
    /// The [`PolicyError`] of a policy that did not compile (the previous one stays live).
    pub fn reload(&self) -> Result<Arc<Snapshot>, PolicyError> {
        let result = load_dir(&self.dir);
        let mut last_error = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(compiled) => {
                let snapshot = Arc::new(Snapshot {
                    metrics: PolicyMetrics::new(&self.metrics, &compiled.policy),
                    policy: compiled.policy,
                });
                self.live.store(Arc::clone(&snapshot));
                self.metrics.policy_loaded(snapshot.policy.version());
                *last_error = None;
                Ok(snapshot)
            }
            Err(e) => {
                self.metrics.policy_reload_failed();
                *last_error = Some(e.to_string());
                Err(e)
            }
        }
    }
}
