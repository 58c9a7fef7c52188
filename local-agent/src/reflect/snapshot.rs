//! Namespace snapshots: on every session, and for every namespace extended later, each
//! reflector sends every object of the namespace and then `SnapshotComplete`, after which the
//! remote agent removes what the origin no longer has there. A kind whose reflection is off
//! sends the snapshot alone, withdrawing what an earlier configuration left.

use kube::ResourceExt;
use refract_core::options::Kind;

use super::{Reflectable, Reflector, Shared};
use crate::extension::Extension;
use crate::key::Key;
use crate::outbox::{Outbox, Producer};

/// For a kind whose reflection is off: on every session, and for every namespace extended
/// later, tells the provider that nothing of the kind is wanted in the twin namespace, so that
/// copies an earlier configuration left there are removed. Claims never come here: a provider
/// claim's volume holds data that turning the storage fabric off must not delete.
pub(super) async fn withdraw(kind: Kind, shared: Shared, outbox: Outbox) {
    let mut rx = shared.extension.clone();
    let mut last = Extension::default();
    loop {
        let current = rx.borrow_and_update().clone();
        if let Some(session) = &current.session {
            for (_, remote_ns) in current.to_resend(&last) {
                outbox
                    .snapshot_complete(
                        session,
                        Producer::Objects(kind),
                        kind.api_version(),
                        &remote_ns,
                    )
                    .await;
            }
        }
        last = current;
        if rx.changed().await.is_err() {
            return;
        }
    }
}

impl<K: Reflectable> Reflector<K> {
    /// Whether this kind is off now and its copies stay on the provider all the same: claims,
    /// whose volumes hold data (their reconcile sends nothing while off, see `reconcile`).
    fn keeps_copies_while_off(&self) -> bool {
        self.kind == Kind::PersistentVolumeClaim
            && self.shared.options.current().kind(self.kind).workers == 0
    }

    /// Re-sends extended namespaces when the session or the set of namespaces changes.
    pub(super) async fn follow_extension(&self) {
        let mut rx = self.shared.extension.clone();
        let mut last = Extension::default();
        let mut listed = self.listed.clone();
        let (mut nodes, mut services) = (
            self.shared.nodes_listed.clone(),
            self.shared.services_listed.clone(),
        );
        let reads_others = self.dependencies.is_some();
        loop {
            let mut current = rx.borrow_and_update().clone();
            // A namespace's snapshot is sent once its objects are all in the store, and what
            // their forge reads besides them (a slice's nodes and Service): after it, the
            // remote agent removes what the snapshot did not have, and a slice forged without
            // its nodes would lose their endpoints there.
            loop {
                let waiting = {
                    let listed = listed.borrow_and_update();
                    current
                        .namespaces
                        .keys()
                        .any(|ns| !listed.contains(ns) || !self.inputs_listed(ns))
                };
                if !waiting {
                    break;
                }
                tokio::select! {
                    changed = listed.changed() => if changed.is_err() { return },
                    Ok(()) = nodes.changed(), if reads_others => {}
                    Ok(()) = services.changed(), if reads_others => {}
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        current = rx.borrow_and_update().clone();
                    }
                }
            }
            // The twin namespace of a namespace no longer extended goes with everything in
            // it: forget what was sent there.
            for ns in last.namespaces.keys() {
                if !current.namespaces.contains_key(ns) {
                    self.outbox.forget_namespace(self.producer(), ns);
                }
            }
            let resync = current.to_resend(&last);
            if let Some(session) = &current.session {
                for (ns, remote_ns) in resync {
                    let keys: Vec<Key> = self
                        .store
                        .state()
                        .iter()
                        .filter(|o| o.namespace().as_deref() == Some(ns.as_str()))
                        .map(|o| Key {
                            namespace: ns.clone(),
                            name: o.name_any(),
                        })
                        .collect();
                    let count = keys.len();
                    for key in keys {
                        let key = self.queue.claim(key).await;
                        self.reconcile(&key).await;
                    }
                    if self.keeps_copies_while_off() {
                        // Claims turned off send nothing, and no SnapshotComplete either: it
                        // would have the provider collect every claim, volumes and data.
                        continue;
                    }
                    self.outbox
                        .snapshot_complete(
                            session,
                            self.producer(),
                            self.kind.api_version(),
                            &remote_ns,
                        )
                        .await;
                    tracing::debug!(kind = self.kind.kind(), namespace = %ns, count, "namespace snapshot sent");
                }
            }
            last = current;
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}
