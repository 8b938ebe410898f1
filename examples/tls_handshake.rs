//! What a TLS handshake costs the proxy: `N` full handshakes (no session resumption) between a rustls client and
//! shedgate's own server configuration (`shedgate::edge::tls`, the `ring` provider, the pair
//! loaded as `--tls-cert`/`--tls-key` load it), in memory on one thread, with the CPU time
//! of the server's side alone read from the thread's scheduler statistics
//! (`/proc/thread-self/schedstat`: not wall time, so other work on the machine does not
//! count). No sockets: the figure is the cryptography and the protocol, not the kernel.
//!
//! Run: `cargo run --example tls_handshake -- [N] [CERT KEY]` (dependencies are optimised in
//! the dev profile, so ring and rustls run as in a release build). Without `CERT KEY`, an
//! ECDSA P-256 leaf is made with rcgen; pass an RSA 2048 pair (cert-manager's default key)
//! made with `openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost
//! -addext subjectAltName=DNS:localhost -keyout key.pem -out cert.pem` for the other figure.
//! docs/dependencies.md "rustls" has the figures.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::{ClientConnection, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use shedgate::edge::tls::pair::PairFiles;

/// This thread's CPU time so far, nanoseconds.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Moves what `from` has to send into `to`.
fn pass(from: &mut dyn FnMut(&mut Vec<u8>), to: &mut dyn FnMut(&[u8])) -> bool {
    let mut buf = Vec::new();
    from(&mut buf);
    if buf.is_empty() {
        return false;
    }
    to(&buf);
    true
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = if let [_, cert, key] = &args[..] {
        (PathBuf::from(cert), PathBuf::from(key))
    } else {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let c = params.self_signed(&key).unwrap();
        let (cert, keyfile) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, c.pem()).unwrap();
        std::fs::write(&keyfile, key.serialize_pem()).unwrap();
        (cert, keyfile)
    };
    let settings = shedgate::edge::tls::TlsSettings {
        files: PairFiles {
            cert: cert.clone(),
            key,
        },
        handshake_timeout: shedgate::edge::tls::HANDSHAKE_TIMEOUT,
        max_handshakes: 1,
        http2: shedgate::edge::tls::Http2Limits::default(),
    };
    let server = shedgate::edge::tls::Tls::new(&settings, None, shedgate::clock::Sources::system())
        .expect("a valid pair");
    let server_config = server.server_config();
    let leaf = CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    use rustls::crypto::ring::kx_group::{SECP256R1, SECP384R1, X25519};
    // The client's key exchange: X25519 first, as curl (OpenSSL), browsers and Go offer it;
    // the server follows the client's order. P-384 (rustls' ring provider lists it first,
    // so a rustls client with that provider offers it) is measured apart: ring's P-384 is
    // its slow generic arithmetic.
    for (label, version, group) in [
        ("TLS 1.3 X25519", &rustls::version::TLS13, X25519),
        ("TLS 1.2 X25519", &rustls::version::TLS12, X25519),
        ("TLS 1.3 P-256", &rustls::version::TLS13, SECP256R1),
        ("TLS 1.3 P-384", &rustls::version::TLS13, SECP384R1),
    ] {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(leaf.clone()).unwrap();
        let mut client_config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::CryptoProvider {
                kx_groups: vec![group],
                ..(*shedgate::edge::tls::provider()).clone()
            }))
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        // Full handshakes only: a resumed session skips the signature, the costly part.
        client_config.resumption = rustls::client::Resumption::disabled();
        let client_config = Arc::new(client_config);
        let mut server_ns = 0u64;
        let started = thread_cpu_ns();

        for _ in 0..n {
            let name = ServerName::try_from("localhost").unwrap();
            let mut client = ClientConnection::new(Arc::clone(&client_config), name).unwrap();
            let t = thread_cpu_ns();
            let mut server = ServerConnection::new(Arc::clone(&server_config)).unwrap();
            server_ns += thread_cpu_ns() - t;
            while client.is_handshaking() || server.is_handshaking() {
                let mut moved = pass(
                    &mut |buf| {
                        while client.wants_write() {
                            client.write_tls(buf).unwrap();
                        }
                    },
                    &mut |bytes| {
                        let t = thread_cpu_ns();
                        server.read_tls(&mut Cursor::new(bytes)).unwrap();
                        server.process_new_packets().unwrap();
                        server_ns += thread_cpu_ns() - t;
                    },
                );
                moved |= pass(
                    &mut |buf| {
                        let t = thread_cpu_ns();
                        while server.wants_write() {
                            server.write_tls(buf).unwrap();
                        }
                        server_ns += thread_cpu_ns() - t;
                    },
                    &mut |bytes| {
                        client.read_tls(&mut Cursor::new(bytes)).unwrap();
                        client.process_new_packets().unwrap();
                    },
                );
                assert!(moved, "the handshake stalled");
            }
        }
        let total_ns = thread_cpu_ns() - started;

        let per =
            |ns: u64| f64::from(u32::try_from(ns / u64::from(n)).unwrap_or(u32::MAX)) / 1000.0;
        println!(
            "{label}: {n} handshakes, server side {:.0} µs CPU each, both sides {:.0} µs",
            per(server_ns),
            per(total_ns),
        );
    }
}
