//! shedgate — an HTTP admission-control reverse proxy for geospatial webhook streams.
//!
//! Under load it sheds only what is safe to lose (events a later event supersedes) and, among
//! those, the lowest-priority areas first, where area priority is an operator's written
//! decision (H3 resolution-4 cells), never a measure of traffic volume. The specification is
//! PRODUCT.md in the team's shared folder; section names cited in doc comments refer to it.
//!
//! # Request path
//!
//! ```text
//! client ─► listener (app) ─► Admission (middleware) ─► Proxy (upstream) ─► upstream
//!                              │ stream → policy snapshot (policy)     ▲
//!                              │ body facts → decide (admission)       │ latency, in-flight
//!                              └► shed: rejection (503 + Retry-After)  └─ PressureGauge (pressure)
//! ```
//!
//! # Layout
//!
//! - [`config`]: process settings (flags and a TOML file), validated into [`config::Config`].
//! - [`policy`]: the policy files' schema, compilation into an immutable [`policy::Policy`],
//!   and the [`policy::PolicyStore`] that swaps snapshots atomically.
//! - [`admission`]: the pure decision — stream class, staleness, area rank, the shed curve.
//!   Takes `now`, pressure and the random draw as arguments.
//! - [`pressure`]: the proportional-integral controller turning in-flight count and upstream
//!   latency into pressure 0..1 (the integral at each tick, the proportional part at each
//!   decision).
//! - [`middleware`]: the tower [`middleware::AdmissionLayer`] that gathers inputs, calls
//!   [`admission::decide`] in `call`, and holds in-flight accounting until the body ends.
//! - [`upstream`]: the pooled proxy client and header hygiene.
//! - [`rejection`]: the one place where reasons become statuses, `Retry-After` and
//!   problem+json.
//! - [`metrics`]: metric names as constants with descriptions, and pre-registered handles.
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, `/policy`, `/reload`,
//!   `/pressure`, `/stats`).
//! - [`stats`]: the operational summary behind `/stats`.
//! - [`app`]: builds the whole stack in one function and runs the listeners.
//! - [`framing`]: the request-smuggling guard on each connection's raw bytes.
//! - [`demo`]: the self-contained demo (fixed-capacity upstream, proxy, real geography).
//! - [`sim`]: the upstream simulator and the closed-loop scenario runner.

pub mod admin;
pub mod admission;
pub mod app;
pub mod config;
pub mod demo;
pub mod framing;
pub mod metrics;
pub mod middleware;
pub mod policy;
pub mod pressure;
pub mod rejection;
pub mod sim;
pub mod stats;
pub mod upstream;

/// Boxed error used where errors of several layers meet (body streams, the proxy client).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
