//! TLS on the proxy listener (`--tls-cert`, `--tls-key`): rustls with the `ring` provider,
//! TLS 1.2 and 1.3 only, the provider's default cipher suites, ALPN `h2` then `http/1.1`
//! (HTTP/2 served by `edge::serve::h2`). The handshake
//! runs after accept and before hyper, bounded by `--tls-handshake-timeout` and by
//! `--tls-max-handshakes` in progress (the oldest incomplete one closed first), and metered
//! by outcome; a first byte that is not a TLS handshake record (plain HTTP sent to the TLS
//! port) is answered 400 and closed. The admin listener stays plain (docs/operations.md
//! "TLS").

pub mod handshakes;
pub mod pair;
pub mod watch;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use self::handshakes::{Handshakes, InProgress};
use self::pair::{CertificateStore, PairError, PairFiles, Resolver};
use crate::clock::Sources;
use crate::metrics::{CloseReason, HandshakeOutcome, Metrics};

/// Default `--tls-handshake-timeout`: as `--header-read-timeout` (10 s), since a handshake,
/// like a request head, is a few kilobytes that an honest client sends in a few round trips.
/// Peers are longer: nginx's `ssl_handshake_timeout` (stream and mail modules) is 60 s,
/// Node.js's `tls.Server` `handshakeTimeout` 120 s; a slow-handshake flood holds each socket
/// that long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--tls-max-handshakes`: incomplete handshakes at once. A handshake costs the
/// server 0.15–0.8 ms of CPU (ECDSA P-256 to RSA 2048 certificates, docs/dependencies.md
/// "rustls"); a thousand in progress are under a second of work, above what honest clients
/// reconnecting at once need.
pub const MAX_HANDSHAKES: usize = 1024;
/// The first byte of a TLS record carrying a handshake message (RFC 8446 section 5.1,
/// `ContentType.handshake`).
const HANDSHAKE_RECORD: u8 = 22;

/// Default `--h2-max-concurrent-streams`: nginx's `http2_max_concurrent_streams` (128).
/// RFC 9113 section 6.5.2 recommends no fewer than 100, so that parallelism is not
/// needlessly limited; hyper's default is 200, Envoy's 2^31 − 1.
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 128;
/// Default `--h2-max-pending-resets`: the h2 crate's default (20) for streams the client
/// resets before the server has accepted them, the rapid-reset pattern (CVE-2023-44487).
pub const H2_MAX_PENDING_RESETS: usize = 20;
/// Default `--h2-max-error-resets`: hyper's default (1024) for streams the server resets for
/// the client's errors over a connection's life (RUSTSEC-2024-0003).
pub const H2_MAX_ERROR_RESETS: usize = 1024;

/// The HTTP/2 limits of the TLS listener (validated: each at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    /// Streams a connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`); more
    /// are refused with `RST_STREAM` `REFUSED_STREAM`.
    pub max_concurrent_streams: u32,
    /// Streams the client may reset before they are accepted, at once; past it, `GOAWAY`
    /// `ENHANCE_YOUR_CALM`.
    pub max_pending_resets: usize,
    /// Streams the proxy may reset for the client's errors over a connection's life; past
    /// it, `GOAWAY` `ENHANCE_YOUR_CALM`.
    pub max_error_resets: usize,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Http2Limits {
            max_concurrent_streams: H2_MAX_CONCURRENT_STREAMS,
            max_pending_resets: H2_MAX_PENDING_RESETS,
            max_error_resets: H2_MAX_ERROR_RESETS,
        }
    }
}

/// The TLS settings of the proxy listener (validated; the pair was checked at start).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The certificate and key files.
    pub files: PairFiles,
    /// Longest handshake (`--tls-handshake-timeout`).
    pub handshake_timeout: Duration,
    /// Most handshakes in progress (`--tls-max-handshakes`).
    pub max_handshakes: usize,
    /// The limits of connections that negotiate HTTP/2 (`--h2-max-concurrent-streams`,
    /// `--h2-max-pending-resets`, `--h2-max-error-resets`).
    pub http2: Http2Limits,
}

