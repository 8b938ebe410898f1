//! The certificate and key the proxy listener serves: read from PEM files, checked (a
//! certificate chain, a private key the provider can use, the key matching the leaf), and
//! swapped atomically when the files change, so that new handshakes take the new pair while
//! connections already open keep theirs (rustls `ResolvesServerCert` holding an `ArcSwap`).
//! A pair that fails a check never replaces the serving one (docs/operations.md "TLS").

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::clock::{Sources, UnixMillis};
use crate::metrics::{Metrics, TlsReloadOutcome};

/// Why a certificate pair was refused; its text names the file and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// A file could not be read.
    #[error("{}: cannot read: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// The certificate file holds no certificate, or a PEM block that does not parse.
    #[error("{}: {reason}", path.display())]
    Certificate {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key file holds no private key, one that does not parse, or one the provider
    /// cannot sign with.
    #[error("{}: {reason}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The leaf certificate is expired or not yet valid by the clock (RFC 5280 section
    /// 4.1.2.5: valid from notBefore to notAfter, both inclusive). Handshakes with it would
    /// fail at every client that checks dates.
    #[error("{}: the leaf certificate is {state}: valid from {not_before} to {not_after} (notBefore, notAfter), and it is now {now}", path.display())]
    Validity {
        /// The certificate file.
        path: PathBuf,
        /// `expired` or `not yet valid`.
        state: &'static str,
        /// notBefore, RFC 3339 UTC.
        not_before: String,
        /// notAfter, RFC 3339 UTC.
        not_after: String,
        /// The clock's time, RFC 3339 UTC.
        now: String,
    },
    /// The key is not the leaf certificate's.
    #[error("{}: the private key does not match the certificate in {}: {reason}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' words.
        reason: String,
    },
}

/// The bytes of both files as read, to tell new content from the content already tried.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Content {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// A checked pair: what rustls serves, and the leaf's notAfter (unix seconds).
#[derive(Debug, Clone)]
pub struct Pair {
    /// The chain and signing key.
    pub key: Arc<CertifiedKey>,
    /// The leaf certificate's notAfter, unix seconds.
    pub not_after: u64,
}

/// The certificate and key files (`--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairFiles {
    /// PEM certificates, the leaf first, then the intermediates.
    pub cert: PathBuf,
    /// A PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key: PathBuf,
}

impl PairFiles {
    fn read(&self) -> Result<Content, PairError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| PairError::Read {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        };
        Ok(Content {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
        })
    }

    /// Reads and checks the pair; with `now`, the leaf's dates too (without: the files'
    /// shape only, as at config time, which has no clock).
    ///
    /// # Errors
    /// [`PairError`], naming the file and the reason.
    pub fn load(
        &self,
        provider: &CryptoProvider,
        now: Option<UnixMillis>,
    ) -> Result<Pair, PairError> {
        self.check(&self.read()?, provider, now)
    }

    fn check(
        &self,
        content: &Content,
        provider: &CryptoProvider,
        now: Option<UnixMillis>,
    ) -> Result<Pair, PairError> {
        let cert_error = |reason: String| PairError::Certificate {
            path: self.cert.clone(),
            reason,
        };
        let chain = CertificateDer::pem_slice_iter(&content.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| cert_error(format!("not a PEM certificate chain: {e}")))?;
        let Some(leaf) = chain.first() else {
            return Err(cert_error(
                "holds no certificate (an empty chain: expected PEM blocks \
                 `-----BEGIN CERTIFICATE-----`, the leaf first)"
                    .into(),
            ));
        };
        let (not_before, not_after) = validity(leaf).map_err(cert_error)?;
        if let Some(now) = now {
            let state = if now.0 < secs_to_millis(not_before) {
                Some("not yet valid")
            } else if now.0 > secs_to_millis(not_after) {
                Some("expired")
            } else {
                None
            };
            if let Some(state) = state {
                return Err(PairError::Validity {
                    path: self.cert.clone(),
                    state,
                    not_before: rfc3339(not_before),
                    not_after: rfc3339(not_after),
                    now: rfc3339(u64::try_from(now.0 / 1000).unwrap_or(0)),
                });
            }
        }
        let key_error = |reason: String| PairError::Key {
            path: self.key.clone(),
            reason,
        };
        let key = PrivateKeyDer::from_pem_slice(&content.key)
            .map_err(|e| key_error(format!("no PEM private key: {e}")))?;
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| key_error(format!("unusable private key: {e}")))?;
        let key = CertifiedKey::new(chain, signing);
        match key.keys_match() {
            // ring's keys all tell their public key; a provider's key that cannot is taken as
            // rustls' own `CertifiedKey::from_der` takes it.
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(e) => {
                return Err(PairError::Mismatch {
                    cert: self.cert.clone(),
                    key: self.key.clone(),
                    reason: e.to_string(),
                });
            }
        }
        Ok(Pair {
            key: Arc::new(key),
            not_after,
        })
    }
}

