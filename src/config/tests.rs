//! Unit tests of settings: defaults, files, contradictions, durations.

use super::*;

fn args(upstream: &str) -> ServeArgs {
    ServeArgs {
        upstream: Some(upstream.into()),
        ..ServeArgs::default()
    }
}

/// `flags` with a `--config` file holding `text`.
fn with_file(text: &str, flags: ServeArgs) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shedgate.toml");
    std::fs::write(&path, text).unwrap();
    Config::from_args(ServeArgs {
        config: Some(path),
        ..flags
    })
}

#[test]
fn buffered_bytes_follow_the_cgroup_limit() {
    let mib = 1024 * 1024;
    assert_eq!(default_buffered_bytes(Some("268435456\n")), 64 * mib);
    assert_eq!(default_buffered_bytes(Some("max\n")), 256 * mib);
    assert_eq!(default_buffered_bytes(None), 256 * mib);
    assert_eq!(default_buffered_bytes(Some("8388608")), 4 * mib);
    let mut a = args("http://127.0.0.1:3000");
    a.max_buffered_bytes = Some(1000);
    let e = Config::from_args(a).unwrap_err().to_string();
    assert!(e.contains("max-buffered-bytes"), "{e}");
}

#[test]
fn connection_lifecycle_settings() {
    let c = Config::from_args(args("http://127.0.0.1:3000")).unwrap();
    assert_eq!(c.idle_timeout, Duration::from_secs(75));
    assert_eq!(c.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.shutdown_delay, Duration::from_secs(5));
    let c = with_file(
        "shutdown-delay = \"0\"\nidle-timeout = \"2m\"\n",
        args("http://127.0.0.1:3000"),
    )
    .unwrap();
    assert_eq!(c.shutdown_delay, Duration::ZERO);
    assert_eq!(c.idle_timeout, Duration::from_secs(120));
    let mut a = args("http://127.0.0.1:3000");
    a.idle_timeout = Some(Duration::from_secs(5).into());
    let e = Config::from_args(a).unwrap_err().to_string();
    assert!(
        e.contains("idle-timeout") && e.contains("header-read-timeout"),
        "{e}"
    );
    assert!("x".parse::<HumanDelay>().is_err());
}

#[test]
fn defaults() {
    let c = Config::from_args(args("http://127.0.0.1:3000")).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.admin_listen, "127.0.0.1:9901".parse().unwrap());
    assert_eq!(c.max_body, 1024 * 1024);
    assert_eq!(c.stream_header, "x-stream");
    // The pool as it was before its limits were settings: 4 s idle, and a cap (1024) no
    // traffic short of a thousand-request burst reaches.
    assert_eq!(
        (c.pool.idle_timeout, c.pool.max_idle),
        (Duration::from_secs(4), 1024)
    );
}

