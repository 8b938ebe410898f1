//! What every connection's requests carry from the listener: the client's address with the
//! forwarding-header elements that name it, and the process's lame-duck flag.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderValue;
use tokio::sync::Notify;

/// The client's address, inserted into request extensions by the listener, with the two
/// forwarding-header elements that name it, made once per connection (and again when a parked
/// connection resumes) rather than formatted per request (`upstream::add_forwarding_headers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The peer's address as `X-Forwarded-For` names it: an IPv4 client on a `[::]` listener
    /// (`::ffff:a.b.c.d`) as IPv4.
    pub forwarded_for: HeaderValue,
    /// The `Forwarded` element for the peer (RFC 7239 section 4): `for=192.0.2.7;proto=http`,
    /// an IPv6 address quoted and in brackets (section 6); `proto=https` over TLS.
    pub forwarded: HeaderValue,
    /// The scheme the client used, for `X-Forwarded-Proto`: `http`, or `https` over TLS.
    pub proto: HeaderValue,
}

impl ClientInfo {
    /// The information for a connection from `peer`.
    pub fn new(peer: SocketAddr) -> Self {
        let ip = peer.ip().to_canonical();
        let node = match ip {
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("\"[{ip}]\""),
        };
        let text = |s: String| {
            HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
        };
        ClientInfo {
            peer,
            forwarded_for: text(ip.to_string()),
            forwarded: text(format!("for={node};proto=http")),
            proto: HeaderValue::from_static("http"),
        }
    }

    /// The same, for a connection over TLS when `tls` (`proto=https`, `https`).
    #[must_use]
    pub fn over_tls(mut self, tls: bool) -> Self {
        if tls {
            let http = self.forwarded.as_bytes();
            let mut https = http.to_vec();
            https.push(b's');
            if let Ok(v) = HeaderValue::from_bytes(&https) {
                self.forwarded = v;
            }
            self.proto = HeaderValue::from_static("https");
        }
        self
    }
}

/// Set once shutdown has begun: `/healthz` answers 503 (readiness fails), every HTTP/1
/// answer carries `Connection: close` and every HTTP/2 connection is sent `GOAWAY`
/// ([`LameDuck::begun`]), while new connections are still served for the shutdown delay.
/// Cheap to clone; shared by both listeners and the admin handlers.
#[derive(Debug, Clone, Default)]
pub struct LameDuck(Arc<LameDuckState>);

#[derive(Debug, Default)]
struct LameDuckState {
    set: AtomicBool,
    /// Notified once, when the phase begins.
    begun: Notify,
}

impl LameDuck {
    /// Enters the lame-duck phase; there is no way back.
    pub fn begin(&self) {
        self.0.set.store(true, Ordering::Release);
        self.0.begun.notify_waiters();
    }

    /// Whether the lame-duck phase has begun.
    pub fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    /// Resolves once the lame-duck phase has begun (at once if it has). The `Notified`
    /// future is made before the flag is read: it receives `notify_waiters` from then on,
    /// polled or not, so a phase that begins between the two is not missed.
    pub async fn begun(&self) {
        let notified = self.0.begun.notified();
        if self.is_set() {
            return;
        }
        notified.await;
    }
}
