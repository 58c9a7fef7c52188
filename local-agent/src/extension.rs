//! Namespace extension: which origin namespaces are extended to this agent's provider.
//!
//! For every `NamespaceOffloading` named `offloading` whose cluster selector matches this
//! peer's virtual node labels, the controller asks the remote agent (an Upsert of kind
//! Namespace) to create the twin namespace, waits for the answer, records it in the
//! NamespaceOffloading status, and publishes the confirmed namespaces for the reflectors. On
//! each new session it re-sends every twin namespace and then `SnapshotComplete`, so twin
//! namespaces whose NamespaceOffloading disappeared while the link was down are removed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use refract_core::json;
use refract_core::offloading;
use refract_wire::proto::{ObjectRef, Outcome, Upsert};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::crd::{self, NamespaceOffloading};
use crate::key::Key;
use crate::link::SessionTx;
use crate::outbox::{Origin, Outbox, Producer};

mod offloadings;
mod rewrites;
mod status;

pub use offloadings::{watch_offloadings, Offloadings};

/// How long the remote agent has to answer a namespace request before it is retried.
const ACK_TIMEOUT: Duration = Duration::from_secs(15);
pub use refract_core::keys::ORIGINAL_NAME_ANNOTATION;

/// What reflectors act on: the current session and the namespaces extended on it.
#[derive(Clone, Debug, Default)]
pub struct Extension {
    /// The open session, if any.
    pub session: Option<SessionTx>,
    /// Local namespace → twin namespace, confirmed by the remote agent on this session.
    pub namespaces: BTreeMap<String, String>,
    /// The namespaces whose NamespaceOffloading selects this peer (with a valid twin name),
    /// connected or not: what the reflectors watch at the origin. It holds every namespace of
    /// `namespaces`, and keeps them while the link is down so a reconnect lists nothing again.
    pub selected: BTreeSet<String>,
}

impl Extension {
    /// The session's generation (0 when disconnected).
    pub fn generation(&self) -> u64 {
        self.session.as_ref().map_or(0, |s| s.generation)
    }

    /// The extended namespaces (local, twin) whose every object must be sent again since
    /// `last` was seen: all of them on a new session, else those newly extended or whose twin
    /// changed. Each is followed by its SnapshotComplete.
    pub fn to_resend(&self, last: &Extension) -> Vec<(String, String)> {
        let new_session = self.generation() != last.generation();
        self.namespaces
            .iter()
            .filter(|(ns, remote)| new_session || last.namespaces.get(*ns) != Some(*remote))
            .map(|(ns, remote)| (ns.clone(), remote.clone()))
            .collect()
    }
}

/// Settings of the controller.
#[derive(Clone)]
pub struct ExtensionConfig {
    /// The origin cluster id.
    pub local_cluster_id: String,
    /// The provider cluster id.
    pub remote_cluster_id: String,
    /// The peer's virtual node labels as the node shows them (the provider's suggestions
    /// included), matched by cluster selectors.
    pub virtual_node_labels: watch::Receiver<BTreeMap<String, String>>,
    /// Records the NamespaceOffloadings' events (extended, refused).
    pub recorder: Recorder,
}

/// Why a namespace is not (yet) extended.
#[derive(Clone, Debug, PartialEq)]
enum Failure {
    /// Permanent until something changes (conflict, invalid name).
    Refused(String),
    /// Will be retried (link down, timeout, transient error).
    Pending(String),
}

