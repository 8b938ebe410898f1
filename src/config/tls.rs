//! TLS on the proxy listener (`--tls-cert`, `--tls-key`, `--tls-handshake-timeout`,
//! `--tls-max-handshakes`) and HTTP/2 over it (`--h2-max-concurrent-streams`,
//! `--h2-max-pending-resets`, `--h2-max-error-resets`), validated: both files or neither, and the pair checked now, so a
//! broken pair is a config error at start with the reason a reload would log
//! (docs/operations.md "TLS").

use super::{ConfigError, ServeArgs, invalid};
use crate::edge::tls::pair::{PairError, PairFiles};
use crate::edge::tls::{HANDSHAKE_TIMEOUT, Http2Limits, MAX_HANDSHAKES, TlsSettings, provider};

/// The TLS settings, `None` without `--tls-cert` and `--tls-key`.
///
/// # Errors
/// One file without the other, a zero timeout or cap, or a pair that fails its checks (a
/// file unreadable, no PEM certificate, no usable key, a key that is not the leaf's). The
/// leaf's dates are checked at start, against the injected clock.
pub(super) fn settings(args: &ServeArgs) -> Result<Option<TlsSettings>, ConfigError> {
    let files = match (&args.tls_cert, &args.tls_key) {
        (None, None) => {
            for (set, key) in [
                (
                    args.tls_handshake_timeout.is_some(),
                    "tls-handshake-timeout",
                ),
                (args.tls_max_handshakes.is_some(), "tls-max-handshakes"),
                (
                    args.h2_max_concurrent_streams.is_some(),
                    "h2-max-concurrent-streams",
                ),
                (
                    args.h2_max_pending_resets.is_some(),
                    "h2-max-pending-resets",
                ),
                (args.h2_max_error_resets.is_some(), "h2-max-error-resets"),
            ] {
                if set {
                    return Err(invalid(key, "needs --tls-cert and --tls-key"));
                }
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(invalid(
                "tls-key",
                "required with --tls-cert: give both or neither",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "tls-cert",
                "required with --tls-key: give both or neither",
            ));
        }
        (Some(cert), Some(key)) => PairFiles {
            cert: cert.clone(),
            key: key.clone(),
        },
    };
    // No clock here: the leaf's dates are checked when the store opens it at start
    // (`app::start`, a `StartError::Tls`, exit status 2 as a config error).
    if let Err(e) = files.load(&provider(), None) {
        let key = match e {
            PairError::Key { .. } | PairError::Mismatch { .. } => "tls-key",
            PairError::Read { ref path, .. } if *path == files.key => "tls-key",
            _ => "tls-cert",
        };
        return Err(invalid(key, e.to_string()));
    }
    let handshake_timeout = args
        .tls_handshake_timeout
        .map_or(HANDSHAKE_TIMEOUT, |d| d.0);
    if handshake_timeout.is_zero() {
        return Err(invalid("tls-handshake-timeout", "must be positive"));
    }
    let max_handshakes = args.tls_max_handshakes.unwrap_or(MAX_HANDSHAKES);
    if max_handshakes == 0 {
        return Err(invalid("tls-max-handshakes", "must be positive"));
    }
    let defaults = Http2Limits::default();
    let http2 = Http2Limits {
        max_concurrent_streams: args
            .h2_max_concurrent_streams
            .unwrap_or(defaults.max_concurrent_streams),
        max_pending_resets: args
            .h2_max_pending_resets
            .unwrap_or(defaults.max_pending_resets),
        max_error_resets: args
            .h2_max_error_resets
            .unwrap_or(defaults.max_error_resets),
    };
    for (value, key) in [
        (
            usize::try_from(http2.max_concurrent_streams).unwrap_or(usize::MAX),
            "h2-max-concurrent-streams",
        ),
        (http2.max_pending_resets, "h2-max-pending-resets"),
        (http2.max_error_resets, "h2-max-error-resets"),
    ] {
        if value == 0 {
            return Err(invalid(key, "must be positive"));
        }
    }
    Ok(Some(TlsSettings {
        files,
        handshake_timeout,
        max_handshakes,
        http2,
    }))
}
