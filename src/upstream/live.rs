//! The live upstreams: the [`Routing`] requests read (the policy snapshot and the upstream
//! table built for it, swapped as one), and what a reload does to each upstream
//! (docs/operations.md "Changing upstreams live").
//!
//! A reload builds the new table from the old one by name, before the new policy goes live
//! (the policy store calls [`LiveUpstreams::prepare`] just before its swap; `live` never
//! names this module):
//!
//! - an upstream whose settings are unchanged is the same `Arc<Upstream>`: its pressure,
//!   what it learned, its pin and its pool carry on;
//! - one with a new URL or timeouts is reached anew ([`Upstream::reached_anew`]): a new pool
//!   for new requests, the same controller and budgets, so the requests still in flight on
//!   the old pool stay counted where the new ones are;
//! - one with a new latency target, in-flight cap or load report gets a new controller,
//!   cold as at start ([`Upstream::controlled_anew`]), that counts the requests in flight
//!   under the old one: the in-flight count, the class and freshness budgets and the
//!   account of buffered bytes carry over, so the cap and the budgets bind across the
//!   change;
//! - an added one is built cold, as at start; a removed one is left out.
//!
//! Nothing is taken from a request in flight: each holds the [`Routing`] it started with,
//! and with it every upstream it may use. An old upstream ends with the last request that
//! holds it; its pool then closes its idle connections, and one still streaming an answer
//! closes when the answer ends.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::account::Accounts;
use super::set::{Routing, Upstreams};
use super::settings::{ClientOptions, Defaults};
use super::state::Upstream;
use crate::live::store::Snapshot;
use crate::metrics::Metrics;
use crate::policy::{Location, PolicyError};

