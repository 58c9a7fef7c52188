//! A plain serving certificate (no Refract identity) that follows its files: for endpoints the
//! cluster calls, such as the virtual node's kubelet API, whose certificates cert-manager or a
//! CSR controller rotate in place.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::files::{parse_chain, parse_key, parse_roots, read, LoadError};
use refract_core::lock::RwLocked;

/// Resolves every handshake to the current certificate; swapped when the files change.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read_locked().clone())
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
                        *swapped.current.write_locked() = loaded;
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
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let chain = parse_chain(&cert_pem, cert)?;
    let (_, certified) = parse_key(&key_pem, &chain, cert, key)?;
    Ok(((Some(cert_pem), Some(key_pem)), Arc::new(certified)))
}

/// Reads a PEM CA bundle into a root store.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, LoadError> {
    parse_roots(&read(path)?, path)
}
