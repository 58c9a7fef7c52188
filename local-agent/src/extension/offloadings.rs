//! The origin's NamespaceOffloadings, watched once for the whole agent.

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::crd::NamespaceOffloading;

/// The NamespaceOffloadings of the origin, watched once for the agent: the store, and a signal
/// after every change (coalesced) for the extension controller and for the scheduling gate.
/// The webhook reads the same store.
pub struct Offloadings {
    /// Every NamespaceOffloading, as the watch sees them.
    pub store: Store<NamespaceOffloading>,
    /// Gets a message after changes.
    pub changed: mpsc::Receiver<()>,
    /// Notified after changes, for the scheduling gate ([`crate::scheduling_gate`]).
    pub gate: std::sync::Arc<tokio::sync::Notify>,
}

/// Starts the watch of NamespaceOffloadings; it runs until `shutdown`.
pub fn watch_offloadings(client: kube::Client, shutdown: CancellationToken) -> Offloadings {
    let api: Api<NamespaceOffloading> = Api::all(client);
    let (store, writer) = reflector::store();
    let (changed_tx, changed) = mpsc::channel::<()>(1);
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let notify_gate = gate.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .backoff(crate::watch_backoff::watch_backoff())
            .reflect(writer)
            .touched_objects()
            .boxed();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                event = events.next() => match event {
                    Some(Ok(_)) => {
                        let _ = changed_tx.try_send(());
                        notify_gate.notify_one();
                    }
                    Some(Err(error)) => tracing::warn!(%error, "NamespaceOffloading watch error"),
                    None => return,
                },
            }
        }
    });
    Offloadings {
        store,
        changed,
        gate,
    }
}
