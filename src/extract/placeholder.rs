//! Device ids that name no device: the values a sender puts where it has no id to give
//! (docs/decision.md "Devices", "What is trusted").
//!
//! Android returns `unknown` for `Build.SERIAL` to apps from Android 8 on (API 26:
//! `Build.getSerial()` needs a privileged permission), so GPSLogger's `%SER` is `unknown` on
//! every such phone; JavaScript senders write `null` or `undefined` for a missing value, and
//! emulators and cheap phones report an IMEI of all zeros or a serial of `0123456789ABCDEF`.
//! Such an id is shared by devices that have nothing to do with each other: trusting it would
//! let one phone's fix supersede another's.

/// The placeholders every policy knows, lower case.
pub const PLACEHOLDERS: [&str; 6] = [
    "unknown",
    "null",
    "undefined",
    "none",
    "",
    "0123456789abcdef",
];

/// A run of one character this long or longer (`00000000`, `000000000000000`, `ffffffff`)
/// is a placeholder; a shorter one (`0`, `7`, `1111`) may be a real fleet number.
pub const REPEATED_FROM: usize = 8;

/// Whether `id` names no device: one of [`PLACEHOLDERS`] or of `extra` (a policy's
/// `device_placeholders`, written in lower case), or [`REPEATED_FROM`] or more of one
/// repeated character. Compared case-insensitively (ASCII) after trimming white space, so
/// `Unknown` and ` NULL ` are placeholders too; ids are otherwise compared exactly as written.
pub fn is_placeholder(id: &str, extra: &[Box<str>]) -> bool {
    let id = id.trim();
    let known = |p: &str| id.eq_ignore_ascii_case(p);
    if PLACEHOLDERS.iter().copied().any(known) || extra.iter().map(AsRef::as_ref).any(known) {
        return true;
    }
    let mut chars = id.chars().map(|c| c.to_ascii_lowercase());
    let first = chars.next();
    id.chars().count() >= REPEATED_FROM && chars.all(|c| Some(c) == first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_placeholder_in_any_case() {
        for p in ["unknown", "null", "undefined", "none", ""] {
            assert!(is_placeholder(p, &[]), "{p:?}");
            assert!(is_placeholder(&p.to_uppercase(), &[]), "{p:?}");
        }
        for p in [
            "Unknown",
            "NULL",
            "  none ",
            "Undefined",
            "0123456789ABCDEF",
        ] {
            assert!(is_placeholder(p, &[]), "{p:?}");
        }
        assert!(is_placeholder("0123456789abcdef", &[]));
    }

    #[test]
    fn one_repeated_character_from_eight() {
        assert!(
            !is_placeholder("0000000", &[]),
            "7 characters: a fleet number"
        );
        assert!(is_placeholder("00000000", &[]));
        assert!(is_placeholder("000000000000000", &[]), "an emulator's IMEI");
        assert!(is_placeholder("ffffffff", &[]));
        assert!(is_placeholder("FFFFffff", &[]), "case-insensitive");
        assert!(!is_placeholder("0000000000000001", &[]));
        assert!(!is_placeholder("7", &[]));
    }

    #[test]
    fn a_policy_adds_its_own() {
        let extra: Vec<Box<str>> = vec!["test-device".into(), "n/a".into()];
        assert!(is_placeholder("test-device", &extra));
        assert!(is_placeholder("Test-Device", &extra));
        assert!(is_placeholder("N/A", &extra));
        assert!(!is_placeholder("test-device-2", &extra));
        assert!(!is_placeholder("test-device", &[]));
    }

    #[test]
    fn real_ids_are_trusted() {
        for id in [
            "a1b2c3",
            "490154203237518", // an IMEI
            "9774d56d682e549c",
            "car-1",
            "unknown-7",
            "0123456789ABCDEF0",
            "nullable",
        ] {
            assert!(!is_placeholder(id, &[]), "{id:?}");
        }
    }
}
