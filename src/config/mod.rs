//! Process settings: command-line flags and an optional TOML file (flags win), parsed and then
//! validated into a [`Config`] that cannot hold bad values.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::fmt;

use clap::Args;
use http::Uri;
use http::header::HeaderName;
use serde::{Deserialize, Serialize};

pub use crate::policy::loops_to;
use crate::pressure::ControllerConfig;
use crate::upstream::load_report::LoadReportField;
use crate::upstream::{HeaderCase, HostHeader};

mod admin;
mod record;
mod tls;
mod values;

pub use values::{HumanDelay, HumanDuration};

/// `shedgate serve` settings: one definition for the flags and the `--config` file. Every
/// flag is also a file key of the same name (kebab-case); a flag given on the command line
/// (or its environment variable) wins over the file, and the file over the defaults.
#[derive(Debug, Clone, Default, Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeArgs {
    /// TOML file with any of the settings below.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to accept client traffic on [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Upstream base URL, `http://host:port[/prefix]` (required).
    #[arg(long, value_name = "URL", env = "SHEDGATE_UPSTREAM")]
    pub upstream: Option<String>,
    /// Policy directory [default: ./policies].
    #[arg(long, value_name = "DIR")]
    pub policies: Option<PathBuf>,
    /// Admin listener address (metrics, health, policy, pressure) [default: 127.0.0.1:9901].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// Host names the admin listener answers besides IP addresses and `localhost` (a Service
    /// name, a probe's `Host`), comma-separated or repeated; any other `Host` gets 421
    /// [default: none].
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub admin_allow_host: Option<Vec<String>>,
    /// File holding the token that state-changing admin requests from beyond loopback send as
    /// `Authorization: Bearer TOKEN` (one line of at least 32 letters, digits or `-._~+/`; a
    /// trailing newline is ignored); without it they are refused. Loopback needs none
    /// [default: none].
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Header carrying the stream name [default: X-Stream].
    #[arg(long, value_name = "NAME")]
    pub stream_header: Option<String>,
    /// Request body limit in bytes [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    pub max_body: Option<u64>,
    /// Sheddable body bytes the proxy may hold at once; over it, sheddable requests are shed
    /// (reason `memory`) [default: a quarter of the cgroup v2 `memory.max`, else 256 MiB].
    #[arg(long, value_name = "BYTES")]
    pub max_buffered_bytes: Option<u64>,
    /// Time the upstream has to send response headers, e.g. `10s` [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub upstream_timeout: Option<HumanDuration>,
    /// Time to connect to the upstream [default: 2s].
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<HumanDuration>,
    /// Time an idle upstream connection may be reused; keep it below the upstream's own
    /// keep-alive timeout (Node.js: 5s) [default: 4s].
    #[arg(long, value_name = "DURATION")]
    pub pool_idle_timeout: Option<HumanDuration>,
    /// Idle connections kept per upstream (as nginx's `keepalive N`); past it the least
    /// recently used one is closed, and 0 closes each after its answer [default: 1024].
    #[arg(long, value_name = "N")]
    pub pool_max_idle: Option<usize>,
    /// Time a client has to finish a request head once it has started [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub header_read_timeout: Option<HumanDuration>,
    /// Time a connection may wait for a request, from accept or the previous response; keep
    /// it above the load balancer's idle timeout (nginx, AWS ALB: 60s) [default: 75s].
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<HumanDuration>,
    /// Time a client has to send the whole request body [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub body_read_timeout: Option<HumanDuration>,
    /// A safety cap on this replica's in-flight requests: past it, pressure reads full.
    /// Optional; "full" is learned from latency, so leave it unset unless a hard per-replica
    /// limit is wanted (docs/operations.md "Sizing") [default: none].
    #[arg(long, value_name = "N")]
    pub max_inflight: Option<u32>,
    /// Upstream latency considered at target (pressure 0.5), e.g. `50ms` [default: 100ms].
    #[arg(long, value_name = "DURATION")]
    pub latency_target: Option<HumanDuration>,
    /// The ORCA metric of the upstream's `endpoint-load-metrics` answers to read as its
    /// utilisation, in-flight over its concurrency (1.0: every worker busy, none waiting):
    /// `application_utilization`, `cpu_utilization` or `named_metrics.NAME`. Every replica
    /// then reads the same queue (docs/operations.md "Sizing") [default: none, not read].
    #[arg(long, value_name = "METRIC")]
    pub load_report: Option<String>,
    /// Time in-flight requests get to finish on shutdown, both listeners; past it connections
    /// are cut [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<HumanDuration>,
    /// Lame duck on SIGTERM: /healthz answers 503 and answers carry `Connection: close` while
    /// traffic is still served, for this long before the listeners stop; 0 disables
    /// [default: 5s].
    #[arg(long, value_name = "DURATION")]
    pub shutdown_delay: Option<HumanDelay>,
    /// Safety-net re-check of the policy directory, besides the file watcher [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub policy_recheck: Option<HumanDuration>,
    /// `Host` sent upstream: `client` (the client's, unchanged) or `upstream` (the upstream
    /// URL's authority) [default: client].
    #[arg(long, value_name = "client|upstream")]
    pub host_header: Option<HostHeader>,
    /// Header-name case on the upstream leg: `preserve` (each name as the sender wrote it,
    /// names the proxy adds in title case, as nginx does), `title` (every name title-cased)
    /// or `lower` [default: preserve].
    #[arg(long, value_name = "preserve|title|lower")]
    pub upstream_header_case: Option<HeaderCase>,
    /// Peers whose forwarding headers (`X-Forwarded-*`, `Forwarded`) are kept and extended,
    /// as CIDRs, comma-separated (a load balancer's or ingress's addresses); everyone else's
    /// are replaced [default: none].
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',')]
    pub trusted_proxies: Option<Vec<ipnet::IpNet>>,
    /// Longest request header line, bytes; longer gets 431 [default: 8192, nginx's].
    #[arg(long, value_name = "BYTES")]
    pub max_header_line: Option<usize>,
    /// Largest request head (request line and headers), bytes; larger gets 431
    /// [default: 32768, nginx's 4 × 8 KiB].
    #[arg(long, value_name = "BYTES")]
    pub max_head: Option<usize>,
    /// Most devices this replica remembers (54 bytes of room each; the table starts small and grows
    /// as devices come); past it, the longest-silent device of a set is forgotten
    /// [default: 1048576, 54 MiB at most].
    #[arg(long, value_name = "N")]
    pub max_devices: Option<usize>,
    /// Write one JSON line per answered request to this file (`-`: standard output), off the
    /// request path: lines the writer cannot keep up with are dropped and counted; SIGUSR1
    /// reopens the file [default: none].
    #[arg(long, value_name = "PATH")]
    pub access_log: Option<String>,
    /// Share of each outcome's requests the access log writes, e.g. `forwarded=0.01,shed=1`
    /// (outcomes: forwarded, shed, rejected, upstream_error) [default: every line].
    #[arg(long, value_name = "OUTCOME=RATE,...")]
    pub access_log_sample: Option<String>,
    /// File holding the secret device ids are keyed-hashed with in the access log (at least
    /// 16 bytes once the ASCII whitespace at either end is removed, the same on every
    /// replica); without it, lines name no device [default: none].
    #[arg(long, value_name = "FILE")]
    pub access_log_secret_file: Option<PathBuf>,
    /// Write the peer's whole address in the access log, not its /24 (IPv4) or /48 (IPv6)
    /// [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub access_log_full_peer: Option<bool>,
    /// Access-log lines waiting to be written, at most; past it new lines are dropped and
    /// counted, never waited for [default: 65536].
    #[arg(long, value_name = "LINES")]
    pub access_log_queue: Option<usize>,
    /// This replica's name in the access log [default: $HOSTNAME, else the host name].
    #[arg(long, value_name = "NAME")]
    pub replica: Option<String>,
    /// Serve HTTPS on `--listen` with this PEM certificate chain (the leaf first), reloaded
    /// when it changes; needs `--tls-key`. The admin listener stays plain [default: none,
    /// plain HTTP].
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert` (PKCS#8, RSA or SEC1 EC) [default: none].
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Time a client has to complete its TLS handshake from accept [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub tls_handshake_timeout: Option<HumanDuration>,
    /// TLS handshakes in progress at most; past it the oldest incomplete one is closed
    /// [default: 1024].
    #[arg(long, value_name = "N")]
    pub tls_max_handshakes: Option<usize>,
    /// HTTP/2 (negotiated over TLS): streams a connection may have open at once, advertised
    /// in SETTINGS; more are refused with REFUSED_STREAM [default: 128, nginx's].
    #[arg(long, value_name = "N")]
    pub h2_max_concurrent_streams: Option<u32>,
    /// HTTP/2: streams a client may reset before the proxy accepts them, at once; past it the
    /// connection is closed with GOAWAY ENHANCE_YOUR_CALM (rapid reset) [default: 20].
    #[arg(long, value_name = "N")]
    pub h2_max_pending_resets: Option<usize>,
    /// HTTP/2: streams the proxy may reset for a client's errors over a connection's life;
    /// past it the connection is closed with GOAWAY ENHANCE_YOUR_CALM [default: 1024].
    #[arg(long, value_name = "N")]
    pub h2_max_error_resets: Option<usize>,
}

impl ServeArgs {
    /// These settings over `file`'s: each key set here wins. Generic over the fields (both
    /// go through the same serde form), so no setting can be left out of the merge.
    ///
    /// # Errors
    /// A flag whose value has no TOML form (a `--max-body` above `i64::MAX`, a path that is
    /// not UTF-8) cannot be merged: [`ConfigError::Invalid`] naming the config file.
    fn over(&self, file: &ServeArgs) -> Result<ServeArgs, ConfigError> {
        let unmergeable = |e: &dyn fmt::Display| {
            invalid(
                "config",
                format!("a flag cannot be combined with the config file: {e}"),
            )
        };
        let mut merged = toml::Table::try_from(file).map_err(|e| unmergeable(&e))?;
        merged.extend(toml::Table::try_from(self).map_err(|e| unmergeable(&e))?);
        ServeArgs::deserialize(merged).map_err(|e| unmergeable(&e))
    }
}

/// Validated process settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Client listener.
    pub listen: SocketAddr,
    /// Upstream base URL (`http`, with an authority).
    pub upstream: Uri,
    /// Policy directory.
    pub policies: PathBuf,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// Who may address the admin listener, and its token.
    pub admin_access: crate::admin::guard::AdminAccess,
    /// Stream header.
    pub stream_header: HeaderName,
    /// Body limit, bytes (positive).
    pub max_body: u64,
    /// Budget of buffered sheddable body bytes (at least `max_body`).
    pub max_buffered_bytes: u64,
    /// Upstream response-header timeout (positive).
    pub upstream_timeout: Duration,
    /// Upstream connect timeout (positive).
    pub connect_timeout: Duration,
    /// Idle upstream connections kept per upstream, and for how long
    /// (`--pool-max-idle`, `--pool-idle-timeout`).
    pub pool: crate::upstream::pool::Limits,
    /// Client header read timeout, from a head's first byte (positive).
    pub header_read_timeout: Duration,
    /// Client idle timeout between requests (positive, not below the header read timeout).
    pub idle_timeout: Duration,
    /// Client body read timeout (positive).
    pub body_read_timeout: Duration,
    /// Pressure controller settings.
    pub controller: ControllerConfig,
    /// The ORCA metric read as the upstream's utilisation, if any (`--load-report`).
    pub load_report: Option<LoadReportField>,
    /// Shutdown drain time.
    pub drain_timeout: Duration,
    /// Lame-duck time on SIGTERM before the listeners stop (zero: none).
    pub shutdown_delay: Duration,
    /// Periodic policy re-check interval.
    pub policy_recheck: Duration,
    /// How `Host` is forwarded.
    pub host_header: HostHeader,
    /// Header-name case on the upstream leg.
    pub upstream_header_case: HeaderCase,
    /// Peers whose forwarding headers are kept and extended.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Longest request header line, bytes.
    pub max_header_line: usize,
    /// Largest request head, bytes (at least `max_header_line`).
    pub max_head: usize,
    /// Most devices the device table remembers (at least 1).
    pub max_devices: usize,
    /// The access log, when `--access-log` is set.
    pub access_log: Option<crate::record::LogConfig>,
    /// This replica's name (`--replica`).
    pub replica: std::sync::Arc<str>,
    /// TLS on the proxy listener (`--tls-cert`, `--tls-key`), `None` for plain HTTP.
    pub tls: Option<crate::edge::tls::TlsSettings>,
}

/// A setting that is missing, malformed or contradicts another. `serve` exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read or parsed.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A setting is missing or invalid.
    #[error("setting `{key}`: {message}")]
    Invalid {
        /// The flag / file key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

fn duration(value: Option<HumanDuration>, default: Duration) -> Duration {
    value.map_or(default, |d| d.0)
}

impl Config {
    /// Merges flags over the `--config` file over defaults, and validates.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable file, an unknown key, a missing upstream, a bad
    /// value, or contradictory settings (the same address for both listeners; an upstream
    /// that is the proxy's own listener).
    pub fn from_args(args: ServeArgs) -> Result<Config, ConfigError> {
        let args = match &args.config {
            Some(path) => args.over(&read_file(path)?)?,
            None => args,
        };
        let (access_log, replica) = record::access_log(&args)?;
        let admin_access = admin::access(&args)?;
        let tls = tls::settings(&args)?;
        let listen = args
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let admin_listen = args
            .admin_listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9901)));
        if listen == admin_listen && listen.port() != 0 {
            return Err(invalid(
                "admin-listen",
                format!("{admin_listen} is also the proxy's --listen address"),
            ));
        }
        let upstream_text = args.upstream.ok_or_else(|| {
            invalid(
                "upstream",
                "required: the URL of the ingestion endpoint, e.g. http://127.0.0.1:3000",
            )
        })?;
        let upstream =
            crate::policy::parse_url(&upstream_text).map_err(|e| invalid("upstream", e))?;
        if let Some(addr) = loops_to(&upstream, listen) {
            return Err(invalid(
                "upstream",
                format!("{addr} is the proxy's own --listen address: requests would loop"),
            ));
        }
        let stream_header_text = args.stream_header.unwrap_or_else(|| "X-Stream".to_owned());
        let stream_header = HeaderName::try_from(stream_header_text.as_str()).map_err(|_| {
            invalid(
                "stream-header",
                format!("{stream_header_text:?} is not a header name"),
            )
        })?;
        let max_body = args.max_body.unwrap_or(1024 * 1024);
        if max_body == 0 {
            return Err(invalid("max-body", "must be positive"));
        }
        let max_buffered_bytes = args.max_buffered_bytes.unwrap_or_else(|| {
            default_buffered_bytes(
                std::fs::read_to_string("/sys/fs/cgroup/memory.max")
                    .ok()
                    .as_deref(),
            )
            .max(max_body)
        });
        if max_buffered_bytes < max_body {
            return Err(invalid(
                "max-buffered-bytes",
                format!("{max_buffered_bytes} is below max-body {max_body}: no body could be read"),
            ));
        }
        let max_inflight = args
            .max_inflight
            .map(|n| NonZeroU32::new(n).ok_or_else(|| invalid("max-inflight", "must be positive")))
            .transpose()?;
        let upstream_timeout = duration(args.upstream_timeout, Duration::from_secs(10));
        let latency_target = duration(args.latency_target, Duration::from_millis(100));
        if latency_target >= upstream_timeout {
            return Err(invalid(
                "latency-target",
                format!(
                    "{latency_target:?} is not below upstream-timeout {upstream_timeout:?}: \
                     requests would time out before pressure rises"
                ),
            ));
        }
        let load_report = args
            .load_report
            .map(|text| text.parse().map_err(|e: String| invalid("load-report", e)))
            .transpose()?;
        let max_header_line = args.max_header_line.unwrap_or(8 * 1024);
        let max_head = args.max_head.unwrap_or(32 * 1024);
        if max_header_line < 64 {
            return Err(invalid("max-header-line", "must be at least 64 bytes"));
        }
        if max_head > crate::edge::framing::MAX_HEAD {
            return Err(invalid(
                "max-head",
                format!(
                    "{max_head} is over {}: the framing guard, which checks every head for \
                     smuggling, follows heads up to that size",
                    crate::edge::framing::MAX_HEAD
                ),
            ));
        }
        if max_head < max_header_line {
            return Err(invalid(
                "max-head",
                format!("{max_head} is below max-header-line {max_header_line}"),
            ));
        }
        let header_read_timeout = duration(args.header_read_timeout, Duration::from_secs(10));
        let idle_timeout = duration(args.idle_timeout, Duration::from_secs(75));
        if idle_timeout < header_read_timeout {
            return Err(invalid(
                "idle-timeout",
                format!(
                    "{idle_timeout:?} is below header-read-timeout {header_read_timeout:?}: \
                     the idle timer also runs while a head arrives"
                ),
            ));
        }
        Ok(Config {
            tls,
            access_log,
            replica,
            listen,
            upstream,
            policies: args.policies.unwrap_or_else(|| PathBuf::from("policies")),
            admin_listen,
            admin_access,
            stream_header,
            max_body,
            max_buffered_bytes,
            upstream_timeout,
            connect_timeout: duration(args.connect_timeout, Duration::from_secs(2)),
            pool: crate::upstream::pool::Limits {
                idle_timeout: duration(
                    args.pool_idle_timeout,
                    crate::upstream::pool::POOL_IDLE_TIMEOUT,
                ),
                max_idle: args
                    .pool_max_idle
                    .unwrap_or(crate::upstream::pool::POOL_MAX_IDLE),
            },
            header_read_timeout,
            idle_timeout,
            body_read_timeout: duration(args.body_read_timeout, Duration::from_secs(30)),
            controller: ControllerConfig {
                max_inflight,
                latency_target,
                tuning: &crate::pressure::Tuning::DEFAULT,
            },
            load_report,
            drain_timeout: duration(args.drain_timeout, Duration::from_secs(30)),
            shutdown_delay: args.shutdown_delay.map_or(Duration::from_secs(5), |d| d.0),
            host_header: args.host_header.unwrap_or_default(),
            upstream_header_case: args.upstream_header_case.unwrap_or_default(),
            trusted_proxies: args.trusted_proxies.unwrap_or_default(),
            max_header_line,
            max_head,
            max_devices: args
                .max_devices
                .unwrap_or(crate::devices::DEFAULT_MAX_DEVICES)
                .max(1),
            policy_recheck: duration(args.policy_recheck, crate::live::reload::RECHECK),
        })
    }
}

/// Buffered body bytes when `--max-buffered-bytes` is not given: a quarter of the container's
/// memory limit (cgroup v2 `memory.max`, bytes, or `max` for none), leaving the rest to the
/// process, its connections and the allocator's slack; 256 MiB without a limit. Never below
/// 4 MiB.
pub fn default_buffered_bytes(memory_max: Option<&str>) -> u64 {
    const UNLIMITED: u64 = 256 * 1024 * 1024;
    match memory_max
        .map(str::trim)
        .and_then(|t| t.parse::<u64>().ok())
    {
        Some(limit) => (limit / 4).max(4 * 1024 * 1024),
        None => UNLIMITED,
    }
}

fn read_file(path: &Path) -> Result<ServeArgs, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