/// Runs the controller until `shutdown`.
pub async fn run(
    client: kube::Client,
    config: ExtensionConfig,
    offloadings: Offloadings,
    mut sessions: watch::Receiver<Option<SessionTx>>,
    outbox: Outbox,
    extension_tx: watch::Sender<Extension>,
    shutdown: CancellationToken,
) {
    let Offloadings {
        store,
        changed: mut changed_rx,
        ..
    } = offloadings;
    let mut labels = config.virtual_node_labels.clone();
    let mut state = State {
        client,
        config,
        store: store.clone(),
        outbox,
        generation: 0,
        confirmed: BTreeMap::new(),
        failures: BTreeMap::new(),
        snapshot_sent: false,
        rewrites: rewrites::Rewrites::default(),
    };
    let mut retry = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = sessions.changed() => if changed.is_err() { return },
            changed = changed_rx.recv() => if changed.is_none() { return },
            changed = labels.changed() => if changed.is_err() { return },
            _ = retry.tick(), if state.has_pending() => {}
        }
        if store.wait_until_ready().await.is_err() {
            return;
        }
        let session = sessions.borrow().clone();
        // The reflectors start watching a newly selected namespace before its twin is asked
        // for, so its objects are listed by the time it is confirmed. Namespaces leave the set
        // only below, together with their twin.
        let selected = state.selected();
        extension_tx.send_if_modified(|current| {
            let before = current.selected.len();
            current.selected.extend(selected.iter().cloned());
            current.selected.len() != before
        });
        state.reconcile(session.clone()).await;
        let next = Extension {
            session,
            namespaces: state.confirmed.clone(),
            selected,
        };
        extension_tx.send_if_modified(|current| {
            let changed = current.generation() != next.generation()
                || current.namespaces != next.namespaces
                || current.selected != next.selected;
            if changed {
                *current = next;
            }
            changed
        });
    }
}

struct State {
    client: kube::Client,
    config: ExtensionConfig,
    store: Store<NamespaceOffloading>,
    outbox: Outbox,
    generation: u64,
    confirmed: BTreeMap<String, String>,
    failures: BTreeMap<String, Failure>,
    snapshot_sent: bool,
    /// This agent's status entries written again unchanged: another writer undoing them.
    rewrites: rewrites::Rewrites,
}

impl State {
    fn has_pending(&self) -> bool {
        self.failures
            .values()
            .any(|f| matches!(f, Failure::Pending(_)))
    }

    /// The namespaces selecting this peer with a valid twin name.
    fn selected(&self) -> BTreeSet<String> {
        self.desired()
            .into_iter()
            .filter(|(_, twin)| twin.is_ok())
            .map(|(ns, _)| ns)
            .collect()
    }

    /// Local namespace → the twin name it should have (or why it has none), for the
    /// NamespaceOffloadings selecting this peer.
    fn desired(&self) -> BTreeMap<String, Result<String, String>> {
        let labels = self.config.virtual_node_labels.borrow().clone();
        let labels = &labels;
        self.store
            .state()
            .iter()
            .filter(|nso| nso.name_any() == crd::NAME && nso.metadata.deletion_timestamp.is_none())
            .filter(|nso| offloading::is_selected(nso.spec.cluster_selector.as_ref(), labels))
            .filter_map(|nso| {
                let ns = nso.namespace()?;
                let name = offloading::remote_namespace_name(
                    nso.spec.namespace_mapping_strategy,
                    nso.spec.remote_namespace_name.as_deref(),
                    &ns,
                    &self.config.local_cluster_id,
                );
                Some((ns, name))
            })
            .collect()
    }

    async fn reconcile(&mut self, session: Option<SessionTx>) {
        let generation = session.as_ref().map_or(0, |s| s.generation);
        if generation != self.generation {
            self.generation = generation;
            self.confirmed.clear();
            self.snapshot_sent = false;
        }
        let desired = self.desired();
        self.failures.retain(|ns, _| desired.contains_key(ns));
        if let Some(session) = &session {
            for (ns, target) in &desired {
                match target {
                    Err(reason) => {
                        self.failures
                            .insert(ns.clone(), Failure::Refused(reason.clone()));
                    }
                    Ok(remote) if self.confirmed.get(ns) != Some(remote) => {
                        match self.create_twin(session, ns, remote).await {
                            Ok(()) => {
                                self.failures.remove(ns);
                                self.confirmed.insert(ns.clone(), remote.clone());
                            }
                            Err(f) => {
                                self.failures.insert(ns.clone(), f);
                            }
                        }
                    }
                    Ok(_) => {}
                }
            }
            let gone: Vec<_> = self
                .confirmed
                .iter()
                .filter(|(ns, remote)| {
                    desired.get(*ns).and_then(|d| d.as_ref().ok()) != Some(*remote)
                })
                .map(|(ns, remote)| (ns.clone(), remote.clone()))
                .collect();
            for (ns, remote) in gone {
                tracing::info!(namespace = %ns, remote = %remote, "namespace no longer extended; removing its twin");
                self.outbox
                    .delete_remote(
                        session,
                        twin_origin(&ns),
                        namespace_ref(&remote),
                        String::new(),
                        None,
                    )
                    .await;
                self.confirmed.remove(&ns);
            }
            if !self.snapshot_sent {
                self.outbox
                    .snapshot_complete(session, Producer::Namespaces, "v1", "")
                    .await;
                self.snapshot_sent = true;
            }
        } else {
            for (ns, target) in &desired {
                if target.is_ok() {
                    self.failures.insert(
                        ns.clone(),
                        Failure::Pending("not connected to the remote agent".into()),
                    );
                }
            }
        }
        self.write_statuses(&desired).await;
    }

