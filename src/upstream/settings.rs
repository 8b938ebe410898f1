//! One upstream's settings as served: its `[upstreams.NAME]` table with the command line's
//! values merged in where the table leaves one out ([`Defaults`]), and checked as merged.
//! A reload compares them, upstream by upstream, to say what it must build anew
//! ([`super::LiveUpstreams`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use ipnet::IpNet;

use super::pool::Limits;
use super::{HeaderCase, HostHeader};
use crate::edge::descriptors::Descriptors;
use crate::policy::UpstreamSpec;
use crate::pressure::ControllerConfig;
use crate::pressure::report::LoadReportField;

/// An upstream's settings, merged and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Base URL, `http://host:port[/prefix]` (`url`, `--upstream`).
    pub url: Uri,
    /// Time it has to send response headers (`timeout`, `--upstream-timeout`).
    pub timeout: Duration,
    /// Time to connect to it (`connect_timeout`, `--connect-timeout`).
    pub connect_timeout: Duration,
    /// Its idle connections kept, and for how long (`pool_max_idle`, `pool_idle_timeout`,
    /// `--pool-max-idle`, `--pool-idle-timeout`).
    pub pool: Limits,
    /// Its controller's settings: latency target and in-flight cap (`latency_target`,
    /// `max_inflight`, `--latency-target`, `--max-inflight`).
    pub controller: ControllerConfig,
    /// The ORCA metric read from its answers as its utilisation (`load_report`,
    /// `--load-report`).
    pub load_report: Option<LoadReportField>,
}

impl Settings {
    /// Whether an upstream of `self` can become one of `new` keeping its controller (its
    /// pressure, what it learned, its pin) and its budgets: they differ at most in where and
    /// how it is reached (the URL, timeouts and pool limits), which a new client takes care
    /// of.
    pub fn same_controller(&self, new: &Settings) -> bool {
        self.controller == new.controller && self.load_report == new.load_report
    }
}

/// What an `[upstreams.NAME]` table leaves out: the command line's values, and the address
/// the proxy listens on (an upstream there would loop).
#[derive(Debug, Clone)]
pub struct Defaults {
    /// `--upstream`: the URL of `default`.
    pub url: Uri,
    /// `--upstream-timeout`.
    pub timeout: Duration,
    /// `--connect-timeout`.
    pub connect_timeout: Duration,
    /// `--pool-idle-timeout`, `--pool-max-idle`.
    pub pool: Limits,
    /// `--latency-target`, `--max-inflight` and the controller's tuning.
    pub controller: ControllerConfig,
    /// `--load-report`.
    pub load_report: Option<LoadReportField>,
    /// The proxy's own listening address (`--listen`, as bound).
    pub listen: SocketAddr,
}

impl Defaults {
    /// `spec`'s settings: each value the policy leaves out is the command line's.
    ///
    /// # Errors
    /// The key at fault (`url`, `latency_target`) and what is wrong with the settings
    /// merged, for the caller to place (the name is not in it): a URL that is the proxy's
    /// own listening address (requests would loop), a latency target not below the timeout.
    pub fn settings(&self, spec: &UpstreamSpec) -> Result<Settings, (&'static str, String)> {
        let url = spec.url.as_ref().unwrap_or(&self.url).clone();
        if let Some(addr) = crate::policy::loops_to(&url, self.listen) {
            return Err((
                "url",
                format!("{addr} is the proxy's own --listen address: requests would loop"),
            ));
        }
        let timeout = spec.timeout.unwrap_or(self.timeout);
        let controller = ControllerConfig {
            max_inflight: spec.max_inflight.or(self.controller.max_inflight),
            latency_target: spec
                .latency_target
                .unwrap_or(self.controller.latency_target),
            tuning: self.controller.tuning,
        };
        if controller.latency_target >= timeout {
            return Err((
                "latency_target",
                format!(
                    "latency target {:?} is not below its timeout {timeout:?}",
                    controller.latency_target
                ),
            ));
        }
        Ok(Settings {
            url,
            timeout,
            connect_timeout: spec.connect_timeout.unwrap_or(self.connect_timeout),
            pool: Limits {
                idle_timeout: spec.pool_idle_timeout.unwrap_or(self.pool.idle_timeout),
                max_idle: spec.pool_max_idle.unwrap_or(self.pool.max_idle),
            },
            controller,
            load_report: spec
                .load_report
                .clone()
                .or_else(|| self.load_report.clone()),
        })
    }
}

