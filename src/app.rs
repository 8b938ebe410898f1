//! Builds the proxy stack in one function and runs the listeners, the pressure ticker and
//! graceful shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::{Service, ServiceBuilder};

use crate::admin::{self, AdminState};
use crate::clock::Sources;
use crate::config::Config;
use crate::edge::descriptors::{self, Descriptors, Listener};
use crate::edge::rejection::Body;
use crate::edge::serve::{self, LameDuck};
use crate::live::PolicyStore;
use crate::metrics::Metrics;
use crate::policy::Curve;
use crate::policy::{PolicyError, Warning};
use crate::pressure::{Pressure, PressureGauge, TICK};
use crate::proxy::{AdmissionLayer, AdmissionSettings, BufferBudget};
use crate::signals::Signals;
use crate::upstream::{ClientOptions, Defaults, Dispatch, LiveUpstreams, Upstream};

/// Why the proxy could not start. `serve` exits with code 2 for config errors and 1 for the
/// rest.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The policy directory does not hold a valid policy.
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
    /// The access log cannot be opened.
    #[error(transparent)]
    AccessLog(#[from] crate::record::writer::OpenError),
    /// An upstream of the policy cannot be served as its settings merge with the command
    /// line's.
    #[error("upstream {name:?}: {message}")]
    Upstream {
        /// The upstream's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The TLS certificate pair was refused: its leaf is expired or not yet valid by the
    /// clock, or the files changed since the config was checked.
    #[error("TLS: {0}")]
    Tls(#[from] crate::edge::tls::pair::PairError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// The shared pieces of one running proxy.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The live policy.
    pub store: Arc<PolicyStore>,
    /// The upstreams, each with its own pressure, budgets, clock and client, and the policy
    /// they were built for: the live routing, rebuilt by each reload.
    pub upstreams: Arc<LiveUpstreams>,
    /// The default upstream's pressure (`upstreams`' `default`: a policy cannot redefine
    /// it, so no reload replaces it).
    pub pressure: Arc<PressureGauge>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Buffered body bytes (`--max-buffered-bytes`).
    pub buffers: Arc<BufferBudget>,
    /// What this replica remembers of each device (`--max-devices`).
    pub devices: Arc<crate::devices::DeviceTable>,
    /// The access log (`--access-log`) and the policy preview.
    pub records: crate::record::Records,
    /// The sockets held against the open-files limit, and the idle connections closed first
    /// when they run low.
    pub descriptors: Arc<Descriptors>,
}

/// Builds the request stack, outermost layer first.
pub fn build_stack(
    config: &Config,
    parts: &Parts,
) -> impl Service<Request<Incoming>, Response = http::Response<Body>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    ServiceBuilder::new()
        // Admission first and outermost: it must decide before anything reaches the
        // upstream (a shed request never claims an upstream deduplication key), and it owns
        // the in-flight guard, which must live until the response body ends.
        .layer(AdmissionLayer::new(
            Arc::clone(&parts.store),
            Arc::clone(&parts.upstreams),
            Arc::clone(&parts.buffers),
            Arc::clone(&parts.devices),
            AdmissionSettings {
                stream_header: config.stream_header.clone(),
                max_body: config.max_body,
                body_read_timeout: config.body_read_timeout,
            },
            parts.records.clone(),
        ))
        // The upstream's client last, the one admission chose for the request: header
        // hygiene, forwarding headers, the upstream timeout, and the mapping of client
        // failures to 502/504/408/413 responses (never errors that would make hyper drop the
        // client's connection).
        .service(Dispatch)
}

/// The upstreams of the live policy in `store`, each cold (its pressure starts from nothing
/// learned), its sockets counted against `descriptors`, its series in `metrics`; and the
/// reload step that rebuilds them for each new policy ([`LiveUpstreams::prepare`]). What a
/// `[upstreams.NAME]` table leaves out is the command line's (`--upstream`'s URL for
/// `default`, and `--upstream-timeout`, `--connect-timeout`, `--latency-target`,
/// `--max-inflight`, `--load-report` for every one); `listen` is the proxy's bound address.
///
/// # Errors
/// An upstream whose URL is the proxy's own `listen` address (requests would loop), or
/// whose latency target is not below its timeout once the command line's values are merged.
fn build_upstreams(
    config: &Config,
    store: &PolicyStore,
    listen: SocketAddr,
    descriptors: &Arc<Descriptors>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<LiveUpstreams>, StartError> {
    let defaults = Defaults {
        url: config.upstream.clone(),
        timeout: config.upstream_timeout,
        connect_timeout: config.connect_timeout,
        pool: config.pool,
        controller: config.controller,
        load_report: config.load_report.clone(),
        listen,
    };
    let client = ClientOptions {
        body_limit: config.max_body,
        host: config.host_header,
        trusted: config.trusted_proxies.as_slice().into(),
        case: config.upstream_header_case,
        descriptors: Some(Arc::clone(descriptors)),
    };
    let upstreams = LiveUpstreams::open(store.load(), defaults, client, Arc::clone(metrics))
        .map_err(|e| StartError::Upstream {
            name: e.name,
            message: e.message,
        })?;
    let upstreams = Arc::new(upstreams);
    let live = Arc::clone(&upstreams);
    store.set_prepare(Box::new(move |snapshot| live.prepare(snapshot)));
    Ok(upstreams)
}

/// Whether `policy` can leave a body's upstream unknown until the body is read: a route
/// naming no upstream, while a stream names one other than `default` (the body-memory
/// budget then keeps an account for such bodies, `proxy::BufferBudget::rebalance`).
fn unrouted_bodies(policy: &crate::policy::Policy) -> bool {
    policy.streams_leave_default() && policy.routes().iter().any(|r| r.upstream.is_none())
}

/// `capacity` of each upstream of `table`, at its account's index (0 where no upstream of
/// the table has that account), for [`BufferBudget::rebalance`].
fn capacities(table: &crate::upstream::Upstreams, capacity: impl Fn(&Upstream) -> u32) -> Vec<u32> {
    let mut by_account = vec![0; crate::upstream::ACCOUNTS];
    for up in table.iter() {
        by_account[up.account.index()] = capacity(up);
    }
    by_account
}

/// A running proxy.
#[derive(Debug)]
pub struct Running {
    /// The client listener's bound address.
    pub proxy_addr: SocketAddr,
    /// The admin listener's bound address.
    pub admin_addr: SocketAddr,
    /// Shared pieces (for tests and the demo).
    pub parts: Parts,
    /// The lame-duck flag (`/healthz` 503, `Connection: close` on every answer).
    pub lame_duck: LameDuck,
    shutdown_delay: Duration,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// What SIGTERM does: the lame duck for the shutdown delay (`/healthz` answers 503,
    /// traffic is still served, each answer with `Connection: close`), then
    /// [`Running::shutdown`].
    pub async fn stop(self) {
        if !self.shutdown_delay.is_zero() {
            self.lame_duck.begin();
            tracing::info!(
                delay = ?self.shutdown_delay,
                "lame duck: /healthz answers 503, answers carry Connection: close"
            );
            tokio::time::sleep(self.shutdown_delay).await;
        }
        self.shutdown().await;
    }

    /// Stops accepting on both listeners, lets in-flight requests finish for at most the
    /// drain timeout, cuts what is left, and returns when everything has stopped.
    pub async fn shutdown(self) {
        self.lame_duck.begin();
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        // The lines of the last answers: written, within a bound.
        if let Some(log) = &self.parts.records.log {
            log.drain(Duration::from_secs(2)).await;
        }
    }
}

/// Binds the listeners, loads the policy and starts serving.
///
/// # Errors
/// [`StartError`] for an invalid policy or a listener that cannot bind.
pub async fn start(
    config: Config,
    sources: Sources,
) -> Result<(Running, Vec<Warning>), StartError> {
    start_with(config, sources, &Signals::none()).await
}

/// As [`start`], with the process's signals: SIGHUPs reload the policy.
///
/// # Errors
/// As [`start`].
pub async fn start_with(
    config: Config,
    sources: Sources,
    signals: &Signals,
) -> Result<(Running, Vec<Warning>), StartError> {
    let metrics = Arc::new(Metrics::new());
    let (store, warnings) =
        PolicyStore::open(&config.policies, Arc::clone(&metrics), sources.clone())?;
    let descriptors = Arc::new(Descriptors::of_process(Some(Arc::clone(&metrics))));
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let listener = bind(config.listen).await?;
    let admin_listener = bind(config.admin_listen).await?;
    let proxy_addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listen,
        source,
    })?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: config.admin_listen,
            source,
        })?;
    let upstreams = build_upstreams(&config, &store, proxy_addr, &descriptors, &metrics)?;
    let buffers = Arc::new(BufferBudget::new(
        config.max_buffered_bytes,
        crate::upstream::ACCOUNTS,
    ));
    // Shares from the start (each upstream's capacity unlearned), as every tick sets them.
    buffers.rebalance(
        &capacities(&upstreams.table(), |_| u32::MAX),
        unrouted_bodies(&store.load().policy),
    );
    let parts = Parts {
        metrics: Arc::clone(&metrics),
        store: Arc::new(store),
        pressure: Arc::clone(&upstreams.table().default_upstream().pressure),
        upstreams,
        buffers,
        devices: Arc::new(crate::devices::DeviceTable::new(
            config.max_devices,
            sources.now(),
        )),
        records: crate::record::Records {
            log: config
                .access_log
                .as_ref()
                .map(|log| crate::record::AccessLog::start(log, &metrics, signals))
                .transpose()?,
            preview: Arc::default(),
        },
        descriptors,
    };
    let (shutdown, shutdown_rx) = watch::channel(false);

    // TLS on the proxy listener: the pair checked and served from a live store.
    let tls = config
        .tls
        .as_ref()
        .map(|t| {
            crate::edge::tls::Tls::new(t, Some(Arc::clone(&metrics)), sources.clone()).map(Arc::new)
        })
        .transpose()?;
    let stack = build_stack(&config, &parts);
    let lame_duck = LameDuck::default();
    // Both listeners get the same timeouts and the same bounded drain: a half-sent head on
    // the admin port must not hold shutdown.
    let connections = serve::Connections {
        header_read_timeout: config.header_read_timeout,
        idle_timeout: config.idle_timeout,
        drain_timeout: config.drain_timeout,
        max_header_line: config.max_header_line,
        max_head: config.max_head,
        preserve_header_case: config.upstream_header_case == crate::upstream::HeaderCase::Preserve,
        lame_duck: lame_duck.clone(),
        metrics: Some(Arc::clone(&parts.metrics)),
        // The lines of heads hyper refused itself: only the proxy's listener writes lines.
        refusals: parts
            .records
            .log
            .as_ref()
            .map(|log| crate::edge::refusal::Refusals {
                log: Arc::clone(log),
                store: Arc::clone(&parts.store),
            }),
        descriptors: Arc::clone(&parts.descriptors),
        listener: Listener::Proxy,
        tls: tls.clone(),
    };
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(serve::serve(
        listener,
        stack,
        connections.clone(),
        shutdown_rx.clone(),
    )));
    let router = admin::router(AdminState {
        store: Arc::clone(&parts.store),
        upstreams: Arc::clone(&parts.upstreams),
        metrics: Arc::clone(&parts.metrics),
        lame_duck: lame_duck.clone(),
        devices: Arc::clone(&parts.devices),
        records: parts.records.clone(),
        max_devices: config.max_devices,
        access: config.admin_access.clone(),
        certificates: tls.as_ref().map(|t| Arc::clone(t.store())),
    });
    if !admin_addr.ip().to_canonical().is_loopback() && !config.admin_access.has_token() {
        tracing::info!(
            %admin_addr,
            "admin listener beyond loopback without --admin-token-file: state-changing \
             requests are answered only from loopback (kubectl port-forward)"
        );
    }
    tasks.push(tokio::spawn(serve::serve(
        admin_listener,
        router,
        serve::Connections {
            metrics: None,
            refusals: None,
            listener: Listener::Admin,
            // Plain on purpose: its state-changing endpoints are for loopback, port-forwards
            // and trusted networks (docs/operations.md "TLS").
            tls: None,
            ..connections
        },
        shutdown_rx.clone(),
    )));
    tasks.push(crate::live::reload::spawn(
        Arc::clone(&parts.store),
        config.policy_recheck,
        shutdown_rx.clone(),
        Some(signals.hangups()),
    ));
    if let Some(tls) = &tls {
        tasks.push(crate::edge::tls::watch::spawn(
            Arc::clone(tls.store()),
            config.policy_recheck,
            shutdown_rx.clone(),
            Some(signals.certificate_hangups()),
        ));
    }
    tasks.push(tokio::spawn(tick(parts.clone(), shutdown_rx)));
    tracing::info!(
        %proxy_addr,
        %admin_addr,
        upstream = %config.upstream,
        tls = tls.is_some(),
        policy_version = parts.store.load().policy.version(),
        "shedgate serving"
    );
    Ok((
        Running {
            proxy_addr,
            admin_addr,
            parts,
            lame_duck,
            shutdown_delay: config.shutdown_delay,
            shutdown,
            tasks,
        },
        warnings,
    ))
}