    async fn create_twin(
        &self,
        session: &SessionTx,
        ns: &str,
        remote: &str,
    ) -> Result<(), Failure> {
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": remote,
                "annotations": {ORIGINAL_NAME_ANNOTATION: ns},
            }
        });
        let upsert = Upsert {
            object: Some(namespace_ref(remote)),
            revision: String::new(),
            object_json: json::to_vec(&object),
            origin_uid: String::new(),
            // Set by the request.
            awaited: false,
            trace_parent: String::new(),
        };
        let waiter = self.outbox.request(session, twin_origin(ns), upsert).await;
        let ack = match tokio::time::timeout(ACK_TIMEOUT, waiter).await {
            Ok(Ok(ack)) => ack,
            _ => return Err(Failure::Pending("the remote agent did not answer".into())),
        };
        match Outcome::try_from(ack.outcome).unwrap_or(Outcome::Unspecified) {
            Outcome::Applied | Outcome::Unchanged => {
                tracing::info!(namespace = %ns, remote = %remote, "namespace extended");
                Ok(())
            }
            Outcome::Transient => Err(Failure::Pending(ack.message)),
            other => {
                tracing::warn!(namespace = %ns, remote = %remote, outcome = other.as_str_name(), message = %ack.message, "twin namespace refused");
                Err(Failure::Refused(ack.message))
            }
        }
    }
}

fn namespace_ref(name: &str) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "Namespace".into(),
        namespace: String::new(),
        name: name.into(),
    }
}

/// The outbox's name for the twin of origin namespace `ns`.
fn twin_origin(ns: &str) -> Origin {
    Origin::new(
        Producer::Namespaces,
        Key {
            namespace: String::new(),
            name: ns.to_string(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_extension(generation: u64, namespaces: &[(&str, &str)]) -> Extension {
        let calls = tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        let (tx, _) = tokio::sync::mpsc::channel(1);
        let session = (generation > 0).then(|| SessionTx {
            generation,
            session_id: String::new(),
            tx: tx.clone(),
            direct: tx,
            calls,
        });
        Extension {
            session,
            namespaces: namespaces
                .iter()
                .map(|(l, r)| (l.to_string(), r.to_string()))
                .collect(),
            selected: namespaces.iter().map(|(l, _)| l.to_string()).collect(),
        }
    }

    fn names(v: Vec<(String, String)>) -> Vec<String> {
        v.into_iter().map(|(ns, _)| ns).collect()
    }

    #[tokio::test]
    async fn a_new_session_resends_every_namespace_else_only_new_or_moved_ones() {
        let last = mk_extension(1, &[("a", "a-o"), ("b", "b-o")]);
        let same = mk_extension(1, &[("a", "a-o"), ("b", "b-x"), ("c", "c-o")]);
        assert_eq!(names(same.to_resend(&last)), vec!["b", "c"]);
        let reconnected = mk_extension(2, &[("a", "a-o"), ("b", "b-o")]);
        assert_eq!(names(reconnected.to_resend(&last)), vec!["a", "b"]);
        assert!(last.to_resend(&last).is_empty());
    }
}
