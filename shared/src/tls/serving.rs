//! A plain serving certificate (no Refract identity) that follows its files: for endpoints the
//! cluster calls, such as the virtual node's kubelet API, whose certificates cert-manager or a
//! CSR controller rotate in place.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::files::LoadError;

/// Resolves every handshake to the current certificate; swapped when the files change.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("serving cert lock").clone())
    }
}

impl ServingCert {
    /// Loads `cert` and `key` (failing loudly if unusable), then re-reads them every `poll`
    /// until `shutdown`. A change that does not load is logged and the last good pair stays.
    pub fn watch(
        cert: PathBuf,
        key: PathBuf,
        poll: Duration,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, LoadError> {
        let (mut last, first) = load(&cert, &key)?;
        let served = Arc::new(Self {
            current: RwLock::new(first),
        });
        let swapped = served.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(poll);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let raw = (std::fs::read(&cert).ok(), std::fs::read(&key).ok());
                if raw == last {
                    continue;
                }
                match load(&cert, &key) {
                    Ok((raw, loaded)) => {
                        *swapped.current.write().expect("serving cert lock") = loaded;
                        last = raw;
                        tracing::info!(cert = %cert.display(), "reloaded serving certificate; new connections use it");
                    }
                    Err(error) => {
                        last = raw;
                        tracing::warn!(%error, "changed serving certificate is not usable; keeping the current one");
                    }
                }
            }
        });
        Ok(served)
    }
}

type Raw = (Option<Vec<u8>>, Option<Vec<u8>>);

fn load(cert: &Path, key: &Path) -> Result<(Raw, Arc<CertifiedKey>), LoadError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let pem = |path: &Path, reason: String| LoadError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| pem(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem(cert, "no CERTIFICATE block".into()));
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| pem(key, format!("no private key: {e}")))?;
    let signing = super::crypto_provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| pem(key, e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    if certified.keys_match().is_err() {
        return Err(LoadError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        });
    }
    Ok(((Some(cert_pem), Some(key_pem)), Arc::new(certified)))
}

/// Reads a PEM CA bundle into a root store.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, LoadError> {
    let pem = std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| LoadError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        roots.add(cert).map_err(|e| LoadError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(LoadError::Pem {
            path: path.to_path_buf(),
            reason: "no CA CERTIFICATE block".into(),
        });
    }
    Ok(roots)
}
