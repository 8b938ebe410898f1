//! Process settings: command-line flags and an optional TOML file (flags win), parsed and then
//! validated into a [`Config`] that cannot hold bad values.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use http::Uri;
use http::header::HeaderName;
use serde::Deserialize;

use crate::pressure::ControllerConfig;

/// `shedgate serve` flags. Every flag can also be set in the `--config` file under the same
/// name (kebab-case); a flag given on the command line wins.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below.
    #[arg(long, value_name = "FILE")]
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
    /// Header carrying the stream name [default: X-Stream].
    #[arg(long, value_name = "NAME")]
    pub stream_header: Option<String>,
    /// Request body limit in bytes [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    pub max_body: Option<u64>,
    /// Time the upstream has to send response headers, e.g. `10s` [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub upstream_timeout: Option<String>,
    /// Time to connect to the upstream [default: 2s].
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<String>,
    /// Time a client has to send request headers [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub header_read_timeout: Option<String>,
    /// Time a client has to send the whole request body [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub body_read_timeout: Option<String>,
    /// In-flight requests at which the upstream is fully used (pressure 0.5) [default: 64].
    #[arg(long, value_name = "N")]
    pub max_inflight: Option<u32>,
    /// Upstream latency considered at target (pressure 0.5), e.g. `50ms` [default: 100ms].
    #[arg(long, value_name = "DURATION")]
    pub latency_target: Option<String>,
    /// Time in-flight requests get to finish on shutdown [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<String>,
    /// Safety-net re-check of the policy directory, besides the file watcher [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub policy_recheck: Option<String>,
    /// `Host` sent upstream: `client` (the client's, unchanged) or `upstream` (the upstream
    /// URL's authority) [default: client].
    #[arg(long, value_name = "client|upstream")]
    pub host_header: Option<String>,
}

/// The `--config` file: the same keys as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    listen: Option<SocketAddr>,
    upstream: Option<String>,
    policies: Option<PathBuf>,
    admin_listen: Option<SocketAddr>,
    stream_header: Option<String>,
    max_body: Option<u64>,
    upstream_timeout: Option<String>,
    connect_timeout: Option<String>,
    header_read_timeout: Option<String>,
    body_read_timeout: Option<String>,
    max_inflight: Option<u32>,
    latency_target: Option<String>,
    drain_timeout: Option<String>,
    policy_recheck: Option<String>,
    host_header: Option<String>,
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
    /// Stream header.
    pub stream_header: HeaderName,
    /// Body limit, bytes (positive).
    pub max_body: u64,
    /// Upstream response-header timeout (positive).
    pub upstream_timeout: Duration,
    /// Upstream connect timeout (positive).
    pub connect_timeout: Duration,
    /// Client header read timeout (positive).
    pub header_read_timeout: Duration,
    /// Client body read timeout (positive).
    pub body_read_timeout: Duration,
    /// Pressure controller settings.
    pub controller: ControllerConfig,
    /// Shutdown drain time.
    pub drain_timeout: Duration,
    /// Periodic policy re-check interval.
    pub policy_recheck: Duration,
    /// How `Host` is forwarded.
    pub host_header: crate::upstream::HostHeader,
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

fn duration(
    key: &'static str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let Some(text) = value else {
        return Ok(default);
    };
    match humantime::parse_duration(&text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(invalid(key, "must be positive")),
        Err(e) => Err(invalid(
            key,
            format!("invalid duration {text:?}: {e} (write e.g. 50ms, 10s)"),
        )),
    }
}