/// Updates each upstream's pressure every [`TICK`] and the metrics that follow from it;
/// drains histogram samples every few seconds.
async fn tick(parts: Parts, mut shutdown: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = tokio::time::Instant::now();
    let mut upkeep = 0u32;
    // Each upstream's seconds spent shedding not yet counted (under one), by name, so a
    // reload that builds it anew under its name continues them. Only the live table's names
    // are kept; one that a reload removes loses less than a second, and its counter goes on
    // from its count when the name comes back (the counter is incremented, never set).
    let mut shedding: std::collections::HashMap<Arc<str>, f64> = std::collections::HashMap::new();
    // The devices past their floor, counted a tenth of the table each second.
    let (mut floor_part, mut past_floor) = (0usize, 0u64);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let now = tokio::time::Instant::now();
        let m = &parts.metrics;
        // The live table: a reload's upstreams from the next tick on.
        let table = parts.upstreams.table();
        shedding.retain(|name, _| table.iter().any(|up| up.name == *name));
        for up in table.iter() {
            let seconds = shedding.entry(Arc::clone(&up.name)).or_default();
            tick_upstream(
                &parts,
                up,
                now,
                now.saturating_duration_since(last),
                seconds,
            );
        }
        // Each upstream's share of the buffered bytes follows its capacity.
        let unrouted = unrouted_bodies(&parts.store.load().policy);
        parts
            .buffers
            .rebalance(&capacities(&table, |up| up.pressure.capacity()), unrouted);
        #[expect(clippy::cast_precision_loss, reason = "bytes below 2^52")]
        m.buffered_bytes.set(parts.buffers.used() as f64);
        last = now;
        upkeep += 1;
        if upkeep.is_multiple_of(20) {
            let (policy, now) = (&parts.store.load().policy, parts.store.sources().now());
            m.export_disabled(policy, now);
            m.export_schedules(policy, now);
            #[expect(clippy::cast_precision_loss, reason = "counts below 2^52")]
            {
                m.devices.set(parts.devices.len() as f64);
                m.device_table_bytes.set(parts.devices.bytes() as f64);
            }
            m.device_evictions.absolute(parts.devices.evictions());
            let per_part = crate::devices::SHARDS.div_ceil(10);
            let from = floor_part * per_part;
            let to = (from + per_part).min(crate::devices::SHARDS);
            past_floor += parts.devices.past_floor(from..to, now);
            floor_part += 1;
            if to == crate::devices::SHARDS {
                #[expect(clippy::cast_precision_loss, reason = "counts below 2^52")]
                m.devices_past_floor.set(past_floor as f64);
                (floor_part, past_floor) = (0, 0);
            }
        }
        if upkeep >= 100 {
            upkeep = 0;
            m.run_upkeep();
        }
    }
}

