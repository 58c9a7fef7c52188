//! A ShadowPod as the remote agent keeps it in memory.
//!
//! Every offloaded pod is kept twice, as its provider pod ([`super::ProviderPod`]) and as its
//! ShadowPod. The ShadowPod's pod spec is read only when its pod is created, yet k8s-openapi's
//! `PodSpec` is wide (one `Container` is about 2 KB before any of its strings), so deserialized
//! it was the largest part of the ShadowPod store. A [`KeptShadowPod`] keeps the spec as the JSON
//! the API server sent, a fraction of that, and reads it again for the rare create.

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;

use super::projection::{event_of, resource_as};
use crate::shadowpod::{ShadowPod, ShadowPodStatus};

/// What the remote agent keeps of a ShadowPod.
#[derive(Debug, Clone, Default)]
pub struct KeptShadowPod {
    /// The ShadowPod's metadata, without its managedFields (no reader uses them).
    pub metadata: ObjectMeta,
    /// The controller's own status.
    pub status: Option<ShadowPodStatus>,
    /// `spec.pod` as JSON: read only to create the pod ([`KeptShadowPod::pod_spec`]).
    pod_spec_json: Box<[u8]>,
}

impl KeptShadowPod {
    /// What is kept of `shadow`.
    pub fn new(shadow: ShadowPod) -> Self {
        let ShadowPod {
            mut metadata,
            spec,
            status,
        } = shadow;
        metadata.managed_fields = None;
        Self {
            metadata,
            status,
            // A PodSpec always serializes: it was deserialized from JSON a moment ago.
            pod_spec_json: serde_json::to_vec(&spec.pod).unwrap_or_default().into(),
        }
    }

    /// The pod spec, read again from its JSON.
    pub fn pod_spec(&self) -> Result<PodSpec, serde_json::Error> {
        serde_json::from_slice(&self.pod_spec_json)
    }
}

/// The watch's event of a ShadowPod, with the ShadowPod as the store keeps it.
pub fn kept(event: watcher::Event<ShadowPod>) -> watcher::Event<KeptShadowPod> {
    event_of(event, KeptShadowPod::new)
}

// A `KeptShadowPod` is a ShadowPod to the watch machinery and to owner references: its
// identity is the ShadowPod's.
resource_as!(KeptShadowPod, ShadowPod);

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
}
