//! Mutual TLS for the reflection stream.
//!
//! Both agents are configured with three PEM files (their certificate chain, its key, and the
//! CA bundle they trust for the peer). [`reload::Watched`] re-reads those files when they
//! change, validates them, and only then publishes a new rustls configuration; a broken file on
//! disk never replaces a working configuration. New connections pick up the new configuration;
//! existing ones keep theirs until they close (the server caps connection age for that).
//!
//! Identity is the cluster id in the certificate's SAN URI `spiffe://refract/cluster/<id>`
//! ([`identity`]); the remote agent takes the tenant from the verified client certificate only.

pub mod config;
pub mod files;
pub mod identity;
pub mod reload;
pub mod serving;

pub use config::{client_config, server_config};
pub use files::{TlsFiles, TlsMaterial};
pub use identity::{ClusterId, IdentityError};
pub use reload::Watched;

/// The crypto provider Refract uses everywhere (ring: no C toolchain beyond `cc`).
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs [`crypto_provider`] as the process default, for libraries (kube's HTTP client)
/// that build rustls configurations without naming a provider. Safe to call more than once.
pub fn install_default_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
