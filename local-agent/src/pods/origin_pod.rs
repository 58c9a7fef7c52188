//! An origin pod as the local agent keeps it in memory.
//!
//! The agent's pod store holds every pod bound to its virtual node, so what it keeps of each
//! is most of its memory per offloaded pod. k8s-openapi's `Pod` is wide: a `Container` is
//! about 2 KB before any of its strings, a `ContainerStatus` 750 bytes, and a running pod
//! deserialized whole (no managedFields) held 7.7 KB in a heap profile of the agent. The spec
//! is read only to forge the pod's ShadowPod and its token Secret, the status only to judge
//! what the provider's next status changes and where a pod stands: each is kept as the
//! compact JSON text the API server sent, and built into its type when one of those readers
//! asks ([`OriginPod::pod`], [`OriginPod::status`]).

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What the local agent keeps of an origin pod, decoded from the pod's JSON.
#[derive(Debug, Clone, Deserialize)]
pub struct OriginPod {
    /// The pod's metadata, without its managedFields (no reader uses them).
    #[serde(deserialize_with = "refract_shared::stored::metadata_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Box<RawValue>>,
    #[serde(default)]
    status: Option<Box<RawValue>>,
}

fn read<T: serde::de::DeserializeOwned>(text: Option<&RawValue>) -> serde_json::Result<Option<T>> {
    text.map(|t| serde_json::from_str(t.get())).transpose()
}

impl OriginPod {
    /// The whole pod again (without managedFields), for the forge. An error is not expected:
    /// the text is what the API server sent for a Pod.
    pub fn pod(&self) -> serde_json::Result<Pod> {
        Ok(Pod {
            metadata: self.metadata.clone(),
            spec: read::<PodSpec>(self.spec.as_deref())?,
            status: read::<PodStatus>(self.status.as_deref())?,
        })
    }

    /// The pod's status; `None` when it has none, or (not expected) its text does not read.
    pub fn status(&self) -> Option<PodStatus> {
        read(self.status.as_deref()).ok().flatten()
    }
}

// An `OriginPod` is a Pod to the watch machinery (stores, object references): its identity is
// the pod's.
refract_shared::resource_as!(OriginPod, Pod);

#[cfg(test)]
mod tests {
    use kube::{Resource, ResourceExt};

    use super::*;

    #[test]
    fn a_pod_decodes_as_kept_and_reads_back_whole_less_its_managed_fields() {
        let json = r#"{"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"web","namespace":"ns","uid":"u-1","resourceVersion":"7",
              "labels":{"app":"web"},
              "managedFields":[{"manager":"kubelet","operation":"Update"}]},
            "spec":{"nodeName":"vk","containers":[{"name":"c","image":"nginx"}]},
            "status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#;
        let kept: OriginPod = serde_json::from_str(json).unwrap();
        assert_eq!(kept.name_any(), "web");
        assert_eq!(kept.metadata.managed_fields, None, "dropped as it is read");
        assert_eq!(kept.labels()["app"], "web");

        let mut whole: Pod = serde_json::from_str(json).unwrap();
        whole.metadata.managed_fields = None;
        assert_eq!(kept.pod().unwrap(), whole);
        assert_eq!(kept.status(), whole.status);
        assert_eq!(kept.object_ref(&()), whole.object_ref(&()));
    }

    #[test]
    fn a_pod_without_spec_or_status_reads_back_without_them() {
        let kept: OriginPod =
            serde_json::from_str(r#"{"metadata":{"name":"web","namespace":"ns"}}"#).unwrap();
        let pod = kept.pod().unwrap();
        assert_eq!((pod.spec, pod.status), (None, None));
        assert_eq!(kept.status(), None);
    }

    #[test]
    fn a_status_that_does_not_read_is_an_error_not_a_pod_without_status() {
        let kept: OriginPod = serde_json::from_str(
            r#"{"metadata":{"name":"web"},"status":{"phase":["not","a","string"]}}"#,
        )
        .unwrap();
        assert!(kept.pod().is_err());
        assert_eq!(kept.status(), None);
    }
}
