//! Certificates as cert-manager issues them (RSA keys in PKCS#1, `tls.crt`/`tls.key`/`ca.crt`
//! from a CA issuer, the Refract identity as a `uris:` SAN) work for both agents: the fixtures
//! were made with openssl the way cert-manager's defaults make them (see
//! `deploy/cert-manager/`), and a real mutual-TLS handshake runs between them in memory.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::path::{Path, PathBuf};

use refract_shared::tls::identity::cluster_id_from_der;
use refract_shared::tls::{client_config, server_config, TlsFiles};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cert-manager")
        .join(name)
}

fn files(role: &str) -> TlsFiles {
    TlsFiles {
        cert: fixture(&format!("{role}.crt")),
        key: fixture(&format!("{role}.key")),
        ca: fixture("ca.crt"),
    }
}

/// Moves TLS records between the two ends until neither has anything to send.
fn pump(client: &mut rustls::ClientConnection, server: &mut rustls::ServerConnection) {
    for _ in 0..20 {
        let mut moved = false;
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            moved = true;
            server.read_tls(&mut buf.as_slice()).unwrap();
            server
                .process_new_packets()
                .expect("server accepts the client");
        }
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            moved = true;
            client.read_tls(&mut buf.as_slice()).unwrap();
            client
                .process_new_packets()
                .expect("client accepts the server");
        }
        if !moved {
            return;
        }
    }
}

#[test]
fn cert_manager_style_rsa_pkcs1_secrets_load_and_shake_hands() {
    let client = files("client").load().expect("the client Secret loads");
    let server = files("server").load().expect("the server Secret loads");
    assert_eq!(client.identity.as_str(), "origin");
    assert_eq!(server.identity.as_str(), "provider");

    let mut c = rustls::ClientConnection::new(
        client_config(&client).unwrap(),
        "127.0.0.1".try_into().unwrap(),
    )
    .unwrap();
    let mut s = rustls::ServerConnection::new(server_config(&server).unwrap()).unwrap();
    pump(&mut c, &mut s);
    assert!(
        !c.is_handshaking() && !s.is_handshaking(),
        "handshake did not finish"
    );
    let seen = s
        .peer_certificates()
        .expect("the client presented its certificate");
    assert_eq!(cluster_id_from_der(&seen[0]).unwrap().as_str(), "origin");
}