/// Ticks `up`'s pressure at `now`, `since` the last tick, and exports what follows from it:
/// its pressure as decisions see it, its in-flight count, the rank cut-off, and the seconds
/// it has spent shedding (counted whole, the rest kept in `shedding`).
fn tick_upstream(
    parts: &Parts,
    up: &Upstream,
    now: tokio::time::Instant,
    since: Duration,
    shedding: &mut f64,
) {
    up.pressure.tick(now);
    // What decisions see: at least an open schedule's floor, unless pinned.
    let p = up.pressure.pressure();
    let p = if up.pressure.is_pinned() {
        p
    } else {
        let snapshot = parts.store.load();
        crate::admission::schedule_floor(&snapshot.policy, parts.store.sources().now(), p).0
    };
    let m = &up.metrics;
    m.pressure.set(p.get());
    m.pressure_pinned
        .set(if up.pressure.is_pinned() { 1.0 } else { 0.0 });
    m.inflight.set(f64::from(up.pressure.inflight()));
    m.rank_cutoff.set(Curve::threshold(p));
    if p > Pressure::SHED_FLOOR {
        // Counters hold integers: accumulate exactly, count whole seconds as they pass.
        *shedding += since.as_secs_f64();
        let whole = shedding.floor();
        if whole >= 1.0 {
            *shedding -= whole;
            #[expect(clippy::cast_possible_truncation, reason = "whole seconds, >= 1")]
            #[expect(clippy::cast_sign_loss, reason = "whole seconds, >= 1")]
            m.shedding_seconds.increment(whole as u64);
        }
    }
}

/// Raises the open-files soft limit to the hard one (`edge::descriptors`), then runs until
/// SIGTERM or SIGINT (Ctrl-C), then shuts down gracefully. `signals` were installed
/// at the first line of `main`: a SIGTERM that came while the policy compiled has exited the
/// process already, and SIGHUPs that came then are one reload once the watcher runs.
///
/// # Errors
/// As [`start`].
pub async fn serve(config: Config, signals: Signals) -> Result<(), StartError> {
    // Before the listeners and the policy are opened: the soft open-files limit raised.
    descriptors::raise_and_log(
        config
            .controller
            .max_inflight
            .map(std::num::NonZeroU32::get),
    );
    let (running, warnings) = start_with(config, Sources::default(), &signals).await?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    signals.serving();
    signals.terminated().await;
    tracing::info!("shutdown signal received");
    running.stop().await;
    tracing::info!("stopped");
    Ok(())
}
