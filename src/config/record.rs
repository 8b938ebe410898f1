//! The access log's settings (`--access-log` and the flags that go with it), validated.

use std::sync::Arc;

use super::{ConfigError, ServeArgs, invalid};
use crate::record::format::Format;
use crate::record::privacy::DeviceKey;
use crate::record::writer::DEFAULT_QUEUE;
use crate::record::{LogConfig, Sampling, Target};

/// The access log `args` configure (`None` without `--access-log`), and the replica's name.
///
/// # Errors
/// A sampling list that does not parse, a secret file that cannot be read or is under 16
/// bytes, or access-log flags without `--access-log`.
pub(super) fn access_log(args: &ServeArgs) -> Result<(Option<LogConfig>, Arc<str>), ConfigError> {
    let replica: Arc<str> = match &args.replica {
        Some(name) if name.trim().is_empty() => {
            return Err(invalid("replica", "must not be empty"));
        }
        Some(name) => name.trim().into(),
        None => default_replica().into(),
    };
    let Some(path) = &args.access_log else {
        let stray = [
            ("access-log-sample", args.access_log_sample.is_some()),
            (
                "access-log-secret-file",
                args.access_log_secret_file.is_some(),
            ),
            ("access-log-full-peer", args.access_log_full_peer.is_some()),
            ("access-log-queue", args.access_log_queue.is_some()),
        ];
        if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(invalid(key, "has no effect without --access-log"));
        }
        return Ok((None, replica));
    };
    if path.trim().is_empty() {
        return Err(invalid(
            "access-log",
            "give a file, or - for standard output",
        ));
    }
    let sampling = match &args.access_log_sample {
        None => Sampling::default(),
        Some(text) => text
            .parse()
            .map_err(|e: String| invalid("access-log-sample", e))?,
    };
    let device_key = match &args.access_log_secret_file {
        None => None,
        Some(file) => Some(
            DeviceKey::read(file).map_err(|e| invalid("access-log-secret-file", e.to_string()))?,
        ),
    };
    let target: Target = path.parse().unwrap_or(Target::Stdout);
    Ok((
        Some(LogConfig {
            target,
            sampling,
            format: Format {
                replica: Arc::clone(&replica),
                full_peer: args.access_log_full_peer.unwrap_or(false),
                device_key,
            },
            queue: match args.access_log_queue {
                Some(0) => return Err(invalid("access-log-queue", "must be at least 1")),
                Some(n) => n,
                None => DEFAULT_QUEUE,
            },
        }),
        replica,
    ))
}

/// The host name: `HOSTNAME` (a Kubernetes pod's name), else the kernel's, else `shedgate`.
fn default_replica() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "shedgate".to_owned())
}
