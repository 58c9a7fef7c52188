//! A provider pod as the remote agent keeps it in memory.
//!
//! The agent watches every pod of the provider (capacity counts them all), so what it keeps of
//! each pod is most of its memory. k8s-openapi's `Pod` is wide: one `Container` is about 2 KB
//! before any of its strings, and a running pod deserialized whole holds about 10 KB without
//! its managedFields. The store keeps a [`ProviderPod`] instead: of the metadata and the rest
//! only what the store's readers use (the ShadowPod controller, the status stream, capacity,
//! pod statistics), each taken out once as the watch hands the pod over.

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::runtime::watcher;
use refract_core::keys::MANAGED_BY_LABEL;

use super::kept_meta::KeptMeta;
use super::metadata::{owned_keys, Owned};
use super::projection::event_of;
use super::MANAGED_BY_SHADOWPOD;
use crate::capacity::requests;

/// What the remote agent keeps of a provider pod.
#[derive(Debug, Clone, Default)]
pub struct ProviderPod {
    /// What is read of the pod's metadata.
    meta: KeptMeta,
    /// The label and annotation keys the ShadowPod controller owns on the pod (read from its
    /// managedFields): its metadata patch removes only these.
    pub owned: Owned,
    /// The node the pod is bound to.
    pub node_name: Option<String>,
    /// The pod's phase.
    pub phase: Option<String>,
    /// The pod's effective requests in milli-units, per resource (see [`requests`]).
    pub requests: Box<[(String, i128)]>,
    /// For a pod of a ShadowPod, its status as JSON, as it goes to the origin (the outbox
    /// shares these bytes rather than copy them); empty for the provider's other pods, whose
    /// status no reader uses.
    status_json: Bytes,
}

impl ProviderPod {
    /// What is kept of `pod`.
    pub fn new(pod: Pod) -> Self {
        let Pod {
            metadata,
            spec,
            status,
        } = pod;
        let owned = owned_keys(&metadata);
        let requests = spec
            .as_ref()
            .map(|spec| requests(spec).into_iter().collect())
            .unwrap_or_default();
        let mut kept = Self {
            meta: KeptMeta::of(metadata),
            owned,
            node_name: spec.and_then(|s| s.node_name),
            phase: status.as_ref().and_then(|s| s.phase.clone()),
            requests,
            status_json: Bytes::new(),
        };
        if kept.of_shadowpod() {
            // Through a boxed slice: that drops the capacity the serializer grew beyond the
            // text, which a `Bytes` made straight from the `Vec` would keep.
            let json = serde_json::to_vec(&status).unwrap_or_default();
            kept.status_json = Bytes::from(json.into_boxed_slice());
        }
        kept
    }

    /// What is kept of the pod's metadata.
    pub fn meta(&self) -> &KeptMeta {
        &self.meta
    }

    /// Whether the pod was created by the controller from a ShadowPod.
    pub fn of_shadowpod(&self) -> bool {
        self.meta.label(MANAGED_BY_LABEL) == Some(MANAGED_BY_SHADOWPOD)
    }

    /// The status as JSON (`null` when the pod has none); empty when the pod is not a
    /// ShadowPod's.
    pub fn status_json(&self) -> &Bytes {
        &self.status_json
    }

    /// The status, read again from its JSON: for the rare reader that needs a field of it
    /// beyond the phase. `None` when the pod has none or is not a ShadowPod's.
    pub fn status(&self) -> Option<PodStatus> {
        serde_json::from_slice(&self.status_json).ok().flatten()
    }
}

/// The watch's event of a pod, with the pod as the store keeps it.
pub fn kept(event: watcher::Event<Pod>) -> watcher::Event<ProviderPod> {
    event_of(event, ProviderPod::new)
}

// A `ProviderPod` is a Pod to the watch machinery (stores, object references): its identity
// is the pod's.
super::kept_meta::lookup_as!(ProviderPod, Pod);

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::{Lookup, ObjectRef};
    use serde_json::json;

    use super::*;
    use crate::shadowpod_controller::MANAGED_BY_SHADOWPOD;

    fn running(labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": labels,
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                    "fieldsV1": {"f:status": {"f:phase": {}}}}]},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "a", "image": "x", "resources": {"requests": {"cpu": "250m"}}},
                {"name": "b", "image": "y", "resources": {"requests": {"cpu": "1", "memory": "1Ki"}}}]},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"},
        }))
        .unwrap()
    }

    #[test]
    fn a_shadowpods_pod_keeps_what_its_readers_use() {
        let pod = ProviderPod::new(running(
            json!({MANAGED_BY_LABEL: MANAGED_BY_SHADOWPOD, "app": "web"}),
        ));
        assert_eq!(pod.meta().name(), "web");
        assert_eq!(pod.meta().uid(), Some("u1"));
        assert_eq!(pod.meta().label("app"), Some("web"));
        assert!(pod.of_shadowpod());
        assert_eq!(
            pod.to_object_ref(()),
            ObjectRef::new("web").within("ns"),
            "found under the pod's own name"
        );
        assert_eq!(pod.node_name.as_deref(), Some("n1"));
        assert_eq!(pod.phase.as_deref(), Some("Running"));
        assert_eq!(
            &*pod.requests,
            [("cpu".to_string(), 1250), ("memory".to_string(), 1_024_000)]
        );
        let status: serde_json::Value = serde_json::from_slice(pod.status_json()).unwrap();
        assert_eq!(
            status,
            json!({"phase": "Running", "startTime": "2026-01-01T00:00:00Z"})
        );
        assert!(pod.status().and_then(|s| s.start_time).is_some());
    }

    #[test]
    fn another_pod_keeps_no_status_but_its_phase() {
        let pod = ProviderPod::new(running(json!({"app": "web"})));
        assert!(!pod.of_shadowpod());
        assert!(pod.status_json().is_empty());
        assert_eq!(pod.status(), None);
        assert_eq!(pod.phase.as_deref(), Some("Running"));
    }
}