/// rustls' provider here: `ring` (docs/dependencies.md "rustls" says why), with its default
/// suites and key-exchange groups (X25519, P-256, P-384: no post-quantum hybrid, which
/// rustls offers with aws-lc-rs only; hence the deprecation since rustls 0.23.48).
#[expect(deprecated, reason = "ring: cheap to build, no post-quantum kx")]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The proxy listener's TLS: the server configuration over the live certificate store, and
/// the handshakes' bounds and counts.
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    store: Arc<CertificateStore>,
    handshakes: Arc<Handshakes>,
    handshake_timeout: Duration,
    http2: Http2Limits,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", self.store.files())
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads and checks the pair (its leaf's dates against `sources`' clock), and builds the
    /// server configuration: TLS 1.3 and 1.2, the provider's default suites, no client
    /// certificates, ALPN `h2` then `http/1.1` (rustls picks the first of these the client
    /// offers, whatever the client's order).
    ///
    /// # Errors
    /// The pair's [`PairError`].
    pub fn new(
        settings: &TlsSettings,
        metrics: Option<Arc<Metrics>>,
        sources: Sources,
    ) -> Result<Self, PairError> {
        let provider = provider();
        let store = Arc::new(CertificateStore::open(
            settings.files.clone(),
            Arc::clone(&provider),
            metrics.clone(),
            sources,
        )?);
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| PairError::Certificate {
                path: settings.files.cert.clone(),
                reason: format!("no TLS version the provider supports: {e}"),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(Arc::clone(&store))));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // The server's suite order, not the client's (nginx `ssl_prefer_server_ciphers on`):
        // testssl.sh rates a server without one a high-severity finding, and every suite the
        // provider offers is AEAD with forward secrecy, AES-GCM first (AES-NI on servers).
        config.ignore_client_order = true;
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            store,
            handshakes: Arc::new(Handshakes::new(settings.max_handshakes)),
            handshake_timeout: settings.handshake_timeout,
            http2: settings.http2,
            metrics,
        })
    }

    /// The server configuration handshakes use (for measuring them:
    /// `examples/tls_handshake.rs`).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(self.acceptor.config())
    }

    /// The limits of connections that negotiate HTTP/2.
    pub fn http2(&self) -> &Http2Limits {
        &self.http2
    }

    /// The live certificate store (reloaded by [`watch`]).
    pub fn store(&self) -> &Arc<CertificateStore> {
        &self.store
    }

    /// The handshakes in progress.
    pub fn handshakes(&self) -> &Arc<Handshakes> {
        &self.handshakes
    }

    fn count(&self, outcome: HandshakeOutcome) {
        if let Some(m) = &self.metrics {
            m.tls.handshake(outcome);
        }
    }

    /// A handshake begins, in the accept loop so that handshakes are aged in the order of
    /// accept; past the cap, the oldest in progress is told to close.
    pub fn begin(&self) -> InProgress {
        self.handshakes.begin()
    }

    /// The handshake of a connection just accepted (its `place` from [`Tls::begin`]): the
    /// TLS stream, or `None` once it is closed (failed, timed out, plain HTTP answered 400,
    /// displaced by newer handshakes, told to close to free a descriptor: `evicted`, or the
    /// drain began: `drained`).
    pub async fn handshake(
        &self,
        place: InProgress,
        stream: TcpStream,
        peer: std::net::SocketAddr,
        evicted: impl Future<Output = ()>,
        drained: impl Future<Output = ()>,
    ) -> Option<TlsStream<TcpStream>> {
        let ended = tokio::select! {
            ended = tokio::time::timeout(self.handshake_timeout, self.accept(stream, peer)) => ended,
            () = place.displaced() => {
                self.count(HandshakeOutcome::Displaced);
                return None;
            }
            () = evicted => {
                self.count(HandshakeOutcome::Displaced);
                if let Some(m) = &self.metrics {
                    m.connection_closed(CloseReason::Descriptors);
                }
                return None;
            }
            () = drained => return None,
        };
        drop(place);
        match ended {
            Ok(Ok(tls)) => {
                self.count(HandshakeOutcome::Completed);
                Some(tls)
            }
            Ok(Err(Ended::Plain(stream))) => {
                // Counted once answered; the lingering read after is no handshake (neither
                // in progress nor under the handshake timeout).
                self.count(HandshakeOutcome::WrongProtocol);
                linger(stream).await;
                None
            }
            Ok(Err(Ended::Outcome(outcome))) => {
                if let Some(outcome) = outcome {
                    self.count(outcome);
                }
                None
            }
            Err(_) => {
                self.count(HandshakeOutcome::TimedOut);
                tracing::debug!(%peer, timeout = ?self.handshake_timeout, "TLS handshake timed out");
                None
            }
        }
    }

    /// The handshake proper, or how it ended.
    async fn accept(
        &self,
        mut stream: TcpStream,
        peer: std::net::SocketAddr,
    ) -> Result<TlsStream<TcpStream>, Ended> {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(0) | Err(_) => return Err(Ended::Outcome(None)),
            Ok(_) if first[0] != HANDSHAKE_RECORD => {
                return if refuse_plain(&mut stream, peer).await {
                    Err(Ended::Plain(stream))
                } else {
                    Err(Ended::Outcome(Some(HandshakeOutcome::WrongProtocol)))
                };
            }
            Ok(_) => {}
        }
        self.acceptor.accept(stream).await.map_err(|e| {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            Ended::Outcome(Some(HandshakeOutcome::Failed))
        })
    }
}