impl Config {
    /// Merges flags over the `--config` file over defaults, and validates.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable file, an unknown key, a missing upstream, a bad
    /// value, or contradictory settings (the same address for both listeners; an upstream
    /// that is the proxy's own listener).
    pub fn from_args(args: ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let listen = args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let admin_listen = args
            .admin_listen
            .or(file.admin_listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9901)));
        if listen == admin_listen && listen.port() != 0 {
            return Err(invalid(
                "admin-listen",
                format!("{admin_listen} is also the proxy's --listen address"),
            ));
        }
        let upstream_text = args.upstream.or(file.upstream).ok_or_else(|| {
            invalid(
                "upstream",
                "required: the URL of the ingestion endpoint, e.g. http://127.0.0.1:3000",
            )
        })?;
        let upstream: Uri = upstream_text
            .parse()
            .map_err(|e| invalid("upstream", format!("invalid URL {upstream_text:?}: {e}")))?;
        match upstream.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(invalid(
                    "upstream",
                    format!(
                        "scheme {other:?} is not supported; use http:// (terminate TLS in front)"
                    ),
                ));
            }
            None => {
                return Err(invalid(
                    "upstream",
                    format!("{upstream_text:?} needs http://"),
                ));
            }
        }
        let Some(authority) = upstream.authority() else {
            return Err(invalid(
                "upstream",
                format!("{upstream_text:?} has no host"),
            ));
        };
        if upstream.query().is_some() {
            return Err(invalid("upstream", "must not have a query string"));
        }
        if let Ok(addr) = authority.as_str().parse::<SocketAddr>()
            && listen.port() != 0
            && (addr == listen || (addr.port() == listen.port() && listen.ip().is_unspecified()))
        {
            return Err(invalid(
                "upstream",
                format!("{addr} is the proxy's own --listen address: requests would loop"),
            ));
        }
        let stream_header_text = args
            .stream_header
            .or(file.stream_header)
            .unwrap_or_else(|| "X-Stream".to_owned());
        let stream_header = HeaderName::try_from(stream_header_text.as_str()).map_err(|_| {
            invalid(
                "stream-header",
                format!("{stream_header_text:?} is not a header name"),
            )
        })?;
        let max_body = args.max_body.or(file.max_body).unwrap_or(1024 * 1024);
        if max_body == 0 {
            return Err(invalid("max-body", "must be positive"));
        }
        let max_inflight = NonZeroU32::new(args.max_inflight.or(file.max_inflight).unwrap_or(64))
            .ok_or_else(|| invalid("max-inflight", "must be positive"))?;
        let upstream_timeout = duration(
            "upstream-timeout",
            args.upstream_timeout.or(file.upstream_timeout),
            Duration::from_secs(10),
        )?;
        let latency_target = duration(
            "latency-target",
            args.latency_target.or(file.latency_target),
            Duration::from_millis(100),
        )?;
        if latency_target >= upstream_timeout {
            return Err(invalid(
                "latency-target",
                format!(
                    "{latency_target:?} is not below upstream-timeout {upstream_timeout:?}: \
                     requests would time out before pressure rises"
                ),
            ));
        }
        Ok(Config {
            listen,
            upstream,
            policies: args
                .policies
                .or(file.policies)
                .unwrap_or_else(|| PathBuf::from("policies")),
            admin_listen,
            stream_header,
            max_body,
            upstream_timeout,
            connect_timeout: duration(
                "connect-timeout",
                args.connect_timeout.or(file.connect_timeout),
                Duration::from_secs(2),
            )?,
            header_read_timeout: duration(
                "header-read-timeout",
                args.header_read_timeout.or(file.header_read_timeout),
                Duration::from_secs(10),
            )?,
            body_read_timeout: duration(
                "body-read-timeout",
                args.body_read_timeout.or(file.body_read_timeout),
                Duration::from_secs(30),
            )?,
            controller: ControllerConfig {
                max_inflight,
                latency_target,
            },
            drain_timeout: duration(
                "drain-timeout",
                args.drain_timeout.or(file.drain_timeout),
                Duration::from_secs(30),
            )?,
            host_header: match args.host_header.or(file.host_header).as_deref() {
                None | Some("client") => crate::upstream::HostHeader::Client,
                Some("upstream") => crate::upstream::HostHeader::Upstream,
                Some(other) => {
                    return Err(invalid(
                        "host-header",
                        format!("{other:?}: expected \"client\" or \"upstream\""),
                    ));
                }
            },
            policy_recheck: duration(
                "policy-recheck",
                args.policy_recheck.or(file.policy_recheck),
                crate::live::reload::RECHECK,
            )?,
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
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
mod tests {
    use super::*;

    fn args(upstream: &str) -> ServeArgs {
        ServeArgs {
            upstream: Some(upstream.into()),
            ..ServeArgs::default()
        }
    }

    #[test]
    fn defaults() {
        let c = Config::from_args(args("http://127.0.0.1:3000")).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.admin_listen, "127.0.0.1:9901".parse().unwrap());
        assert_eq!(c.max_body, 1024 * 1024);
        assert_eq!(c.stream_header, "x-stream");
    }

    #[test]
    fn missing_and_contradictory_settings() {
        assert!(Config::from_args(ServeArgs::default()).is_err());
        assert!(Config::from_args(args("https://x")).is_err());
        assert!(Config::from_args(args("http://127.0.0.1:8080")).is_err());
        let mut a = args("http://127.0.0.1:3000");
        a.admin_listen = Some("127.0.0.1:8080".parse().unwrap());
        assert!(Config::from_args(a).is_err());
        let mut a = args("http://127.0.0.1:3000");
        a.latency_target = Some("20s".into());
        assert!(Config::from_args(a).is_err());
        let mut a = args("http://127.0.0.1:3000");
        a.max_inflight = Some(0);
        assert!(Config::from_args(a).is_err());
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shedgate.toml");
        std::fs::write(
            &path,
            "upstream = \"http://127.0.0.1:3000\"\nmax-inflight = 8\nlatency-target = \"25ms\"\n",
        )
        .unwrap();
        let mut a = ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        };
        a.max_inflight = Some(16);
        let c = Config::from_args(a).unwrap();
        assert_eq!(c.controller.max_inflight.get(), 16);
        assert_eq!(c.controller.latency_target, Duration::from_millis(25));
        std::fs::write(&path, "upstreem = \"x\"\n").unwrap();
        let e = Config::from_args(ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("upstreem"), "{e}");
    }
}