/// What every upstream's client shares: the process's settings of how requests are
/// forwarded, and where sockets are counted.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `--max-body`, reported in 413s.
    pub body_limit: u64,
    /// `--host-header`.
    pub host: HostHeader,
    /// `--trusted-proxy`: peers that keep their forwarding headers.
    pub trusted: Arc<[IpNet]>,
    /// `--upstream-header-case`.
    pub case: HeaderCase,
    /// The process's descriptors, where upstream sockets are counted (none in unit tests).
    pub descriptors: Option<Arc<Descriptors>>,
}

impl ClientOptions {
    /// A client for an upstream of `settings`.
    pub fn proxy(&self, settings: &Settings) -> super::Proxy {
        let proxy = super::Proxy::new(
            &settings.url,
            settings.timeout,
            settings.connect_timeout,
            self.body_limit,
            self.host,
            &self.trusted,
            self.case,
        )
        .with_pool_limits(settings.pool);
        match &self.descriptors {
            Some(d) => proxy.with_descriptors(Arc::clone(d)),
            None => proxy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            url: "http://127.0.0.1:3000".parse().unwrap(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            pool: Limits::default(),
            controller: ControllerConfig {
                max_inflight: None,
                latency_target: Duration::from_millis(100),
                tuning: &crate::pressure::Tuning::DEFAULT,
            },
            load_report: None,
            listen: "0.0.0.0:8080".parse().unwrap(),
        }
    }

    fn spec(url: &str) -> UpstreamSpec {
        UpstreamSpec {
            name: "tracking".into(),
            url: Some(url.parse().unwrap()),
            latency_target: None,
            max_inflight: None,
            timeout: None,
            connect_timeout: None,
            pool_idle_timeout: None,
            pool_max_idle: None,
            load_report: None,
        }
    }

    /// What a table leaves out is the command line's; what it gives wins.
    #[test]
    fn a_tables_values_win_over_the_flags() {
        let d = defaults();
        let s = d.settings(&spec("http://tracking:8080")).unwrap();
        assert_eq!(s.url, "http://tracking:8080");
        assert_eq!(
            (s.timeout, s.connect_timeout),
            (d.timeout, d.connect_timeout)
        );
        assert_eq!(s.controller, d.controller);
        let mut own = spec("http://tracking:8080");
        own.latency_target = Some(Duration::from_millis(40));
        own.pool_max_idle = Some(0);
        let s = d.settings(&own).unwrap();
        assert_eq!(s.controller.latency_target, Duration::from_millis(40));
        assert_eq!(
            (s.pool.max_idle, s.pool.idle_timeout),
            (0, d.pool.idle_timeout)
        );
        // A new target is a new controller; new pool limits or a new URL are not.
        let base = d.settings(&spec("http://tracking:8080")).unwrap();
        assert!(!base.same_controller(&s));
        let mut moved = spec("http://elsewhere:8080");
        moved.pool_max_idle = Some(0);
        assert!(base.same_controller(&d.settings(&moved).unwrap()));
    }

    /// The proxy's own address (its port on an unspecified `--listen`) loops; a target not
    /// below the timeout, merged, is refused: each names its key.
    #[test]
    fn a_loop_and_a_target_past_the_timeout_are_refused_with_their_key() {
        let d = defaults();
        let (key, message) = d.settings(&spec("http://127.0.0.1:8080")).unwrap_err();
        assert_eq!(key, "url");
        assert!(message.contains("own --listen address"), "{message}");
        let mut slow = spec("http://tracking:8080");
        slow.timeout = Some(Duration::from_millis(100));
        let (key, message) = d.settings(&slow).unwrap_err();
        assert_eq!(key, "latency_target");
        assert!(message.contains("not below its timeout"), "{message}");
    }
}