/// `--upstream` is checked by the rule `url` in `[upstreams.NAME]` is
/// (`crate::policy::parse_url`): a port without a host is refused, naming the flag.
#[test]
fn an_upstream_without_a_host_is_refused() {
    let e = Config::from_args(args("http://:3000"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("setting `upstream`") && e.contains("has no host"),
        "{e}"
    );
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
    a.latency_target = Some(Duration::from_secs(20).into());
    assert!(Config::from_args(a).is_err());
    let mut a = args("http://127.0.0.1:3000");
    a.max_inflight = Some(0);
    assert!(Config::from_args(a).is_err());
    // Head limits: the head may not exceed what the smuggling guard follows, nor be below
    // one line.
    for (line, head) in [(8192, 128 * 1024), (8192, 4096), (16, 32768)] {
        let mut a = args("http://127.0.0.1:3000");
        a.max_header_line = Some(line);
        a.max_head = Some(head);
        assert!(Config::from_args(a).is_err(), "{line} {head}");
    }
    let c = Config::from_args(args("http://127.0.0.1:3000")).unwrap();
    assert_eq!((c.max_header_line, c.max_head), (8192, 32768));
    assert!(c.trusted_proxies.is_empty());
}

/// `--load-report` names an ORCA utilisation; anything else is refused with the three
/// forms it takes, and none is read by default.
#[test]
fn load_report_names_an_orca_utilisation() {
    let c = Config::from_args(args("http://127.0.0.1:3000")).unwrap();
    assert_eq!(c.load_report, None);
    let mut a = args("http://127.0.0.1:3000");
    a.load_report = Some("named_metrics.queue".into());
    let c = Config::from_args(a).unwrap();
    assert_eq!(
        c.load_report,
        Some(crate::upstream::load_report::LoadReportField::Named(
            "queue".into()
        ))
    );
    let mut a = args("http://127.0.0.1:3000");
    a.load_report = Some("queue_depth".into());
    let err = Config::from_args(a).unwrap_err().to_string();
    assert!(
        err.contains("load-report") && err.contains("application_utilization"),
        "{err}"
    );
}

#[test]
fn file_then_flags() {
    let flags = ServeArgs {
        max_inflight: Some(16),
        ..ServeArgs::default()
    };
    let c = with_file(
        "upstream = \"http://127.0.0.1:3000\"\nmax-inflight = 8\nlatency-target = \"25ms\"\n",
        flags,
    )
    .unwrap();
    assert_eq!(
        c.controller.max_inflight.map(std::num::NonZeroU32::get),
        Some(16)
    );
    assert_eq!(c.controller.latency_target, Duration::from_millis(25));
    let e = with_file("upstreem = \"x\"\n", ServeArgs::default()).unwrap_err();
    assert!(e.to_string().contains("upstreem"), "{e}");
}

/// Every setting is a file key: a file giving all of them configures all of them.
#[test]
fn every_flag_is_a_file_key() {
    let c = with_file(
        r#"
listen = "127.0.0.1:18080"
upstream = "http://127.0.0.1:3000"
policies = "elsewhere"
admin-listen = "127.0.0.1:19901"
stream-header = "X-Topic"
max-body = 4096
upstream-timeout = "3s"
connect-timeout = "1s"
pool-idle-timeout = "2s"
pool-max-idle = 8
header-read-timeout = "4s"
body-read-timeout = "5s"
max-inflight = 12
latency-target = "40ms"
drain-timeout = "6s"
policy-recheck = "7s"
host-header = "upstream"
"#,
        ServeArgs::default(),
    )
    .unwrap();
    assert_eq!(c.listen, "127.0.0.1:18080".parse().unwrap());
    assert_eq!(c.admin_listen, "127.0.0.1:19901".parse().unwrap());
    assert_eq!(c.policies, PathBuf::from("elsewhere"));
    assert_eq!(c.stream_header, "x-topic");
    assert_eq!(c.max_body, 4096);
    assert_eq!(c.upstream_timeout, Duration::from_secs(3));
    assert_eq!(c.connect_timeout, Duration::from_secs(1));
    assert_eq!(
        (c.pool.idle_timeout, c.pool.max_idle),
        (Duration::from_secs(2), 8)
    );
    assert_eq!(c.header_read_timeout, Duration::from_secs(4));
    assert_eq!(c.body_read_timeout, Duration::from_secs(5));
    assert_eq!(
        c.controller.max_inflight.map(std::num::NonZeroU32::get),
        Some(12)
    );
    assert_eq!(c.controller.latency_target, Duration::from_millis(40));
    assert_eq!(c.drain_timeout, Duration::from_secs(6));
    assert_eq!(c.policy_recheck, Duration::from_secs(7));
    assert_eq!(c.host_header, HostHeader::Upstream);
}

/// Durations and enums are parsed where they enter, with what was wrong.
#[test]
fn bad_durations_and_enums_are_refused_at_the_edge() {
    assert!(
        "0s".parse::<HumanDuration>()
            .unwrap_err()
            .contains("positive")
    );
    assert!(
        "soon"
            .parse::<HumanDuration>()
            .unwrap_err()
            .contains("soon")
    );
    for (text, says) in [
        ("latency-target = \"fast\"\n", "fast"),
        ("host-header = \"proxy\"\n", "proxy"),
    ] {
        let e = with_file(text, ServeArgs::default()).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
}

/// The HTTP/2 limits: defaults, a `--config` key, zero refused, and each needs TLS.
#[test]
fn http2_limits_need_tls_and_are_positive() {
    let mut a = args("http://127.0.0.1:3000");
    a.h2_max_concurrent_streams = Some(64);
    let e = Config::from_args(a).unwrap_err().to_string();
    assert!(
        e.contains("h2-max-concurrent-streams") && e.contains("--tls-cert"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let tls = || ServeArgs {
        tls_cert: Some(cert_path.clone()),
        tls_key: Some(key_path.clone()),
        ..args("http://127.0.0.1:3000")
    };
    let c = Config::from_args(tls()).unwrap();
    assert_eq!(
        c.tls.unwrap().http2,
        crate::edge::tls::Http2Limits {
            max_concurrent_streams: 128,
            max_pending_resets: 20,
            max_error_resets: 1024,
        }
    );
    let c = with_file("h2-max-concurrent-streams = 64\n", tls()).unwrap();
    assert_eq!(c.tls.unwrap().http2.max_concurrent_streams, 64);
    let mut zero = tls();
    zero.h2_max_pending_resets = Some(0);
    let e = Config::from_args(zero).unwrap_err().to_string();
    assert!(e.contains("h2-max-pending-resets"), "{e}");
}
