//! The scheduling gate: namespaces whose NamespaceOffloading lets pods go to providers
//! (`Remote`, `LocalAndRemote`) carry `liqo.io/scheduling-enabled=true`, and the pod webhook's
//! `namespaceSelector` matches that label, so the API server calls the webhook for pods of
//! offloaded namespaces only (as Liqo does).
//!
//! The webhook sets the label while it admits the NamespaceOffloading (`/gate-namespace`), so
//! the pods of one `kubectl apply` that lists the NamespaceOffloading before them go through
//! the pod webhook; this gate sets it too, for NamespaceOffloadings admitted while no agent
//! served. A pod created before its NamespaceOffloading (or while the label was not yet set)
//! is admitted without Refract and not placed by it: the gate then tells the operator, as a
//! Warning event on the NamespaceOffloading naming those pods, instead of leaving them
//! silently Pending. Every local agent of the origin keeps the same label the same way.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use refract_core::keys::{SCHEDULING_LABEL, VIRTUAL_NODE_TAINT_KEY};
use tokio_util::sync::CancellationToken;

use crate::crd::{NamespaceOffloading, PodOffloadingStrategy};
use crate::recorder::publish_event;

/// How often the NamespaceOffloading cache is compared with the labels (in memory) without a
/// change notified: retries after a failed patch.
const TICK: Duration = Duration::from_secs(1);
/// How often the labelled namespaces are listed again, to repair changes made by others.
const RELIST: Duration = Duration::from_secs(30);

/// The namespaces that must carry the label: those with a NamespaceOffloading named
/// `offloading` (the only name that counts) whose strategy lets pods leave, not being deleted.
pub fn gated(offloadings: &[NamespaceOffloading]) -> BTreeSet<String> {
    offloadings
        .iter()
        .filter(|o| o.name_any() == "offloading" && o.meta().deletion_timestamp.is_none())
        .filter(|o| o.spec.pod_offloading_strategy != PodOffloadingStrategy::Local)
        .filter_map(|o| o.namespace())
        .collect()
}

/// Pods the webhook never saw, placed against `strategy`: without the virtual-node toleration,
/// and (for `LocalAndRemote`, where running at the origin is fine) not scheduled yet.
pub fn unplaced(pods: &[Pod], strategy: PodOffloadingStrategy) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            strategy == PodOffloadingStrategy::Remote
                || p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
        })
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|p| {
            !p.spec
                .as_ref()
                .and_then(|s| s.tolerations.as_ref())
                .is_some_and(|ts| {
                    ts.iter()
                        .any(|t| t.key.as_deref() == Some(VIRTUAL_NODE_TAINT_KEY))
                })
        })
        .map(|p| p.name_any())
        .collect()
}

/// Keeps the label in step with `store` until `shutdown`.
pub async fn run(
    client: kube::Client,
    store: Store<NamespaceOffloading>,
    changed: std::sync::Arc<tokio::sync::Notify>,
    recorder: Recorder,
    shutdown: CancellationToken,
) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut labelled: Option<BTreeSet<String>> = None;
    let mut listed_at = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // At once after a change: the label should be on before the first pods come.
            _ = changed.notified() => {}
            _ = tick.tick() => {}
        }
        if labelled.is_none() || listed_at.elapsed() > RELIST {
            let selector = format!("{SCHEDULING_LABEL}=true");
            match namespaces
                .list(&ListParams::default().labels(&selector))
                .await
            {
                Ok(list) => {
                    labelled = Some(list.items.iter().map(|n| n.name_any()).collect());
                    listed_at = Instant::now();
                }
                Err(error) => {
                    tracing::warn!(%error, "failed to list namespaces labelled {SCHEDULING_LABEL}");
                    continue;
                }
            }
        }
        // Set by the listing above; a failed listing went round again.
        let Some(current) = labelled.as_mut() else {
            continue;
        };
        let offloadings: Vec<NamespaceOffloading> =
            store.state().iter().map(|o| (**o).clone()).collect();
        let wanted = gated(&offloadings);
        for ns in wanted.difference(&current.clone()) {
            if set_label(&namespaces, ns, true).await {
                current.insert(ns.clone());
                tracing::info!(namespace = %ns, "pods of this namespace now go through the offloading webhook");
                if let Some(nso) = offloadings
                    .iter()
                    .find(|o| o.namespace().as_deref() == Some(ns.as_str()))
                {
                    warn_unplaced(&client, &recorder, nso, ns).await;
                }
            }
        }
        for ns in current.clone().difference(&wanted) {
            // The cache may not have listed yet (and kube-runtime wakes only one task waiting
            // for that): a removal is confirmed with the API server first.
            if still_gated(&client, ns).await {
                continue;
            }
            if set_label(&namespaces, ns, false).await {
                current.remove(ns);
                tracing::info!(namespace = %ns, "namespace no longer offloads pods; webhook gate removed");
            }
        }
    }
}

