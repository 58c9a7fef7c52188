//! Tenants' objects on the provider, as one watch per kind sees them.
//!
//! Every object the remote agent writes carries the destination label; one metadata-only watch
//! per allowed kind over that label keeps a store the applier reads before writing (an object
//! already holding the desired state costs no request at all, one that differs costs one
//! apply), and forwards each change to [`crate::restore`], which repairs copies edited or
//! deleted on the provider. Metadata is all either needs (labels, the desired-state hash,
//! resourceVersion), and it keeps both the API server's work and the agent's memory small.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_shared::keys::{DESTINATION_LABEL, REMOTE_FIELD_MANAGER};
use refract_shared::tls::ClusterId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::apply::merge::{compact_fields, writes_without_apply};
use crate::kinds::Allowed;

/// A tenant object's metadata.
pub type Meta = PartialObjectMeta<DynamicObject>;

/// A change of a tenant object seen by the watch.
pub type Change = (Allowed, watcher::Event<Meta>);

/// Read access to the watched tenant objects; clones share the stores.
#[derive(Clone)]
pub struct TenantObjects {
    stores: Arc<BTreeMap<Allowed, Store<Meta>>>,
}

impl TenantObjects {
    /// The object `kind` `namespace/name` (namespace empty for namespaces), if the watch has it.
    pub fn get(&self, kind: Allowed, namespace: &str, name: &str) -> Option<Arc<Meta>> {
        let store = self.stores.get(&kind)?;
        let dt = kind.resource();
        let key = if matches!(kind, Allowed::Namespace) {
            ObjectRef::new_with(name, dt)
        } else {
            ObjectRef::new_with(name, dt).within(namespace)
        };
        store.get(&key)
    }

    /// Every object of every kind's store, once each has listed; `None` if some store has not
    /// listed within `within` (an agent just started, or a kind's CRD missing).
    pub async fn snapshot(&self, within: std::time::Duration) -> Option<Vec<(Allowed, Arc<Meta>)>> {
        // Polled, not awaited: kube-runtime wakes only the last task waiting for a store's first
        // listing.
        let deadline = tokio::time::Instant::now() + within;
        while !self.stores.values().all(listed) {
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut all = Vec::new();
        for (kind, store) in self.stores.iter() {
            all.extend(store.state().into_iter().map(|meta| (*kind, meta)));
        }
        Some(all)
    }

    /// No stores at all: every lookup misses (tests of the write path against a mocked API).
    #[cfg(test)]
    pub fn none() -> Self {
        Self {
            stores: Arc::default(),
        }
    }
}

/// Whether a store has listed at least once.
fn listed(store: &Store<Meta>) -> bool {
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// Starts one watch per allowed kind; returns the stores and the stream of changes.
pub fn spawn(
    client: kube::Client,
    provider: &ClusterId,
    shutdown: CancellationToken,
) -> (TenantObjects, mpsc::Receiver<Change>) {
    let (changes_tx, changes_rx) = mpsc::channel(1024);
    let mut stores = BTreeMap::new();
    for kind in Allowed::all() {
        let resource = kind.resource();
        let writer = reflector::store::Writer::new(resource.clone());
        stores.insert(kind, writer.as_reader());
        // An Api of partial objects asks for metadata only.
        let api: Api<Meta> = Api::all_with(client.clone(), &resource);
        let selector = format!("{DESTINATION_LABEL}={provider}");
        let config = watcher::Config::default().labels(&selector);
        let (tx, shutdown) = (changes_tx.clone(), shutdown.clone());
        // Field ownership is the API server's business, except the agent's own on the kinds it
        // writes without server-side apply (see `apply::merge`): it says which keys are its own.
        let keeps_own_fields = writes_without_apply(kind, false);
        tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .modify(move |obj| {
                    let managed = obj.managed_fields_mut();
                    if keeps_own_fields {
                        managed.retain(|e| e.manager.as_deref() == Some(REMOTE_FIELD_MANAGER));
                        managed.iter_mut().for_each(compact_fields);
                    } else {
                        managed.clear();
                    }
                })
                .reflect(writer)
                .boxed();
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    e = events.next() => match e {
                        Some(e) => e,
                        None => return,
                    },
                };
                match event {
                    Ok(event) => {
                        if tx.send((kind, event)).await.is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(kind = kind.kind(), %error, "cannot watch tenant objects of this kind (is its CRD installed?); retrying with backoff")
                    }
                }
            }
        });
    }
    (
        TenantObjects {
            stores: Arc::new(stores),
        },
        changes_rx,
    )
}
