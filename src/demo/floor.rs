//! The demo's `--max-silence`: the freshness floor set (or removed) on a copy of the policy
//! directory, so one run has the floor on and another off without editing the operator's
//! files (docs/decision.md "Devices"). The overload bench and the device tests make their
//! floor-off policies with it too.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `--max-silence`: a duration (`3s`) or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxSilence {
    /// No floor on any device stream.
    Off,
    /// This floor on every stream that may be shed.
    On(Duration),
}

/// Parses `off` or a humantime duration (`3s`, `500ms`) of at least a millisecond (the
/// policy's durations are whole milliseconds).
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_max_silence(text: &str) -> Result<MaxSilence, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(MaxSilence::Off);
    }
    match humantime::parse_duration(text) {
        Ok(d) if d >= Duration::from_millis(1) => Ok(MaxSilence::On(d)),
        _ => Err(format!(
            "expected a duration of at least 1ms such as \"3s\", or \"off\"; got {text:?}"
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

/// A copy of the policy directory `from` (the whole tree, symbolic links followed, as a
/// Kubernetes ConfigMap mount is made of them) in a fresh directory under the system's
/// temporary one, with its `streams.toml` edited: [`MaxSilence::On`] sets `max_silence` on
/// every stream that may be shed (a `supersession` other than `never`; a stream that names
/// no device is not read by the floor) and removes it from every route (a route's would win);
/// [`MaxSilence::Off`] removes every `max_silence` in the file. The copy is compiled and
/// checked to hold the floor asked for.
///
/// # Errors
/// An unreadable or unwritable file, a `streams.toml` that is not TOML, or a copy that does
/// not compile or still holds another floor (load `from` first for errors that name the
/// operator's files).
pub fn policy_copy(
    from: &Path,
    floor: MaxSilence,
) -> Result<PolicyCopy, Box<dyn std::error::Error>> {
    let copy = PolicyCopy(std::env::temp_dir().join(format!(
        "shedgate-demo-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    )));
    for entry in walkdir::WalkDir::new(from).follow_links(true) {
        let entry = entry?;
        let to = copy.path().join(entry.path().strip_prefix(from)?);
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&to)?;
        } else {
            std::fs::copy(entry.path(), &to)?;
        }
    }
    let path = copy.path().join("streams.toml");
    let mut streams: toml::Table = std::fs::read_to_string(&path)?.parse()?;
    match floor {
        MaxSilence::Off => strip(&mut streams, "max_silence"),
        MaxSilence::On(d) => {
            if let Some(toml::Value::Table(by_name)) = streams.get_mut("streams") {
                for (_, stream) in by_name.iter_mut() {
                    let Some(stream) = stream.as_table_mut() else {
                        continue;
                    };
                    if stream.get("supersession").and_then(toml::Value::as_str) == Some("never") {
                        continue;
                    }
                    stream.insert(
                        "max_silence".into(),
                        toml::Value::String(format!("{}ms", d.as_millis())),
                    );
                }
            }
            if let Some(toml::Value::Array(routes)) = streams.get_mut("routes") {
                for route in routes.iter_mut().filter_map(toml::Value::as_table_mut) {
                    strip(route, "max_silence");
                }
            }
        }
    }
    std::fs::write(&path, toml::to_string(&streams)?)?;
    let policy = crate::policy::load_dir(copy.path())?.policy;
    let want = match floor {
        MaxSilence::Off => None,
        MaxSilence::On(d) => Some(Duration::from_millis(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        )),
    };
    let other = policy.routes().iter().any(|r| r.max_silence.is_some())
        || policy
            .streams()
            .iter()
            .any(|s| s.max_silence.is_some_and(|m| Some(m) != want));
    if other {
        return Err(format!(
            "a max_silence other than {floor:?} is left in {}",
            path.display()
        )
        .into());
    }
    Ok(copy)
}

/// Removes `key` from `table` and from every table within it.
fn strip(table: &mut toml::Table, key: &str) {
    table.remove(key);
    for (_, value) in table.iter_mut() {
        match value {
            toml::Value::Table(t) => strip(t, key),
            toml::Value::Array(items) => {
                for t in items.iter_mut().filter_map(toml::Value::as_table_mut) {
                    strip(t, key);
                }
            }
            _ => {}
        }
    }
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
        assert_eq!(floor(&policy, "tile.render"), Some(Duration::from_secs(3)));
        assert_eq!(floor(&policy, "geofence.transition"), None);
        let dir = on.path().to_owned();
        drop(on);
        assert!(!dir.exists(), "the copy is removed when dropped");
        let off = policy_copy(&from, MaxSilence::Off).unwrap();
        let policy = crate::policy::load_dir(off.path()).unwrap().policy;
        assert_eq!(floor(&policy, "vehicle.position"), None);
        assert_eq!(parse_max_silence("OFF"), Ok(MaxSilence::Off));
        assert!(parse_max_silence("0s").is_err());
        assert!(parse_max_silence("500us").is_err());
        assert!(parse_max_silence("soon").is_err());
    }
}
