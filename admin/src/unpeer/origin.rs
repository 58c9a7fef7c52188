//! What unpeering removes from the origin cluster, without a word to the provider: the pods
//! still bound to the virtual node, this peer's NamespaceOffloading status, the node's Lease
//! and the node. Every step tolerates what is already gone, so the agent and
//! `local-agent unpeer --force` may both run it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use refract_core::keys::{LOCAL_STATUS_FIELD_MANAGER, UNPEER_PROGRESS_ANNOTATION};

use crate::crd::{self, NamespaceOffloading};

/// What [`clean_up`] removed.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Pods deleted at once (`namespace/name`).
    pub pods: Vec<String>,
    /// Namespaces whose NamespaceOffloading status no longer shows this peer.
    pub statuses: Vec<String>,
    /// Whether the node existed and was deleted.
    pub node: bool,
}

/// The pods bound to `node`.
pub async fn pods_on(client: &kube::Client, node: &str) -> Result<Vec<Pod>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(pods.list(&params).await?.items)
}

/// Writes `progress` on the node for `local-agent unpeer` to show; a node already gone is fine.
pub async fn report(client: &kube::Client, node: &str, progress: &str) {
    tracing::info!(node, progress, "unpeering");
    let nodes: Api<Node> = Api::all(client.clone());
    let patch =
        serde_json::json!({"metadata": {"annotations": {UNPEER_PROGRESS_ANNOTATION: progress}}});
    let written = nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    if let Err(error) = absent(written) {
        tracing::warn!(node, %error, "failed to report unpeering progress");
    }
}

/// Removes the peering from the origin: deletes at once every pod still bound to `node`,
/// drops peer `remote_cluster_id`'s entries from every NamespaceOffloading status, and deletes
/// the node's Lease and the node.
pub async fn clean_up(
    client: &kube::Client,
    node: &str,
    remote_cluster_id: &str,
) -> Result<Cleaned, kube::Error> {
    let mut cleaned = Cleaned::default();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for pod in pods_on(client, node).await? {
        let ns = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if absent(api.delete(&pod.name_any(), &now).await)? {
            continue;
        }
        cleaned.pods.push(format!("{ns}/{}", pod.name_any()));
    }
    cleaned.statuses = clear_statuses(client, remote_cluster_id).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    absent(leases.delete(node, &DeleteParams::default()).await)?;
    let nodes: Api<Node> = Api::all(client.clone());
    cleaned.node = !absent(nodes.delete(node, &DeleteParams::default()).await)?;
    tracing::info!(node, pods = ?cleaned.pods, statuses = ?cleaned.statuses, node_deleted = cleaned.node, "removed the peering from the origin");
    Ok(cleaned)
}

/// Gives up every status field peer `remote_cluster_id` owns: applying an empty status as its
/// field manager removes its conditions and leaves other peers' alone.
async fn clear_statuses(
    client: &kube::Client,
    remote_cluster_id: &str,
) -> Result<Vec<String>, kube::Error> {
    let all: Api<NamespaceOffloading> = Api::all(client.clone());
    let manager = format!("{LOCAL_STATUS_FIELD_MANAGER}-{remote_cluster_id}");
    let params = PatchParams::apply(&manager).force();
    let patch = serde_json::json!({
        "apiVersion": "offloading.refract.io/v1alpha1",
        "kind": "NamespaceOffloading",
        "status": {},
    });
    let mut cleared = Vec::new();
    for nso in all.list(&ListParams::default()).await? {
        let shows_peer = nso.status.as_ref().is_some_and(|s| {
            s.remote_namespaces_conditions
                .contains_key(remote_cluster_id)
        });
        if nso.name_any() != crd::NAME || !shows_peer {
            continue;
        }
        let ns = nso.namespace().unwrap_or_default();
        let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), &ns);
        if !absent(
            api.patch_status(crd::NAME, &params, &Patch::Apply(&patch))
                .await,
        )? {
            cleared.push(ns);
        }
    }
    Ok(cleared)
}

/// `Ok(true)` when the object was already gone, `Ok(false)` when the call succeeded.
fn absent<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
        Err(e) => Err(e),
    }
}
