//! shedgate — an HTTP admission-control reverse proxy for geospatial webhook streams.
//!
//! Under load it sheds only what is safe to lose (events a later event supersedes) and, among
//! those, the lowest-priority areas first, where area priority is an operator's written
//! decision (H3 resolution-4 cells), never a measure of traffic volume. The rules the code
//! follows are in the repository's `docs/` (`docs/README.md` lists them); doc comments cite
//! them as `docs/FILE.md "Section"`.
//!
//! # Request path
//!
//! ```text
//! client ─► edge (framing guard) ─► proxy (Admission) ─► upstream (Dispatch) ─► upstream
//!                                   │ stream → live policy snapshot (live)  ▲
//!                                   │ body → facts (extract)                │ latency, in-flight
//!                                   │ facts → decide (admission)            │
//!                                   └► shed: edge::rejection (503 + Retry-After)
//!                                     its upstream's pressure (PressureGauge) ◄┘
//! ```
//!
//! # Layout
//!
//! Modules in layer order: each one imports only from the modules listed above it. Inside
//! each module, its own modules refer to each other one way too: no two or more of them in a
//! circle (`tests/proxy/layering.rs` checks it).
//!
//! - [`clock`]: unix milliseconds, the one place that reads the wall clock.
//! - [`signals`]: process signals, handled from the first line of `main` (a thread of their
//!   own; SIGTERM before serving exits at once, SIGHUPs coalesce into reloads, SIGUSR1 reopens
//!   the access log).
//! - [`pressure`]: the [`pressure::Pressure`] value (0..1) and the proportional-integral
//!   controller turning upstream latency, in-flight count and completions into it (the
//!   integral at each tick, the proportional part at each decision), with the no-load
//!   latency it learns (`pressure::noload`, and `pressure::probe` for a replica that has
//!   not seen its upstream calm), or the upstream's own load report (`pressure::report`); no
//!   concurrency number is an input.
//! - [`extract`]: reading facts from bodies — JSON pointers, the walk, format presets, event
//!   times, device ids that name no device (`extract::placeholder`). Knows nothing of
//!   policies.
//! - [`policy`]: the policy model (streams, classes, routes, areas, the shed curve with
//!   [`policy::Rank`], named upstreams as [`policy::UpstreamSpec`]s), the files' schema, and
//!   compilation into an immutable [`policy::Policy`] with errors that name file, line and
//!   field.
//! - [`admission`]: the pure decision — stream class, staleness, area rank, the shed curve,
//!   budgets — and whether a fix may be decided on its device's history
//!   (`admission::trust`). Takes `now`, pressure and the random draw as arguments.
//! - [`devices`]: the device table, what this replica remembers of each device (its credit,
//!   report interval, last admitted and newest delivered fix and where it was): the history
//!   [`admission::DeviceHistory`] its decisions read.
//! - [`stats`] and [`metrics`]: the operational summary behind `/stats`, and metric names as
//!   constants with descriptions and pre-registered handles.
//! - [`live`]: the [`live::PolicyStore`] that swaps compiled snapshots atomically (after a
//!   prepare step a layer above registers: the upstream table rebuilt for the new snapshot),
//!   and the reload that watches the policy directory where its symlinks lead
//!   (`live::watched`).
//! - [`record`]: every decision on record — the access log (one JSON line per answer,
//!   written off the request path), the replay of a log under a policy, and the preview of a
//!   candidate policy decided in shadow.
//! - [`edge`]: client connections (accept, timeouts, idle connections parked, drain, the
//!   open-files limit and the idle connections closed first when descriptors run low, each
//!   holding its place among them, `edge::reuse`), the request-smuggling guard on each
//!   connection's raw bytes, the one place where reasons become statuses, `Retry-After` and
//!   problem+json, the access-log line of a head hyper's parser refused
//!   (`edge::refusal`), and TLS on the client listener (`edge::tls`: the handshake, bounded
//!   and metered, and the certificate pair swapped live, `edge::tls::pair`,
//!   `edge::tls::watch`); hyper's HTTP/1.1 connection (`edge::serve::h1`), or HTTP/2 for
//!   connections whose ALPN chose it (`edge::serve::h2`).
//! - [`upstream`]: [`upstream::Upstream`]: everything one upstream owns — its pooled client,
//!   its pressure (one controller per upstream, never shared), its class and freshness
//!   budgets, its clock skew, its load-report reading, its metric series
//!   ([`metrics::UpstreamMetrics`], labelled `upstream`); [`upstream::Upstreams`], the table
//!   the request path, the pressure tick and the admin listener reach each one by
//!   ([`upstream::UpstreamId`]), read by a request with its policy as one
//!   [`upstream::Routing`]; [`upstream::LiveUpstreams`], which a reload rebuilds by name
//!   (unchanged upstreams kept, a new URL reached through a new pool, an added one cold);
//!   [`upstream::Dispatch`], the stack's innermost service,
//!   sending each request to the upstream admission chose for it. And the client's header
//!   hygiene and the reader of the upstream's ORCA load report (`upstream::load_report`).
//! - [`proxy`]: the tower [`proxy::AdmissionLayer`], one stage per file (resolve in the
//!   service, read, budget, forward, and `proxy::shed`, the answer when a budget runs out),
//!   holding in-flight accounting until the body ends.
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, `/policy`, `/reload`,
//!   `/pressure`, `/stats`), behind its guard (`admin::guard`: only requests addressed to it;
//!   state changes never from a browser, and from beyond loopback only with its token).
//! - [`config`]: process settings (flags and a TOML file), validated into [`config::Config`].
//! - [`app`]: builds the whole stack in one function and runs the listeners.
//! - `demo` (cargo feature `demo`, on by default): the self-contained demo (fixed-capacity
//!   upstream, proxy, real geography) and the upstream simulator (worker-count steps) with
//!   the closed-loop scenario runner for one or more replicas (`demo::sim`).
//! - `plot` (cargo feature `plot`, on by default): pictures for operators with an embedded
//!   font — the policy's shed curve (`shedgate curve`) and the look the benchmarks' plots
//!   share. Imports only [`policy`] and [`pressure`].

pub mod admin;
pub mod admission;
pub mod app;
pub mod clock;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod devices;
pub mod edge;
pub mod extract;
pub mod live;
pub mod metrics;
#[cfg(feature = "plot")]
pub mod plot;
pub mod policy;
pub mod pressure;
pub mod proxy;
pub mod record;
pub mod signals;
pub mod stats;
pub mod upstream;

/// Boxed error used where errors of several layers meet (body streams, the proxy client).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