/// How a handshake that did not complete ended.
enum Ended {
    /// Counted as this outcome (`None`: the peer closed before sending a byte, as TCP health
    /// checks do: not a handshake, not counted).
    Outcome(Option<HandshakeOutcome>),
    /// Plain HTTP, answered 400 and shut down for writing: what the client sent is still to
    /// be read ([`linger`]).
    Plain(TcpStream),
}

/// How long [`linger`] reads what the client sent after the answer, at most.
const LINGER_TIME: Duration = Duration::from_secs(1);
/// How many bytes [`linger`] reads after the answer, at most.
const LINGER_BYTES: usize = 1024 * 1024;

/// nginx's answer to plain HTTP on its TLS port ("The plain HTTP request was sent to HTTPS
/// port", 400), as problem+json, then our FIN (`shutdown`). `false` when either write
/// failed (the connection is gone: nothing to linger on).
async fn refuse_plain(stream: &mut TcpStream, peer: std::net::SocketAddr) -> bool {
    const BODY: &str = "{\"type\":\"about:blank\",\"title\":\"Plain HTTP sent to the TLS port\",\
                        \"status\":400,\"detail\":\"this port speaks HTTPS: use an https:// URL\"}";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    tracing::debug!(%peer, "plain HTTP sent to the TLS port: answered 400");
    stream.write_all(answer.as_bytes()).await.is_ok() && stream.shutdown().await.is_ok()
}

/// After [`refuse_plain`], what the client sent (a request body, say) is read and discarded
/// until it closes, for at most [`LINGER_TIME`] and [`LINGER_BYTES`], then the socket is
/// closed: closing a socket with unread bytes makes the kernel send a reset instead of
/// waiting, which can discard the answer still in flight. This is nginx's lingering close
/// (`ngx_http_set_lingering_close` in `src/http/ngx_http_request.c`, bounded there by
/// `lingering_time` 30 s and `lingering_timeout` 5 s), shorter here: the request is refused
/// whole, and a client that keeps sending is not waited for.
async fn linger(mut stream: TcpStream) {
    let drain = async {
        // On the heap: the connection's task is sized by its largest state.
        let mut scratch = vec![0u8; 8192];
        let mut read = 0;
        while read < LINGER_BYTES {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// A client connection's stream: plain TCP, or TLS over it once the handshake completed.
/// Boxed when TLS, so that a plain connection's task does not grow by a rustls session.
#[derive(Debug)]
pub enum ClientStream {
    /// Plain HTTP.
    Plain(TcpStream),
    /// HTTPS.
    Tls(Box<TlsStream<TcpStream>>),
}

impl ClientStream {
    /// The TCP socket underneath (a parked connection waits for it to be readable, once
    /// [`ClientStream::holds_plaintext`] said no).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(s) => s.get_ref().0,
        }
    }
}

impl ClientStream {
    /// Whether the TLS session holds bytes of the client's that the socket will not tell
    /// of again: decrypted plaintext not read yet (a pipelined request that came in the
    /// same read as the last one), or received records not yet processed, or a
    /// close_notify. A connection about to park resumes instead: it would wait for the
    /// socket while its next request is already here. A session error says yes too, so
    /// that hyper reads it and the connection ends. Plain TCP: `false` (its bytes are in
    /// the socket).
    pub fn holds_plaintext(&mut self) -> bool {
        match self {
            ClientStream::Plain(_) => false,
            ClientStream::Tls(s) => {
                let session = s.get_mut().1;
                match session.process_new_packets() {
                    Ok(state) => state.plaintext_bytes_to_read() > 0 || state.peer_has_closed(),
                    Err(_) => true,
                }
            }
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
