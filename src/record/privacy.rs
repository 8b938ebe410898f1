//! What an access-log line may say about the sender: the peer truncated to its network, and
//! device ids keyed-hashed (docs/operations.md "Access log", privacy).

use std::net::IpAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The peer as a line writes it: the /24 of an IPv4 address and the /48 of an IPv6 one (as
/// Google Analytics' IP anonymisation and nginx-anonymizer truncate), in CIDR notation, unless
/// `full`. An IPv4 client on a `[::]` listener (`::ffff:a.b.c.d`) is IPv4.
pub fn peer_text(ip: IpAddr, full: bool) -> String {
    let ip = ip.to_canonical();
    if full {
        return ip.to_string();
    }
    let prefix = match ip {
        IpAddr::V4(_) => 24,
        IpAddr::V6(_) => 48,
    };
    match ipnet::IpNet::new(ip, prefix) {
        Ok(net) => net.trunc().to_string(),
        Err(_) => ip.to_string(),
    }
}

/// The key device ids are hashed with for the access log: HMAC-SHA-256 (RFC 2104) under a
/// secret the operator sets, the same on every replica, so that one device has one name in
/// every replica's log and nobody without the secret can tell which device it is.
#[derive(Clone)]
pub struct DeviceKey(Hmac<Sha256>);

impl std::fmt::Debug for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceKey(..)")
    }
}

/// Shortest secret accepted, bytes: 16 bytes is a 128-bit key, the least NIST SP 800-107
/// section 5.3.4 allows an HMAC key to bring.
pub const MIN_SECRET: usize = 16;

/// A secret too short to key the hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the access-log secret is {0} bytes; it must be at least {MIN_SECRET} (e.g. `head -c 32 /dev/urandom | base64`)"
)]
pub struct ShortSecret(pub usize);

/// A secret file that cannot key the hash.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// It cannot be read.
    #[error("{}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// What it holds is too short.
    #[error("{}: {source}", path.display())]
    Short {
        /// The file.
        path: std::path::PathBuf,
        /// How short.
        source: ShortSecret,
    },
}

/// The key a secret file's content is: its bytes with the ASCII whitespace at either end
/// removed (space, tab, LF, CR, form feed: `u8::is_ascii_whitespace`), and nothing else
/// changed. So a file saved with a final `\n` (`echo`, `base64`), `\r\n` (an editor on
/// Windows) or none keys the same hash; every other byte is the key's, as it is. The proxy
/// and `shedgate device-hash` both read the file through [`DeviceKey::read`], so this one rule
/// decides what both hash with (the shell's `"$(cat FILE)"` would keep a `\r`).
pub fn secret_bytes(content: &[u8]) -> &[u8] {
    content.trim_ascii()
}

impl DeviceKey {
    /// The key a secret file holds ([`secret_bytes`] of its content).
    ///
    /// # Errors
    /// [`SecretError`]: the file cannot be read, or its key is under [`MIN_SECRET`] bytes.
    pub fn read(path: &std::path::Path) -> Result<Self, SecretError> {
        let content = std::fs::read(path).map_err(|source| SecretError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        DeviceKey::new(&content).map_err(|source| SecretError::Short {
            path: path.to_owned(),
            source,
        })
    }

    /// A key from a secret file's content ([`secret_bytes`] of it).
    ///
    /// # Errors
    /// [`ShortSecret`] for a secret under [`MIN_SECRET`] bytes.
    pub fn new(secret: &[u8]) -> Result<Self, ShortSecret> {
        let secret = secret_bytes(secret);
        if secret.len() < MIN_SECRET {
            return Err(ShortSecret(secret.len()));
        }
        Hmac::new_from_slice(secret)
            .map(DeviceKey)
            .map_err(|_| ShortSecret(secret.len()))
    }

    /// The device `id` (as the request states it: a string's content, a number as written)
    /// hashed, byte for byte (no case folding, trimming or Unicode normalisation): the first 8
    /// bytes of HMAC-SHA-256, as 16 lowercase hex digits. About 0.5 µs, on the writer thread.
    pub fn hash(&self, id: &str) -> String {
        self.digest(id).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 8 bytes of HMAC-SHA-256 of `id`, which [`DeviceKey::hash`] writes as hex.
    pub fn digest(&self, id: &str) -> [u8; 8] {
        let mut mac = self.0.clone();
        mac.update(id.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut first = [0; 8];
        first.copy_from_slice(&digest[..8]);
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_cut_to_their_network() {
        let v4: IpAddr = "203.0.113.77".parse().unwrap();
        assert_eq!(peer_text(v4, false), "203.0.113.0/24");
        assert_eq!(peer_text(v4, true), "203.0.113.77");
        let v6: IpAddr = "2001:db8:1234:5678::9".parse().unwrap();
        assert_eq!(peer_text(v6, false), "2001:db8:1234::/48");
        let mapped: IpAddr = "::ffff:198.51.100.9".parse().unwrap();
        assert_eq!(peer_text(mapped, false), "198.51.100.0/24");
    }

    /// One rule for a secret file's bytes: a final LF, CRLF or none, and blanks around it,
    /// key the same hash; a byte inside the secret is the key's.
    #[test]
    fn a_secret_keys_the_same_whatever_its_line_ending() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let bare = DeviceKey::new(secret).unwrap().hash("1001");
        for content in [
            b"0123456789abcdef0123456789abcdef\n".as_slice(),
            b"0123456789abcdef0123456789abcdef\r\n",
            b"0123456789abcdef0123456789abcdef\r\n\r\n",
            b" \t0123456789abcdef0123456789abcdef \n",
        ] {
            assert_eq!(DeviceKey::new(content).unwrap().hash("1001"), bare);
        }
        let inner = DeviceKey::new(b"0123456789abcdef\r0123456789abcdef").unwrap();
        assert_ne!(inner.hash("1001"), bare);
        assert_eq!(
            DeviceKey::new(b"0123456789abcde\r\n").unwrap_err(),
            ShortSecret(15)
        );
    }

    #[test]
    fn device_hashes_are_keyed_and_stable() {
        let a = DeviceKey::new(b"0123456789abcdef\n").unwrap();
        let b = DeviceKey::new(b"fedcba9876543210").unwrap();
        assert_eq!(a.hash("truck-7"), a.hash("truck-7"));
        assert_ne!(a.hash("truck-7"), a.hash("truck-8"));
        assert_ne!(a.hash("truck-7"), b.hash("truck-7"));
        assert_eq!(a.hash("truck-7").len(), 16);
        assert_eq!(DeviceKey::new(b"short").unwrap_err(), ShortSecret(5));
    }
}
