//! A ShadowPod as the remote agent keeps it in memory.
//!
//! Every offloaded pod is kept twice, as its provider pod ([`super::ProviderPod`]) and as its
//! ShadowPod. The ShadowPod's pod spec is read only when its pod is created, yet k8s-openapi's
//! `PodSpec` is wide (one `Container` is about 2 KB before any of its strings), so deserialized
//! it was the largest part of the ShadowPod store. The watch decodes each ShadowPod straight
//! into a [`KeptShadowPod`], which keeps the spec as the JSON text the API server sent: the
//! wide `PodSpec` is built only for the rare create, not for every status write's event.

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::shadowpod::{ShadowPod, ShadowPodStatus};

/// What the remote agent keeps of a ShadowPod, decoded from the ShadowPod's JSON.
#[derive(Debug, Clone, Deserialize)]
pub struct KeptShadowPod {
    /// The ShadowPod's metadata, without its managedFields (no reader uses them).
    #[serde(deserialize_with = "refract_shared::stored::metadata_without_managed_fields")]
    pub metadata: ObjectMeta,
    /// The controller's own status.
    #[serde(default)]
    pub status: Option<ShadowPodStatus>,
    spec: KeptSpec,
}

/// `spec`, with `spec.pod` as the JSON text it came in: read only to create the pod
/// ([`KeptShadowPod::pod_spec`]).
#[derive(Debug, Clone, Deserialize)]
struct KeptSpec {
    pod: Box<RawValue>,
}

impl KeptShadowPod {
    /// What is kept of `shadow`, as the watch would decode it.
    #[cfg(test)]
    pub fn new(shadow: ShadowPod) -> Self {
        let json = serde_json::to_vec(&shadow).expect("a ShadowPod serializes");
        serde_json::from_slice(&json).expect("and reads back as what is kept of it")
    }

    /// The pod spec, read from its JSON.
    pub fn pod_spec(&self) -> Result<PodSpec, serde_json::Error> {
        serde_json::from_str(self.spec.pod.get())
    }
}

// A `KeptShadowPod` is a ShadowPod to the watch machinery and to owner references: its
// identity is the ShadowPod's.
refract_shared::resource_as!(KeptShadowPod, ShadowPod);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shadowpod::ShadowPodSpec;
    use k8s_openapi::api::core::v1::Container;
    use kube::Resource;

    fn shadow() -> ShadowPod {
        let mut shadow = ShadowPod::new(
            "web",
            ShadowPodSpec {
                pod: PodSpec {
                    containers: vec![Container {
                        name: "c".into(),
                        image: Some("nginx".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            },
        );
        shadow.metadata.namespace = Some("ns".into());
        shadow.metadata.uid = Some("u-1".into());
        shadow.metadata.managed_fields = Some(vec![Default::default()]);
        shadow.status = Some(ShadowPodStatus {
            recreations: 2,
            ..Default::default()
        });
        shadow
    }

    #[test]
    fn the_spec_comes_back_whole_and_the_identity_stays() {
        let original = shadow();
        let kept = KeptShadowPod::new(original.clone());
        assert_eq!(kept.pod_spec().unwrap(), original.spec.pod);
        assert_eq!(kept.status, original.status);
        assert_eq!(kept.metadata.managed_fields, None);
        assert_eq!(
            kept.controller_owner_ref(&()),
            original.controller_owner_ref(&())
        );
        assert_eq!(kept.object_ref(&()), original.object_ref(&()));
    }

    #[test]
    fn a_watch_event_s_object_decodes_as_kept_without_status_or_managed_fields() {
        let json = r#"{"apiVersion":"offloading.refract.io/v1alpha1","kind":"ShadowPod",
            "metadata":{"name":"web","namespace":"ns","uid":"u-1","resourceVersion":"7",
              "managedFields":[{"manager":"remote-agent","operation":"Apply"}]},
            "spec":{"pod":{"containers":[{"name":"c","image":"nginx"}],"nodeName":"n1"}}}"#;
        let kept: KeptShadowPod = serde_json::from_str(json).unwrap();
        assert_eq!(kept.metadata.name.as_deref(), Some("web"));
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(kept.metadata.managed_fields, None, "dropped as it is read");
        assert_eq!(kept.status, None);
        let spec = kept.pod_spec().unwrap();
        assert_eq!(spec.containers[0].image.as_deref(), Some("nginx"));
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
    }
}
