//! rustls configurations for both ends of the stream.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;

use super::files::TlsMaterial;

/// Why a rustls configuration could not be built from valid-looking material.
#[derive(Debug, thiserror::Error)]
#[error("failed to build TLS configuration: {0}")]
pub struct ConfigError(String);

fn err(e: impl std::fmt::Display) -> ConfigError {
    ConfigError(e.to_string())
}

/// The remote agent's server configuration: it presents `material`'s certificate and requires
/// every client to present a certificate that chains to `material`'s CA bundle.
pub fn server_config(material: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let provider = super::crypto_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(material.roots.clone()),
        provider.clone(),
    )
    .build()
    .map_err(err)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(material.chain.clone(), material.key.clone_key())
        .map_err(err)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The local agent's client configuration: it presents `material`'s certificate and accepts
/// only a server certificate that chains to `material`'s CA bundle and names the host dialled.
/// The server's cluster id is checked after the handshake by the caller.
pub fn client_config(material: &TlsMaterial) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
    let provider = super::crypto_provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_root_certificates(material.roots.clone())
        .with_client_auth_cert(material.chain.clone(), material.key.clone_key())
        .map_err(err)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
