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
    /// The files as `refract-certs` and a Kubernetes TLS Secret lay them out in `dir`:
    /// `tls.crt`, `tls.key` and `ca.crt`.
    pub fn in_folder(dir: &std::path::Path) -> Self {
        Self {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        }
    }

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
        let chain = parse_chain(cert, &self.cert)?;
        let summary = identity::summarize(&chain[0]).map_err(|source| LoadError::Identity {
            path: self.cert.clone(),
            source,
        })?;
        let identity = summary.cluster_id.map_err(|source| LoadError::Identity {
            path: self.cert.clone(),
            source,
        })?;
        let (key, _) = parse_key(key, &chain, &self.cert, &self.key)?;
        let roots = parse_roots(ca, &self.ca)?;
        Ok(TlsMaterial {
            chain,
            key,
            roots,
            identity,
            not_after: summary.not_after,
        })
    }
}

/// The expiry of the first certificate in the PEM file at `path` (any certificate, Refract
/// identity or not).
pub fn leaf_not_after(path: &Path) -> Result<time::OffsetDateTime, LoadError> {
    let chain = parse_chain(&read(path)?, path)?;
    let summary = identity::summarize(&chain[0]).map_err(|source| LoadError::Identity {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(summary.not_after)
}

fn pem_err(path: &Path, reason: impl Into<String>) -> LoadError {
    LoadError::Pem {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// A PEM certificate chain read from `path`; at least one CERTIFICATE block.
pub(crate) fn parse_chain(
    pem: &[u8],
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let chain: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| pem_err(path, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem_err(path, "no CERTIFICATE block"));
    }
    Ok(chain)
}

/// A PEM private key read from `key_path`, checked to belong to `chain`'s leaf; also the
/// key ready to sign with.
pub(crate) fn parse_key(
    pem: &[u8],
    chain: &[CertificateDer<'static>],
    cert_path: &Path,
    key_path: &Path,
) -> Result<(PrivateKeyDer<'static>, rustls::sign::CertifiedKey), LoadError> {
    let key = PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| pem_err(key_path, format!("no private key: {e}")))?;
    let signing_key = super::crypto_provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| pem_err(key_path, e.to_string()))?;
    let certified = rustls::sign::CertifiedKey::new(chain.to_vec(), signing_key);
    if certified.keys_match().is_err() {
        return Err(LoadError::KeyMismatch {
            cert: cert_path.to_path_buf(),
            key: key_path.to_path_buf(),
        });
    }
    Ok((key, certified))
}

/// A PEM CA bundle read from `path`; at least one CA certificate.
pub(crate) fn parse_roots(pem: &[u8], path: &Path) -> Result<rustls::RootCertStore, LoadError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca_cert in CertificateDer::pem_slice_iter(pem) {
        let ca_cert = ca_cert.map_err(|e| pem_err(path, e.to_string()))?;
        roots
            .add(ca_cert)
            .map_err(|e| pem_err(path, e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(pem_err(path, "no CA CERTIFICATE block"));
    }
    Ok(roots)
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}
