//! PersistentVolumeClaims of the virtual storage class: the storage fabric's first half.
//!
//! A claim of the virtual class (`liqo` by default) is reflected once the scheduler has chosen
//! the virtual node for its first consumer (annotation `volume.kubernetes.io/selected-node`):
//! the provider then provisions it with the storage class configured for the peering. The
//! claim travels as its intent (access modes, volume mode, requested resources); binding
//! bookkeeping of the origin's PV controller stays home. A claim of any other class, or one
//! whose consumer landed on another node, is never reflected.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};

use super::meta::{name_of, remote_meta};
use super::{reflect, skip, Context, Decision, ForgeError};
use crate::keys::{
    REMOTE_ACCESS_MODES_ANNOTATION, REMOTE_STORAGE_CLASS_ANNOTATION, SELECTED_NODE_ANNOTATION,
};
use crate::options::Kind;

/// Binding bookkeeping written by the origin's controllers: meaningless on the provider, and it
/// would make the provider's PV controller believe the claim is already being handled.
const BINDING_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
    SELECTED_NODE_ANNOTATION,
    "volume.beta.kubernetes.io/storage-class",
];

const ACCESS_MODES: &[&str] = &[
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// Forges the provider's claim, or says why the claim stays home.
pub fn forge(claim: &PersistentVolumeClaim, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
    let name = name_of(&claim.metadata, "PersistentVolumeClaim")?;
    let storage = &ctx.options.storage;
    let spec = claim.spec.clone().unwrap_or_default();
    let class = spec.storage_class_name.as_deref().unwrap_or_default();
    if class != storage.virtual_storage_class {
        return Ok(skip(format!(
            "storage class {class:?} is not the virtual storage class {:?}",
            storage.virtual_storage_class
        )));
    }
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    let node = ctx.options.virtual_node_name();
    // Once bound to the PV this agent made for it, the claim stays reflected whatever happens
    // to the scheduler's annotation: un-reflecting it would delete the provider's volume.
    let bound_here =
        spec.volume_name.is_some() && spec.volume_name == super::volume::origin_volume_name(claim);
    match annotations.get(SELECTED_NODE_ANNOTATION) {
        _ if bound_here => {}
        Some(selected) if *selected == node => {}
        Some(selected) => {
            return Ok(skip(format!(
            "its first consumer was scheduled on node {selected:?}, not on virtual node {node:?}"
        )))
        }
        None => {
            return Ok(skip(format!(
                "no consumer scheduled yet (annotation {SELECTED_NODE_ANNOTATION} is not set)"
            )))
        }
    }
    let access_modes = match annotations.get(REMOTE_ACCESS_MODES_ANNOTATION) {
        Some(list) => Some(parse_access_modes(list)?),
        None => spec.access_modes.clone(),
    };
    let storage_class_name = annotations
        .get(REMOTE_STORAGE_CLASS_ANNOTATION)
        .filter(|c| !c.is_empty())
        .cloned()
        .or_else(|| storage.remote_storage_class.clone());
    let mut meta = remote_meta(&claim.metadata, name, ctx);
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| !BINDING_ANNOTATIONS.contains(&k.as_str()));
    }
    if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        meta.annotations = None;
    }
    let out = PersistentVolumeClaim {
        metadata: meta,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes,
            resources: spec.resources.clone(),
            volume_mode: Some(spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
            storage_class_name,
            ..Default::default()
        }),
        status: None,
    };
    Ok(reflect(
        Kind::PersistentVolumeClaim,
        ctx.remote_namespace,
        name,
        &out,
    ))
}

fn parse_access_modes(list: &str) -> Result<Vec<String>, ForgeError> {
    list.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| {
            if ACCESS_MODES.contains(&m) {
                Ok(m.to_string())
            } else {
                Err(ForgeError::Annotations(format!(
                    "{REMOTE_ACCESS_MODES_ANNOTATION}: {m:?} is not an access mode (one of {})",
                    ACCESS_MODES.join(", ")
                )))
            }
        })
        .collect()
}
