//! A ShadowPod as the remote agent keeps it in memory.
//!
//! Every offloaded pod is kept twice, as its provider pod ([`super::ProviderPod`]) and as its
//! ShadowPod. The ShadowPod's pod spec is read only when its pod is created, yet k8s-openapi's
//! `PodSpec` is wide (one `Container` is about 2 KB before any of its strings), so deserialized
//! it was the largest part of the ShadowPod store. The watch decodes each ShadowPod straight
//! into a [`WatchedShadowPod`], which keeps the spec as the JSON text the API server sent: the
//! wide `PodSpec` is built only for the rare create, not for every status write's event. The
//! store keeps a [`KeptShadowPod`] of it, with the metadata as [`KeptMeta`].

use k8s_openapi::api::core::v1::{ObjectReference, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::watcher;
use kube::Resource;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::kept_meta::KeptMeta;
use super::projection::event_of;
use crate::shadowpod::{ShadowPod, ShadowPodStatus};

/// A ShadowPod as its watch decodes it, for the tenant objects' store it feeds and for
/// [`KeptShadowPod`].
#[derive(Debug, Clone, Deserialize)]
pub struct WatchedShadowPod {
    /// The ShadowPod's metadata, without its managedFields (no reader uses them).
    #[serde(deserialize_with = "refract_shared::stored::metadata_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    status: Option<ShadowPodStatus>,
    spec: KeptSpec,
}

// A `WatchedShadowPod` is a ShadowPod to the watch: its identity is the ShadowPod's.
refract_shared::resource_as!(WatchedShadowPod, ShadowPod);

/// What the remote agent keeps of a ShadowPod.
#[derive(Debug, Clone)]
pub struct KeptShadowPod {
    meta: KeptMeta,
    /// The controller's own status.
    pub status: Option<ShadowPodStatus>,
    spec: KeptSpec,
}

// A `KeptShadowPod` is a ShadowPod to its store: its identity is the ShadowPod's.
super::kept_meta::lookup_as!(KeptShadowPod, ShadowPod);

impl From<WatchedShadowPod> for KeptShadowPod {
    fn from(shadow: WatchedShadowPod) -> Self {
        Self {
            meta: KeptMeta::of(shadow.metadata),
            status: shadow.status,
            spec: shadow.spec,
        }
    }
}

/// The watch's event of a ShadowPod, with the ShadowPod as the store keeps it.
pub fn kept(event: watcher::Event<WatchedShadowPod>) -> watcher::Event<KeptShadowPod> {
    event_of(event, KeptShadowPod::from)
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
        let watched: WatchedShadowPod =
            serde_json::from_slice(&json).expect("and reads back as what is kept of it");
        watched.into()
    }

    /// What is kept of the ShadowPod's metadata.
    pub fn meta(&self) -> &KeptMeta {
        &self.meta
    }

    /// The reference that makes the ShadowPod its pod's controlling owner; `None` for one the
    /// API server has not given a uid.
    pub fn controller_owner_ref(&self) -> Option<OwnerReference> {
        Some(OwnerReference {
            api_version: ShadowPod::api_version(&()).into_owned(),
            kind: ShadowPod::kind(&()).into_owned(),
            name: self.meta.name().to_string(),
            uid: self.meta.uid()?.to_string(),
            controller: Some(true),
            ..Default::default()
        })
    }

    /// The reference an event about the ShadowPod names it by.
    pub fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(ShadowPod::api_version(&()).into_owned()),
            kind: Some(ShadowPod::kind(&()).into_owned()),
            name: Some(self.meta.name().into()),
            namespace: Some(self.meta.namespace().into()),
            uid: self.meta.uid().map(Into::into),
            resource_version: self.meta.resource_version().map(Into::into),
            ..Default::default()
        }
    }

    /// The pod spec, read from its JSON.
    pub fn pod_spec(&self) -> Result<PodSpec, serde_json::Error> {
        serde_json::from_str(self.spec.pod.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shadowpod::ShadowPodSpec;
    use k8s_openapi::api::core::v1::Container;
    use kube::runtime::reflector::{Lookup, ObjectRef};
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
        assert_eq!(
            kept.controller_owner_ref(),
            original.controller_owner_ref(&())
        );
        assert_eq!(kept.to_object_ref(()), ObjectRef::new("web").within("ns"));
        assert_eq!(kept.object_reference(), original.object_ref(&()));
    }

    #[test]
    fn a_watch_event_s_object_decodes_as_kept_without_status_or_managed_fields() {
        let json = r#"{"apiVersion":"offloading.refract.io/v1alpha1","kind":"ShadowPod",
            "metadata":{"name":"web","namespace":"ns","uid":"u-1","resourceVersion":"7",
              "managedFields":[{"manager":"remote-agent","operation":"Apply"}]},
            "spec":{"pod":{"containers":[{"name":"c","image":"nginx"}],"nodeName":"n1"}}}"#;
        let watched: WatchedShadowPod = serde_json::from_str(json).unwrap();
        assert_eq!(
            watched.metadata.managed_fields, None,
            "dropped as it is read"
        );
        let kept = KeptShadowPod::from(watched);
        assert_eq!(kept.meta().name(), "web");
        assert_eq!(kept.meta().resource_version(), Some("7"));
        assert_eq!(kept.status, None);
        let spec = kept.pod_spec().unwrap();
        assert_eq!(spec.containers[0].image.as_deref(), Some("nginx"));
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
    }
}
