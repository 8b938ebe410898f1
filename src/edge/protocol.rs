//! Another protocol on the HTTP/1.1 port, refused: an HTTP/2 preface is answered with
//! `GOAWAY` `HTTP_1_1_REQUIRED`, a TLS hello closed, each logged at warn at most once a minute
//! with the likely misconfiguration (docs/responses.md "Proxying"). The framing guard tells
//! them from their first bytes (`super::framing::sniff`), and `ClientIo` counts them.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::lifecycle::ClientIo;
use crate::metrics::ProtocolMismatch;

/// The HTTP/2 answer to a preface on an HTTP/1.1 port: the server's connection preface (an
/// empty `SETTINGS` frame, RFC 9113 section 3.4), then `GOAWAY` with last stream 0 and error
/// `HTTP_1_1_REQUIRED` (0xd, section 7): an HTTP/2 client reports that error, which names the
/// misconfiguration, instead of a bare reset.
const GOAWAY_HTTP_1_1_REQUIRED: [u8; 26] = [
    0, 0, 0, 0x4, 0, 0, 0, 0, 0, // SETTINGS: length 0, type 4, no flags, stream 0
    0, 0, 8, 0x7, 0, 0, 0, 0, 0, // GOAWAY: length 8, type 7, no flags, stream 0
    0, 0, 0, 0, // last stream id 0
    0, 0, 0, 0xd, // HTTP_1_1_REQUIRED
];

/// How often each kind of wrong protocol is logged at warn, at most, per process; the counter
/// counts every one.
const MISMATCH_WARN_EVERY: Duration = Duration::from_secs(60);

/// When each [`ProtocolMismatch`] was last logged at warn, milliseconds after [`warn_base`]
/// (0: never).
static MISMATCH_WARNED: [std::sync::atomic::AtomicU64; 2] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 2];

/// The process's reference instant for [`MISMATCH_WARNED`].
fn warn_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| Instant::now() - MISMATCH_WARN_EVERY)
}

/// Closes a connection whose first bytes were another protocol (counted as they were read,
/// `ClientIo`): logged at warn (at most once per [`MISMATCH_WARN_EVERY`] per reason) with the
/// likely misconfiguration, and for an HTTP/2 preface answered [`GOAWAY_HTTP_1_1_REQUIRED`]
/// first. hyper has stopped reading by then (its error for the preface, or a 400 for a TLS
/// hello's first byte); the close lingers as after any early answer, within its bounds.
pub(super) async fn refuse_protocol(
    io: ClientIo<TokioIo<super::tls::ClientStream>>,
    wrong: ProtocolMismatch,
    peer: SocketAddr,
) {
    use tokio::io::AsyncWriteExt;
    let now_ms = |at: Instant| {
        u64::try_from(at.saturating_duration_since(warn_base()).as_millis()).unwrap_or(u64::MAX)
    };
    let now = now_ms(Instant::now());
    let every = u64::try_from(MISMATCH_WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
    let last = &MISMATCH_WARNED[wrong as usize];
    let previous = last.load(Ordering::Relaxed);
    if (previous == 0 || now >= previous + every)
        && last
            .compare_exchange(previous, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        match wrong {
            ProtocolMismatch::Http2Preface => tracing::warn!(
                %peer,
                "a client sent the HTTP/2 connection preface (h2c with prior knowledge) to this \
                 HTTP/1.1 listener: answered GOAWAY HTTP_1_1_REQUIRED and closed. Something is \
                 told this port speaks h2c or gRPC (an ingress backend protocol, a service \
                 port's appProtocol or name such as http2 or grpc): make it HTTP/1.1 \
                 (counted in shedgate_client_protocol_mismatches_total; logged at most once a \
                 minute)"
            ),
            ProtocolMismatch::TlsClientHello => tracing::warn!(
                %peer,
                "a client began a TLS handshake on this plain HTTP/1.1 listener: closed. \
                 Something is told this port speaks HTTPS (an ingress backend protocol, an \
                 https:// upstream URL in a balancer): shedgate speaks plain HTTP, so \
                 terminate TLS in front of it (counted in \
                 shedgate_client_protocol_mismatches_total; logged at most once a minute)"
            ),
        }
    }
    let mut io = TokioIo::new(io);
    if wrong == ProtocolMismatch::Http2Preface {
        let _ = io.write_all(&GOAWAY_HTTP_1_1_REQUIRED).await;
    }
    let _ = io.shutdown().await;
}