/// The leaf's notBefore and notAfter, unix seconds (RFC 5280 section 4.1.2.5).
fn validity(leaf: &CertificateDer<'_>) -> Result<(u64, u64), String> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(leaf.as_ref())
        .map_err(|e| format!("the first certificate does not parse as X.509: {e}"))?;
    let validity = &cert.tbs_certificate.validity;
    Ok((
        validity.not_before.to_unix_duration().as_secs(),
        validity.not_after.to_unix_duration().as_secs(),
    ))
}

fn secs_to_millis(secs: u64) -> i64 {
    i64::try_from(secs).map_or(i64::MAX, |s| s.saturating_mul(1000))
}

/// Unix seconds as an RFC 3339 UTC date (`2026-05-28T20:26:40Z`), as X.509 dates are told.
fn rfc3339(secs: u64) -> String {
    x509_cert::der::DateTime::from_unix_duration(std::time::Duration::from_secs(secs))
        .map_or_else(|_| format!("unix {secs}"), |d| d.to_string())
}

/// The serving pair, swapped atomically, and what the last reload read (so that unchanged
/// files are not checked again, and a refused pair is refused, counted and logged once).
#[derive(Debug)]
pub struct CertificateStore {
    files: PairFiles,
    provider: Arc<CryptoProvider>,
    serving: ArcSwap<Pair>,
    /// The content last tried, and why it was refused (`None`: it serves).
    tried: Mutex<(Content, Option<PairError>)>,
    metrics: Option<Arc<Metrics>>,
    /// The wall clock the leaf's dates are checked against.
    sources: Sources,
}

/// What [`CertificateStore::reload`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The files hold the pair already tried (serving, or refused before).
    Unchanged,
    /// New content, checked and swapped in: new handshakes serve it.
    Swapped {
        /// The new leaf's notAfter, unix seconds.
        not_after: u64,
    },
    /// New content refused; the previous pair keeps serving.
    Refused(PairError),
}

impl CertificateStore {
    /// Reads and checks the pair, its leaf's dates against `sources`' clock; the store
    /// serves it.
    ///
    /// # Errors
    /// [`PairError`] (an expired or not yet valid leaf too): at start, a config error.
    pub fn open(
        files: PairFiles,
        provider: Arc<CryptoProvider>,
        metrics: Option<Arc<Metrics>>,
        sources: Sources,
    ) -> Result<Self, PairError> {
        let content = files.read()?;
        let pair = files.check(&content, &provider, Some(sources.now()))?;
        if let Some(m) = &metrics {
            #[expect(clippy::cast_precision_loss, reason = "unix seconds below 2^52")]
            m.tls.certificate_expiry.set(pair.not_after as f64);
        }
        Ok(CertificateStore {
            files,
            provider,
            serving: ArcSwap::from_pointee(pair),
            tried: Mutex::new((content, None)),
            metrics,
            sources,
        })
    }

    /// The files read.
    pub fn files(&self) -> &PairFiles {
        &self.files
    }

    /// The pair new handshakes get.
    pub fn serving(&self) -> Arc<Pair> {
        self.serving.load_full()
    }

