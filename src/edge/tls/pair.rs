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

    /// Reads and checks the pair.
    ///
    /// # Errors
    /// [`PairError`], naming the file and the reason.
    pub fn load(&self, provider: &CryptoProvider) -> Result<Pair, PairError> {
        self.check(&self.read()?, provider)
    }

    fn check(&self, content: &Content, provider: &CryptoProvider) -> Result<Pair, PairError> {
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
        let not_after = not_after(leaf).map_err(cert_error)?;
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

/// The leaf's notAfter, unix seconds (RFC 5280 section 4.1.2.5).
fn not_after(leaf: &CertificateDer<'_>) -> Result<u64, String> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(leaf.as_ref())
        .map_err(|e| format!("the first certificate does not parse as X.509: {e}"))?;
    Ok(cert
        .tbs_certificate
        .validity
        .not_after
        .to_unix_duration()
        .as_secs())
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
    /// Reads and checks the pair; the store serves it.
    ///
    /// # Errors
    /// [`PairError`]: at start, a config error.
    pub fn open(
        files: PairFiles,
        provider: Arc<CryptoProvider>,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Self, PairError> {
        let content = files.read()?;
        let pair = files.check(&content, &provider)?;
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
    /// it). Blocking (file reads): call it off the async workers.
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
        if content == tried.0 {
            return match &tried.1 {
                Some(e) => Reload::Refused(e.clone()),
                None => Reload::Unchanged,
            };
        }
        let outcome = self.files.check(&content, &self.provider);
        *tried = (content, outcome.as_ref().err().cloned());
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
