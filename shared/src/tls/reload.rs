//! A value built from TLS files that follows the files when they change.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::files::{LoadError, TlsFiles, TlsMaterial};
use crate::tls::identity::ClusterId;

/// How often the files are checked for changes by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(2);

/// The current value built from the files, plus what it was built from.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The value (a rustls configuration, typically).
    pub value: T,
    /// The identity in the certificate it was built from.
    pub identity: ClusterId,
    /// That certificate's expiry.
    pub not_after: time::OffsetDateTime,
    /// How many times the files have been (re)loaded successfully, starting at 1.
    pub generation: u64,
}

/// A value built from [`TlsFiles`], rebuilt when their contents change.
///
/// Polling the contents (not modification times) is deliberate: Kubernetes Secret volumes
/// swap a symlink, and coarse mtimes can hide a quick rewrite.
#[derive(Clone)]
pub struct Watched<T> {
    rx: watch::Receiver<Arc<Loaded<T>>>,
}

impl<T: Send + Sync + 'static> Watched<T> {
    /// Loads the files once (failing loudly if they are unusable), then keeps following them
    /// until `shutdown`. A change that fails to load or build is logged and ignored: the last
    /// good value stays in use.
    pub fn spawn<B, E>(
        files: TlsFiles,
        poll: Duration,
        build: B,
        shutdown: CancellationToken,
    ) -> Result<Self, WatchError>
    where
        B: Fn(&TlsMaterial) -> Result<T, E> + Send + 'static,
        E: std::fmt::Display,
    {
        let raw = files.read_raw()?;
        let first = build_loaded(&files, &raw, &build, 1)?;
        let (tx, rx) = watch::channel(Arc::new(first));
        tokio::spawn(async move {
            let mut last_raw = raw;
            let mut generation = 1;
            let mut tick = tokio::time::interval(poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let raw = match files.read_raw() {
                    Ok(raw) => raw,
                    Err(error) => {
                        tracing::warn!(%error, "failed to re-read TLS files; keeping the current certificate");
                        continue;
                    }
                };
                if raw == last_raw {
                    continue;
                }
                match build_loaded(&files, &raw, &build, generation + 1) {
                    Ok(loaded) => {
                        generation += 1;
                        tracing::info!(
                            cert = %files.cert.display(),
                            identity = %loaded.identity,
                            not_after = %loaded.not_after,
                            generation,
                            "reloaded TLS certificate; new connections use it"
                        );
                        tx.send_replace(Arc::new(loaded));
                        last_raw = raw;
                    }
                    Err(error) => {
                        // Keep polling the same contents quietly until they change again.
                        tracing::warn!(%error, "changed TLS files are not usable; keeping the current certificate");
                        last_raw = raw;
                    }
                }
            }
        });
        Ok(Self { rx })
    }

    /// The value to use for the next connection.
    pub fn current(&self) -> Arc<Loaded<T>> {
        self.rx.borrow().clone()
    }
}

/// Why TLS files could not be turned into a usable value.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The files could not be loaded or validated.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The material was valid but the value could not be built from it.
    #[error("failed to build TLS configuration: {0}")]
    Build(String),
}

fn build_loaded<T, B, E>(
    files: &TlsFiles,
    raw: &[Vec<u8>; 3],
    build: &B,
    generation: u64,
) -> Result<Loaded<T>, WatchError>
where
    B: Fn(&TlsMaterial) -> Result<T, E>,
    E: std::fmt::Display,
{
    let material = files.parse(&raw[0], &raw[1], &raw[2])?;
    let value = build(&material).map_err(|e| WatchError::Build(e.to_string()))?;
    Ok(Loaded {
        value,
        identity: material.identity,
        not_after: material.not_after,
        generation,
    })
}
