//! The TLS listener's metrics: handshakes by outcome
//! ([`TLS_HANDSHAKES`](super::TLS_HANDSHAKES)), certificate reloads by outcome
//! ([`TLS_RELOADS`](super::TLS_RELOADS)) and the serving certificate's expiry
//! ([`TLS_CERTIFICATE_EXPIRY`](super::TLS_CERTIFICATE_EXPIRY)), connections by the protocol
//! ALPN chose ([`TLS_CONNECTIONS`](super::TLS_CONNECTIONS)) and HTTP/2 streams
//! ([`HTTP2_STREAMS`](super::HTTP2_STREAMS)).

use metrics::{Counter, Gauge, Label};

/// How a TLS handshake on the proxy listener ended (`edge::tls`): the `outcome` label of
/// [`TLS_HANDSHAKES`](super::TLS_HANDSHAKES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeOutcome {
    /// Completed: HTTP is served over it.
    Completed,
    /// Failed: a TLS error on either side (an alert sent or received: no common version or
    /// cipher suite, a client that does not trust the certificate, a malformed message).
    Failed,
    /// Not completed within `--tls-handshake-timeout`.
    TimedOut,
    /// The first byte was not a TLS handshake record: plain HTTP (or another protocol) sent
    /// to the TLS port; answered 400 and closed.
    WrongProtocol,
    /// Closed before completing to make room: the oldest incomplete handshake when
    /// `--tls-max-handshakes` were in progress, or an idle connection closed to free a
    /// descriptor (`edge::descriptors`).
    Displaced,
}

impl HandshakeOutcome {
    /// Every outcome, in metric-slot order.
    pub const ALL: [HandshakeOutcome; 5] = [
        HandshakeOutcome::Completed,
        HandshakeOutcome::Failed,
        HandshakeOutcome::TimedOut,
        HandshakeOutcome::WrongProtocol,
        HandshakeOutcome::Displaced,
    ];

    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeOutcome::Completed => "completed",
            HandshakeOutcome::Failed => "failed",
            HandshakeOutcome::TimedOut => "timed_out",
            HandshakeOutcome::WrongProtocol => "wrong_protocol",
            HandshakeOutcome::Displaced => "displaced",
        }
    }
}

/// What a certificate reload on new file content did: the `outcome` label of
/// [`TLS_RELOADS`](super::TLS_RELOADS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The new pair serves new handshakes.
    Swapped,
    /// The new pair was refused (unreadable, unparsable, an empty chain, a key that does not
    /// match the certificate); the previous pair keeps serving.
    Refused,
}

impl ReloadOutcome {
    /// Every outcome, in metric-slot order.
    pub const ALL: [ReloadOutcome; 2] = [ReloadOutcome::Swapped, ReloadOutcome::Refused];

    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadOutcome::Swapped => "swapped",
            ReloadOutcome::Refused => "refused",
        }
    }
}

/// The protocol a TLS connection is served with, chosen by ALPN (RFC 7301): the `protocol`
/// label of [`TLS_CONNECTIONS`](super::TLS_CONNECTIONS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlpnProtocol {
    /// `h2`: HTTP/2 (RFC 9113 section 3.2).
    Http2,
    /// `http/1.1`, or no ALPN at all (HTTP/1.x).
    Http1,
}

impl AlpnProtocol {
    /// Every protocol, in metric-slot order.
    pub const ALL: [AlpnProtocol; 2] = [AlpnProtocol::Http2, AlpnProtocol::Http1];

    /// The `protocol` label value: the ALPN identifier.
    pub fn as_str(self) -> &'static str {
        match self {
            AlpnProtocol::Http2 => "h2",
            AlpnProtocol::Http1 => "http/1.1",
        }
    }
}

/// The TLS handles, registered once with the rest ([`Metrics::new`](super::Metrics::new)).
pub struct TlsMetrics {
    handshakes: [Counter; 5],
    reloads: [Counter; 2],
    connections: [Counter; 2],
    /// [`HTTP2_STREAMS`](super::HTTP2_STREAMS): streams handed to the proxy as requests.
    pub http2_streams: Counter,
    /// [`TLS_CERTIFICATE_EXPIRY`](super::TLS_CERTIFICATE_EXPIRY): unix seconds of the
    /// serving leaf's notAfter.
    pub certificate_expiry: Gauge,
}

impl TlsMetrics {
    /// Registers the handles with `counter` (name, labels) and `gauge` (name).
    pub(super) fn register(
        counter: impl Fn(&'static str, Vec<Label>) -> Counter,
        gauge: impl Fn(&'static str) -> Gauge,
    ) -> Self {
        let labelled = |name, key, value| counter(name, vec![Label::new(key, value)]);
        TlsMetrics {
            handshakes: HandshakeOutcome::ALL
                .map(|o| labelled(super::TLS_HANDSHAKES, "outcome", o.as_str())),
            reloads: ReloadOutcome::ALL
                .map(|o| labelled(super::TLS_RELOADS, "outcome", o.as_str())),
            connections: AlpnProtocol::ALL
                .map(|p| labelled(super::TLS_CONNECTIONS, "protocol", p.as_str())),
            http2_streams: counter(super::HTTP2_STREAMS, vec![]),
            certificate_expiry: gauge(super::TLS_CERTIFICATE_EXPIRY),
        }
    }

    /// Counts a TLS connection served with `protocol`, its handshake completed.
    pub fn connection(&self, protocol: AlpnProtocol) {
        self.connections[protocol as usize].increment(1);
    }

    /// Counts a handshake that ended with `outcome`.
    pub fn handshake(&self, outcome: HandshakeOutcome) {
        self.handshakes[outcome as usize].increment(1);
    }

    /// Counts a certificate reload on new content that ended with `outcome`.
    pub fn reload(&self, outcome: ReloadOutcome) {
        self.reloads[outcome as usize].increment(1);
    }
}
