//! The demo's `--max-silence`: the freshness floor of its device streams set (or removed) on a
//! copy of the policy directory, so one demo run shows the floor on and another off without
//! editing the operator's files (docs/decision.md "Devices").

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `--max-silence`: a duration (`3s`) or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxSilence {
    /// No floor on any device stream.
    Off,
    /// This floor on every stream that names its device.
    On(Duration),
}

/// Parses `off` or a humantime duration (`3s`, `500ms`), positive.
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_max_silence(text: &str) -> Result<MaxSilence, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(MaxSilence::Off);
    }
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(MaxSilence::On(d)),
        _ => Err(format!(
            "expected a positive duration such as \"3s\", or \"off\"; got {text:?}"
        )),
    }
}

/// A policy directory's copy, removed when dropped.
#[derive(Debug)]
pub struct PolicyCopy(PathBuf);

impl PolicyCopy {
    /// The copy's directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PolicyCopy {
    fn drop(&mut self) {
        // Best effort: a copy left in the temporary directory is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of the policy directory `from` (its files, not its subdirectories) in a fresh
/// directory under the system's temporary one, with `max_silence` set to `floor` (or removed)
/// on every stream of `streams.toml` that names its device (a `device` key), and removed from
/// every route (a route's would win).
///
/// # Errors
/// An unreadable or unwritable file, or a `streams.toml` that is not a TOML table (the same
/// file would fail `shedgate check`).
pub fn policy_copy(
    from: &Path,
    floor: MaxSilence,
) -> Result<PolicyCopy, Box<dyn std::error::Error>> {
    let copy = PolicyCopy(std::env::temp_dir().join(format!(
        "shedgate-demo-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    )));
    let to = copy.path();
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    let path = to.join("streams.toml");
    let mut streams: toml::Table = std::fs::read_to_string(&path)?.parse()?;
    if let Some(toml::Value::Table(by_name)) = streams.get_mut("streams") {
        for (_, stream) in by_name.iter_mut() {
            let Some(stream) = stream.as_table_mut() else {
                continue;
            };
            if !stream.contains_key("device") {
                continue;
            }
            match floor {
                MaxSilence::Off => {
                    stream.remove("max_silence");
                }
                MaxSilence::On(d) => {
                    stream.insert(
                        "max_silence".into(),
                        toml::Value::String(format!("{}ms", d.as_millis())),
                    );
                }
            }
        }
    }
    if let Some(toml::Value::Array(routes)) = streams.get_mut("routes") {
        for route in routes.iter_mut().filter_map(toml::Value::as_table_mut) {
            route.remove("max_silence");
        }
    }
    std::fs::write(&path, toml::to_string(&streams)?)?;
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_set_on_device_streams_only_and_removed_for_off() {
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let on = policy_copy(&from, MaxSilence::On(Duration::from_secs(3))).unwrap();
        let policy = crate::policy::load_dir(on.path()).unwrap().policy;
        let floor = |p: &crate::policy::Policy, name: &str| {
            p.stream_policy(p.stream(name).unwrap()).max_silence
        };
        assert_eq!(
            floor(&policy, "vehicle.position"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            floor(&policy, "sensor.reading"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(floor(&policy, "tile.render"), None);
        let dir = on.path().to_owned();
        drop(on);
        assert!(!dir.exists(), "the copy is removed when dropped");
        let off = policy_copy(&from, MaxSilence::Off).unwrap();
        let policy = crate::policy::load_dir(off.path()).unwrap().policy;
        assert_eq!(floor(&policy, "vehicle.position"), None);
        assert_eq!(parse_max_silence("OFF"), Ok(MaxSilence::Off));
        assert!(parse_max_silence("0s").is_err());
        assert!(parse_max_silence("soon").is_err());
    }
}