/// Whether the API server says `ns` still has a NamespaceOffloading that opens the gate (true
/// when it cannot tell: a label is never removed on a guess).
async fn still_gated(client: &kube::Client, ns: &str) -> bool {
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    match api.get_opt("offloading").await {
        Ok(found) => !gated(&found.into_iter().collect::<Vec<_>>()).is_empty(),
        Err(error) => {
            tracing::debug!(namespace = %ns, %error, "failed to read the NamespaceOffloading");
            true
        }
    }
}

/// Sets (or removes) the label on namespace `ns`; whether it is as asked (a namespace gone
/// needs none).
pub(crate) async fn set_label(namespaces: &Api<Namespace>, ns: &str, on: bool) -> bool {
    let value = if on {
        serde_json::Value::from("true")
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"metadata": {"labels": {SCHEDULING_LABEL: value}}});
    match namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => true,
        // A namespace being deleted, or already gone, needs no gate.
        Err(kube::Error::Api(e)) if e.code == 404 => true,
        Err(error) => {
            tracing::warn!(namespace = %ns, %error, "failed to set the {SCHEDULING_LABEL} label");
            false
        }
    }
}

async fn warn_unplaced(
    client: &kube::Client,
    recorder: &Recorder,
    nso: &NamespaceOffloading,
    ns: &str,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return;
    };
    let missed = unplaced(&list.items, nso.spec.pod_offloading_strategy);
    if missed.is_empty() {
        return;
    }
    let note = format!(
        "{} pod(s) were created before this namespace was offloaded and were not placed by Refract: {}; delete them (their controllers recreate them) to have them offloaded",
        missed.len(),
        missed.join(", ")
    );
    tracing::warn!(namespace = %ns, pods = ?missed, "pods created before the namespace was offloaded");
    publish_event(
        recorder,
        nso.object_ref(&()),
        EventType::Warning,
        "PodsCreatedBeforeOffloading",
        note,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::NamespaceOffloadingSpec;

    fn nso(ns: &str, name: &str, strategy: PodOffloadingStrategy) -> NamespaceOffloading {
        let mut o = NamespaceOffloading::new(
            name,
            NamespaceOffloadingSpec {
                pod_offloading_strategy: strategy,
                ..Default::default()
            },
        );
        o.metadata.namespace = Some(ns.into());
        o
    }

    #[test]
    fn only_offloadings_that_let_pods_leave_open_the_gate() {
        let list = vec![
            nso("a", "offloading", PodOffloadingStrategy::Remote),
            nso("b", "offloading", PodOffloadingStrategy::LocalAndRemote),
            nso("c", "offloading", PodOffloadingStrategy::Local),
            nso("d", "other-name", PodOffloadingStrategy::Remote),
        ];
        assert_eq!(
            gated(&list),
            ["a", "b"].iter().map(|s| s.to_string()).collect()
        );
    }

    #[test]
    fn unplaced_pods_are_unscheduled_and_lack_the_toleration() {
        let pod = |name: &str, node: Option<&str>, tolerated: bool| {
            let mut p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"containers": []}
            }))
            .unwrap();
            let spec = p.spec.as_mut().unwrap();
            spec.node_name = node.map(String::from);
            if tolerated {
                spec.tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
                    key: Some(VIRTUAL_NODE_TAINT_KEY.into()),
                    ..Default::default()
                }]);
            }
            p
        };
        let pods = vec![
            pod("missed", None, false),
            pod("placed", None, true),
            pod("running", Some("n1"), false),
        ];
        assert_eq!(
            unplaced(&pods, PodOffloadingStrategy::LocalAndRemote),
            vec!["missed".to_string()]
        );
        // Remote: a pod running at the origin is misplaced too.
        assert_eq!(
            unplaced(&pods, PodOffloadingStrategy::Remote),
            vec!["missed".to_string(), "running".to_string()]
        );
    }
}
