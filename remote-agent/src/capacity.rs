//! What the provider can offer each tenant, streamed as `Capacity`.
//!
//! Computed again when a node or a pod changes (changes within [`SETTLE`] counted once), when
//! a tenant connects, when the policy changes, and when the provider's API server turns ready
//! or not; with it goes the tenant's quota, which the virtual node offers no more than; put in each
//! connected tenant's [`Outbox`], which sends it only when it differs from what that session
//! has.
//!
//! Free = allocatable of Ready, schedulable nodes − requests of pods that have not finished,
//! for every resource the nodes report (GPUs included). A tenant's own pods are not
//! subtracted: they already run inside its virtual node's capacity, and counting them again
//! would shrink the node under its own workload.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PodSpec};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::hash::bytes_hash;
use refract_core::keys::ORIGIN_LABEL;
use refract_core::quantity::{format_milli, parse_milli};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, Capacity, RemoteMessage};
use tokio_util::sync::CancellationToken;

use tokio::sync::{watch, Notify};

use crate::apply::Applier;
use crate::outbox::{Outbox, Subject};
use crate::registry::Registry;
use crate::shadowpod_controller::{ProviderPod, Stores};

/// How long capacity waits after a change for the changes that come with it (a Deployment
/// scaled, a node draining) before it is computed once for all of them.
const SETTLE: Duration = Duration::from_secs(1);
/// How often the provider's API server is asked whether it is ready (the virtual node shows
/// it); this probe is the only periodic request.
const PROBE_EVERY: Duration = Duration::from_secs(3);

/// Why capacity may need computing again.
enum Woken {
    /// The API server's readiness, probed.
    Probed(bool),
    /// A node or a pod changed.
    Changed,
    /// A tenant connected, or the policy (and its quotas) changed: computed at once.
    Recompute,
}

/// The provider's nodes as capacity's watch has them, for the other readers of nodes
/// ([`crate::networks`]): the store, and a count that changes with every node change.
pub struct Nodes {
    /// Every node.
    pub store: Store<Node>,
    /// Changes after each node change.
    pub changed: watch::Receiver<u64>,
}

/// Starts the capacity stream over `stores`' pods and a watch of the provider's nodes, which
/// it returns for the other readers of nodes.
pub fn spawn(
    client: kube::Client,
    stores: Stores,
    registry: Registry,
    outbox: Outbox,
    applier: Applier,
    node_labels: BTreeMap<String, String>,
    shutdown: CancellationToken,
) -> Nodes {
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let nodes_changed = Arc::new(Notify::new());
    let (epoch, changed) = watch::channel(0u64);
    let watch_nodes = {
        let nodes_changed = nodes_changed.clone();
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(nodes_writer)
            .for_each(move |_| {
                nodes_changed.notify_one();
                epoch.send_modify(|n| *n = n.wrapping_add(1));
                futures::future::ready(())
            })
    };
    let shared = Nodes {
        store: nodes.clone(),
        changed,
    };
    let pods = stores.pods.clone();
    let stream = async move {
        let _ = nodes.wait_until_ready().await;
        stores.pods_listed().await;
        tracing::debug!("capacity stores ready");
        let mut opened = outbox.sessions_opened();
        let mut policies = applier.policies_changed();
        let mut probe = tokio::time::interval(PROBE_EVERY);
        probe.tick().await;
        let mut api_server_ready = client.apiserver_version().await.is_ok();
        loop {
            for tenant in registry.connected() {
                let capacity = Capacity {
                    free: free_for(&nodes, &pods, &tenant),
                    node_labels: node_labels.clone(),
                    api_server_ready,
                    quota: applier.quota_of(&tenant).node_caps(),
                };
                let hash = bytes_hash(format!("{capacity:?}").as_bytes());
                let message = RemoteMessage {
                    kind: Some(remote_message::Kind::Capacity(capacity)),
                };
                outbox.put(&tenant, Subject::capacity(), hash, message);
            }
            loop {
                let woken = tokio::select! {
                    _ = probe.tick() => Woken::Probed(client.apiserver_version().await.is_ok()),
                    _ = nodes_changed.notified() => Woken::Changed,
                    _ = stores.pods_changed.notified() => Woken::Changed,
                    // A new session's virtual node is NotReady until its capacity arrives.
                    _ = opened.changed() => Woken::Recompute,
                    _ = policies.changed() => Woken::Recompute,
                };
                match woken {
                    // The same answer as before: nothing to compute.
                    Woken::Probed(ready) if ready == api_server_ready => continue,
                    Woken::Probed(ready) => api_server_ready = ready,
                    // Let the changes that come with it arrive first.
                    Woken::Changed => tokio::time::sleep(SETTLE).await,
                    Woken::Recompute => {}
                }
                break;
            }
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = watch_nodes => {}
            _ = stream => {}
        }
    });
    shared
}

fn free_for(
    nodes: &Store<Node>,
    pods: &Store<ProviderPod>,
    tenant: &ClusterId,
) -> BTreeMap<String, String> {
    let mut free: BTreeMap<String, i128> = BTreeMap::new();
    let mut usable = std::collections::HashSet::new();
    for node in nodes.state() {
        if !node_usable(&node) {
            continue;
        }
        usable.insert(node.name_any());
        for (resource, q) in node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .into_iter()
            .flatten()
        {
            *free.entry(resource.clone()).or_default() += parse_milli(&q.0).unwrap_or(0);
        }
    }
    for pod in pods.state() {
        let on_usable = pod.node_name.as_ref().is_some_and(|n| usable.contains(n));
        let finished = matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed"));
        let own = pod.meta().label(ORIGIN_LABEL) == Some(tenant.as_str());
        if !on_usable || finished || own {
            continue;
        }
        for (resource, milli) in pod.requests.iter() {
            if let Some(f) = free.get_mut(resource) {
                *f -= milli;
            }
        }
        if let Some(p) = free.get_mut("pods") {
            *p -= 1000;
        }
    }
    free.into_iter()
        .map(|(r, m)| (r.clone(), format_milli(&r, m)))
        .collect()
}

fn node_usable(node: &Node) -> bool {
    let schedulable = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    schedulable && ready
}

/// A pod's effective requests: per resource, the larger of the containers' sum and the
/// largest init container.
pub fn requests(spec: &PodSpec) -> BTreeMap<String, i128> {
    let of = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, i128> {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, q)| (k.clone(), parse_milli(&q.0).unwrap_or(0)))
            .collect()
    };
    let mut total: BTreeMap<String, i128> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in of(c) {
            *total.entry(k).or_default() += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in of(c) {
            let t = total.entry(k).or_default();
            *t = (*t).max(v);
        }
    }
    total
}
