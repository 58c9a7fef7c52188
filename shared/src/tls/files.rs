//! Loading and validating the PEM files an agent is configured with.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::identity::{self, ClusterId, IdentityError};

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file holds no usable PEM block of the expected kind.
    #[error("failed to parse {path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The certificate carries no usable Refract identity.
    #[error("certificate {path} is not a Refract identity: {source}")]
    Identity {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: IdentityError,
    },
    /// The private key does not belong to the certificate.
    #[error("private key {key} does not match certificate {cert}")]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
}

/// Where an agent's certificate, key and trusted CA bundle live.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM bundle of CA certificates trusted for the peer.
    pub ca: PathBuf,
}

/// The parsed and validated contents of [`TlsFiles`].
#[derive(Debug)]
pub struct TlsMaterial {
    /// Certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
    /// Trusted peer CAs.
    pub roots: rustls::RootCertStore,
    /// The identity in the leaf certificate.
    pub identity: ClusterId,
    /// The leaf's expiry.
    pub not_after: time::OffsetDateTime,
}

impl TlsFiles {
    /// Reads the three files as raw bytes, to notice changes cheaply.
    pub fn read_raw(&self) -> Result<[Vec<u8>; 3], LoadError> {
        Ok([read(&self.cert)?, read(&self.key)?, read(&self.ca)?])
    }

    /// Reads, parses and validates the three files.
    pub fn load(&self) -> Result<TlsMaterial, LoadError> {
        let [cert, key, ca] = self.read_raw()?;
        self.parse(&cert, &key, &ca)
    }

    /// Parses and validates already-read contents of the three files.
    pub fn parse(&self, cert: &[u8], key: &[u8], ca: &[u8]) -> Result<TlsMaterial, LoadError> {
        let pem_err = |path: &Path, reason: String| LoadError::Pem {
            path: path.to_path_buf(),
            reason,
        };
        let chain: Vec<_> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| pem_err(&self.cert, e.to_string()))?;
        let leaf = chain
            .first()
            .ok_or_else(|| pem_err(&self.cert, "no CERTIFICATE block".into()))?;
        let summary = identity::summarize(leaf).map_err(|source| LoadError::Identity {
            path: self.cert.clone(),
            source,
        })?;
        let identity = summary.cluster_id.map_err(|source| LoadError::Identity {
            path: self.cert.clone(),
            source,
        })?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| pem_err(&self.key, format!("no private key: {e}")))?;
        let provider = super::crypto_provider();
        let signing_key = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| pem_err(&self.key, e.to_string()))?;
        let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing_key);
        if certified.keys_match().is_err() {
            return Err(LoadError::KeyMismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
            });
        }
        let mut roots = rustls::RootCertStore::empty();
        for ca_cert in CertificateDer::pem_slice_iter(ca) {
            let ca_cert = ca_cert.map_err(|e| pem_err(&self.ca, e.to_string()))?;
            roots
                .add(ca_cert)
                .map_err(|e| pem_err(&self.ca, e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(pem_err(&self.ca, "no CA CERTIFICATE block".into()));
        }
        Ok(TlsMaterial {
            chain,
            key,
            roots,
            identity,
            not_after: summary.not_after,
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}
