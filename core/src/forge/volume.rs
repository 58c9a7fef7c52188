//! PersistentVolumes: the storage fabric's second half, from the provider back to the origin.
//!
//! The provider's PV for a reflected claim comes back as an origin PV that is pre-bound to the
//! origin claim and pinned to the virtual node by node affinity: the origin's PV controller
//! binds the claim, and every later pod mounting it is scheduled onto the same virtual node,
//! hence offloaded to the provider that holds the data. The origin cannot reach the provider's
//! volume source, so the origin PV carries the provider's capacity, reclaim policy and mount
//! options with a placeholder source no origin kubelet ever mounts (nothing runs on a virtual
//! node), and names the provider's volume in an annotation.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ForgeError;
use crate::keys::{
    DESTINATION_LABEL, ORIGIN_LABEL, PROVISIONED_BY_ANNOTATION, REMOTE_VOLUME_ANNOTATION,
};
use crate::options::ReflectionOptions;

/// The provisioner of the virtual storage class (Liqo's name).
pub const VIRTUAL_PROVISIONER: &str = "liqo.io/storage";
/// Where the placeholder source points; never mounted.
const PLACEHOLDER_ROOT: &str = "/var/lib/refract/remote-volumes";

/// The origin PV's name for `claim`: derived from the origin claim's UID, never from anything
/// the provider says, so a provider cannot make the agent overwrite another PV.
pub fn origin_volume_name(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.metadata.uid.as_ref().map(|uid| format!("pvc-{uid}"))
}

/// The origin PV standing for `remote` (the provider's PV of the reflected `claim`).
pub fn origin_volume(
    remote: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    options: &ReflectionOptions,
) -> Result<PersistentVolume, ForgeError> {
    let name = origin_volume_name(claim).ok_or(ForgeError::Unnamed("PersistentVolumeClaim"))?;
    let claim_spec = claim.spec.clone().unwrap_or_default();
    let remote_spec = remote.spec.clone().unwrap_or_default();
    let remote_name = remote.metadata.name.clone().unwrap_or_default();
    // What the claim asked for, when the provider does not say what it provisioned.
    let capacity = remote_spec.capacity.clone().or_else(|| {
        claim_spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone())
            .map(|r| r.into_iter().filter(|(k, _)| k == "storage").collect())
    });
    let labels = BTreeMap::from([
        (ORIGIN_LABEL.to_string(), options.local_cluster_id.clone()),
        (
            DESTINATION_LABEL.to_string(),
            options.remote_cluster_id.clone(),
        ),
    ]);
    let annotations = BTreeMap::from([
        (
            PROVISIONED_BY_ANNOTATION.to_string(),
            VIRTUAL_PROVISIONER.to_string(),
        ),
        (REMOTE_VOLUME_ANNOTATION.to_string(), remote_name.clone()),
    ]);
    let node = options.virtual_node_name();
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity,
            access_modes: claim_spec.access_modes.clone(),
            volume_mode: claim_spec.volume_mode.clone(),
            storage_class_name: claim_spec.storage_class_name.clone(),
            persistent_volume_reclaim_policy: Some(
                remote_spec
                    .persistent_volume_reclaim_policy
                    .unwrap_or_else(|| "Delete".into()),
            ),
            mount_options: remote_spec.mount_options.clone(),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                ..Default::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![node]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            host_path: Some(HostPathVolumeSource {
                path: format!(
                    "{PLACEHOLDER_ROOT}/{}/{remote_name}",
                    options.remote_cluster_id
                ),
                type_: None,
            }),
            ..Default::default()
        }),
        status: None,
    })
}