/// An upstream of a policy whose settings cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("upstream {name:?}: {message}")]
pub struct UpstreamError {
    /// Its name.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

/// The routing requests read, and how a reload rebuilds it.
#[derive(Debug)]
pub struct LiveUpstreams {
    live: ArcSwap<Routing>,
    defaults: Defaults,
    client: ClientOptions,
    accounts: Accounts,
    metrics: Arc<Metrics>,
    /// One rebuild at a time (the store serialises its reloads already).
    rebuilding: Mutex<()>,
}

impl LiveUpstreams {
    /// The upstreams of `snapshot`'s policy, each cold, their clients of `client`'s, what
    /// the policy leaves out taken from `defaults`, their series in `metrics`.
    ///
    /// # Errors
    /// The first upstream whose merged settings are refused ([`Defaults::settings`]).
    pub fn open(
        snapshot: Arc<Snapshot>,
        defaults: Defaults,
        client: ClientOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Self, UpstreamError> {
        let accounts = Accounts::default();
        let mut table = Vec::with_capacity(snapshot.policy.upstreams().len());
        for spec in snapshot.policy.upstreams() {
            let settings = defaults
                .settings(spec)
                .map_err(|(_, message)| UpstreamError {
                    name: spec.name.clone(),
                    message,
                })?;
            let account = accounts.take().ok_or_else(|| UpstreamError {
                name: spec.name.clone(),
                message: "no account of the buffered bytes is free".into(),
            })?;
            table.push(Arc::new(Upstream::build(
                &spec.name, settings, &client, account, &metrics,
            )));
        }
        let routing = Routing {
            snapshot,
            upstreams: Upstreams::new(table),
        };
        Ok(LiveUpstreams {
            live: ArcSwap::from_pointee(routing),
            defaults,
            client,
            accounts,
            metrics,
            rebuilding: Mutex::new(()),
        })
    }

    /// The routing now: hold it for the whole request.
    pub fn load(&self) -> Arc<Routing> {
        self.live.load_full()
    }

    /// The upstream table now (for the tick and the admin listener).
    pub fn table(&self) -> Upstreams {
        self.live.load().upstreams.clone()
    }

    /// Builds the table of `snapshot`'s policy from the live one, by name (the module's
    /// doc says what each kind of change does), and makes the pair the live routing: from
    /// now on every request is routed by `snapshot`. Call it just before the policy store
    /// swaps `snapshot` in.
    ///
    /// # Errors
    /// An upstream whose merged settings are refused ([`Defaults::settings`]), placed at
    /// its `[upstreams.NAME]` table; the live routing is kept.
    pub fn prepare(&self, snapshot: &Arc<Snapshot>) -> Result<(), PolicyError> {
        let _one = self.rebuilding.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.table();
        let policy = &snapshot.policy;
        let mut table = Vec::with_capacity(policy.upstreams().len());
        // What became of each upstream, logged once the new table is live.
        let mut changes = Vec::new();
        for spec in policy.upstreams() {
            // Where the files define it (`default`, which the command line defines and
            // which was checked at start, is never refused).
            let at = policy
                .upstream(&spec.name)
                .and_then(|id| policy.upstream_at(id))
                .or(policy.upstreams_named_at())
                .cloned()
                .unwrap_or_else(|| Location {
                    file: "streams.toml".into(),
                    line_col: None,
                    field: Some("upstreams".into()),
                });
            let refused = |key: Option<&str>, message: String| {
                let mut location = at.clone();
                if let Some(key) = key {
                    location.field = Some(format!("upstreams.{:?}.{key}", spec.name));
                }
                PolicyError { location, message }
            };
            let settings = self
                .defaults
                .settings(spec)
                .map_err(|(key, message)| refused(Some(key), message))?;
            let up = match old.named(&spec.name) {
                Some(up) if up.settings == settings => Arc::clone(up),
                Some(up) if up.settings.same_controller(&settings) => {
                    changes.push(Change::ReachedAnew(up.name.clone(), settings.url.clone()));
                    Arc::new(up.reached_anew(settings, &self.client))
                }
                Some(up) => {
                    changes.push(Change::Cold(up.name.clone(), up.pressure.is_pinned()));
                    Arc::new(up.controlled_anew(settings, &self.client))
                }
                None => {
                    let account = self.accounts.take().ok_or_else(|| {
                        refused(
                            None,
                            "every account of the buffered bytes is held, by upstreams that \
                             earlier reloads removed and that still have requests in flight: \
                             once those have ended, reload again (POST /reload or SIGHUP)"
                                .into(),
                        )
                    })?;
                    changes.push(Change::Added(
                        spec.name.as_str().into(),
                        settings.url.clone(),
                    ));
                    Arc::new(Upstream::build(
                        &spec.name,
                        settings,
                        &self.client,
                        account,
                        &self.metrics,
                    ))
                }
            };
            table.push(up);
        }
        let removed = old.iter().filter(|up| policy.upstream(&up.name).is_none());
        changes.extend(removed.map(|up| Change::Removed(up.name.clone())));
        self.live.store(Arc::new(Routing {
            snapshot: Arc::clone(snapshot),
            upstreams: Upstreams::new(table),
        }));
        for change in changes {
            change.log();
        }
        Ok(())
    }
}

/// What a reload did to one upstream it did not keep as it was.
enum Change {
    Added(Arc<str>, http::Uri),
    ReachedAnew(Arc<str>, http::Uri),
    /// A new controller; whether the old one was pinned.
    Cold(Arc<str>, bool),
    Removed(Arc<str>),
}

impl Change {
    fn log(&self) {
        match self {
            Change::Added(name, url) => {
                tracing::info!(upstream = &**name, %url, "upstream added; its pressure starts cold");
            }
            Change::ReachedAnew(name, url) => tracing::info!(
                upstream = &**name,
                %url,
                "upstream reached anew: new requests take a new pool, the old one closes once \
                 its requests have ended; its pressure carries on"
            ),
            Change::Cold(name, false) => tracing::info!(
                upstream = &**name,
                "upstream's latency target, in-flight cap or load report changed: a new \
                 controller, its pressure starting cold"
            ),
            Change::Cold(name, true) => tracing::warn!(
                upstream = &**name,
                "upstream's latency target, in-flight cap or load report changed: a new \
                 controller, its pressure starting cold; the old one's pin is gone with it"
            ),
            Change::Removed(name) => tracing::info!(
                upstream = &**name,
                "upstream removed: its requests in flight end as they would have, then its \
                 connections close"
            ),
        }
    }
}