    /// Reads the files again; when they changed since the last try, checks the new pair and
    /// swaps it in, or refuses it (logged with the file and the reason, counted), the
    /// serving pair unchanged. Files unchanged since a refusal are refused again with the
    /// same reason, neither logged nor counted again (whichever trigger came first counted
    /// it), except a leaf refused for its dates, checked again each time (a pair installed
    /// before its notBefore swaps in once the clock reaches it; refused again, it is not
    /// counted again either). Blocking (file reads): call it off the async workers.
    pub fn reload(&self) -> Reload {
        let mut tried = self
            .tried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let content = match self.files.read() {
            Ok(c) => c,
            // A file missing for a moment (a rename under way) is tried again at the next
            // event or re-check; logged, not counted: no new content was read.
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate reload: the files cannot be read; the serving pair stays");
                return Reload::Refused(e);
            }
        };
        let same = content == tried.0;
        let dated = matches!(tried.1, Some(PairError::Validity { .. }));
        if same && !dated {
            return match &tried.1 {
                Some(e) => Reload::Refused(e.clone()),
                None => Reload::Unchanged,
            };
        }
        let outcome = self
            .files
            .check(&content, &self.provider, Some(self.sources.now()));
        *tried = (content, outcome.as_ref().err().cloned());
        if same && let Err(e) = &outcome {
            return Reload::Refused(e.clone());
        }
        match outcome {
            Ok(pair) => {
                let not_after = pair.not_after;
                self.serving.store(Arc::new(pair));
                if let Some(m) = &self.metrics {
                    m.tls.reload(TlsReloadOutcome::Swapped);
                    #[expect(clippy::cast_precision_loss, reason = "unix seconds below 2^52")]
                    m.tls.certificate_expiry.set(not_after as f64);
                }
                tracing::info!(cert = %self.files.cert.display(), not_after, "TLS certificate reloaded: new handshakes use the new pair");
                Reload::Swapped { not_after }
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.tls.reload(TlsReloadOutcome::Refused);
                }
                tracing::error!(error = %e, "TLS certificate reload refused: the previous pair keeps serving");
                Reload::Refused(e)
            }
        }
    }
}

/// rustls' certificate choice: the store's serving pair, loaded once per handshake.
#[derive(Debug)]
pub struct Resolver(pub Arc<CertificateStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.serving.load().key))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;

    const DAY_MS: i64 = 86_400_000;
    const T0: UnixMillis = UnixMillis(1_780_000_000_000);

    /// A self-signed pair for `localhost`, valid from `from` to `to` (unix millis).
    fn pair_pem(from: i64, to: i64) -> (String, String) {
        let at = |ms: i64| time::OffsetDateTime::from_unix_timestamp(ms / 1000).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_before = at(from);
        params.not_after = at(to);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn write(dir: &Path, (cert, key): &(String, String)) -> PairFiles {
        let files = PairFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        files
    }

    /// A pair installed before its notBefore is refused, then swapped in at the first
    /// reload once the clock has passed it, though the files did not change.
    #[test]
    fn a_pair_refused_as_not_yet_valid_swaps_in_once_the_clock_reaches_it() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(AtomicI64::new(T0.0));
        let sources = {
            let clock = Arc::clone(&clock);
            Sources::system().with_clock(move || UnixMillis(clock.load(Ordering::Relaxed)))
        };
        let files = write(dir.path(), &pair_pem(T0.0 - DAY_MS, T0.0 + 90 * DAY_MS));
        let store = CertificateStore::open(files, crate::edge::tls::provider(), None, sources)
            .expect("valid at T0");
        write(dir.path(), &pair_pem(T0.0 + DAY_MS, T0.0 + 90 * DAY_MS));
        for _ in 0..2 {
            match store.reload() {
                Reload::Refused(PairError::Validity { state, .. }) => {
                    assert_eq!(state, "not yet valid");
                }
                other => panic!("{other:?}"),
            }
        }
        clock.store(T0.0 + 2 * DAY_MS, Ordering::Relaxed);
        assert!(matches!(store.reload(), Reload::Swapped { .. }));
        assert_eq!(store.reload(), Reload::Unchanged);
    }

    /// The refusal names the file and the dates, RFC 3339.
    #[test]
    fn an_expired_leaf_is_named_with_its_dates() {
        let dir = tempfile::tempdir().unwrap();
        let files = write(dir.path(), &pair_pem(T0.0 - 90 * DAY_MS, T0.0 - DAY_MS));
        let e = files
            .load(&crate::edge::tls::provider(), Some(T0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tls.crt")
                && e.contains("expired")
                && e.contains("2026-05-27T20:26:40Z")
                && e.contains("2026-05-28T20:26:40Z"),
            "{e}"
        );
        assert!(files.load(&crate::edge::tls::provider(), None).is_ok());
    }
}
