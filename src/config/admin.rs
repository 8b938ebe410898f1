//! The admin listener's access settings (`--admin-allow-host`, `--admin-token-file`),
//! validated (docs/operations.md "The admin listener's rules").

use super::{ConfigError, ServeArgs, invalid};
use crate::admin::guard::{AdminAccess, read_token};

/// The names the admin listener answers besides IP literals and `localhost`, and its token.
///
/// # Errors
/// An entry that is not a host name (a port, a scheme, an IP address), or a token file that
/// cannot be read or holds no usable token; each names its flag.
pub(super) fn access(args: &ServeArgs) -> Result<AdminAccess, ConfigError> {
    let hosts = args
        .admin_allow_host
        .iter()
        .flatten()
        .map(|entry| AdminAccess::allowed_name(entry).map_err(|e| invalid("admin-allow-host", e)))
        .collect::<Result<Vec<_>, _>>()?;
    let token = args
        .admin_token_file
        .as_deref()
        .map(read_token)
        .transpose()
        .map_err(|e| invalid("admin-token-file", e))?;
    Ok(AdminAccess::new(hosts, token.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::super::{Config, ServeArgs};

    fn args() -> ServeArgs {
        ServeArgs {
            upstream: Some("http://127.0.0.1:3000".into()),
            ..ServeArgs::default()
        }
    }

    /// The flags, and the `--config` file's keys of the same names; each bad value names its
    /// setting.
    #[test]
    fn allow_host_and_token_file_from_flags_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\r\n").unwrap();
        let config = dir.path().join("shedgate.toml");
        std::fs::write(
            &config,
            format!(
                "admin-allow-host = [\"Admin.ops.svc\", \"b.example\"]\nadmin-token-file = {:?}\n",
                token.display().to_string()
            ),
        )
        .unwrap();
        let c = Config::from_args(ServeArgs {
            config: Some(config),
            ..args()
        })
        .unwrap();
        assert!(c.admin_access.has_token());
        let shown = format!("{:?}", c.admin_access);
        assert!(
            shown.contains("\"admin.ops.svc\", \"b.example\""),
            "{shown}"
        );
        assert!(!Config::from_args(args()).unwrap().admin_access.has_token());

        let bad = |a: ServeArgs, key: &str, says: &str| {
            let e = Config::from_args(a).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{e}");
        };
        for entry in [
            "admin.example:9901",
            "http://admin.example",
            "10.0.0.1",
            "a b",
        ] {
            let mut a = args();
            a.admin_allow_host = Some(vec!["ok.example".into(), entry.into()]);
            bad(a, "admin-allow-host", entry);
        }
        let mut a = args();
        a.admin_token_file = Some(dir.path().join("missing"));
        bad(a, "admin-token-file", "missing");
        std::fs::write(&token, "short\n").unwrap();
        let mut a = args();
        a.admin_token_file = Some(token);
        bad(a, "admin-token-file", "at least 32");
    }
}
