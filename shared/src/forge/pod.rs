//! Pods: the ShadowPod the provider should hold for a pod bound to the virtual node.
//!
//! The pod spec is copied verbatim except what refers to the origin cluster or would let a
//! tenant reach into the provider's nodes: scheduling constraints are removed (the provider
//! schedules), host namespaces are forced off, the service account is unset and its token not
//! mounted (the origin's token means nothing to the provider's API server), and the
//! virtual-node toleration is dropped so the pod cannot be offloaded again. Anti-affinity
//! presets (`liqo.io/anti-affinity-preset`) add spreading constraints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Pod, PodAffinityTerm, PodAntiAffinity, PodSpec, Volume, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::configmap::{remote_root_ca_name, ROOT_CA_NAME};
use super::meta::{name_of, remote_meta};
use super::{Context, ForgeError};

/// The ShadowPod API version.
pub const SHADOWPOD_API_VERSION: &str = "offloading.refract.io/v1alpha1";
/// The taint every virtual node carries.
pub const VIRTUAL_NODE_TAINT_KEY: &str = "virtual-node.liqo.io/not-allowed";
/// Pod annotation choosing an anti-affinity preset: `propagate`, `soft` or `hard`.
pub const ANTI_AFFINITY_PRESET_ANNOTATION: &str = "liqo.io/anti-affinity-preset";
/// Pod annotation listing the label keys the preset matches on (comma-separated).
pub const ANTI_AFFINITY_LABELS_ANNOTATION: &str = "liqo.io/anti-affinity-labels";
/// ShadowPod label: the origin pod's UID, so status flows back only to that pod.
pub const ORIGIN_UID_LABEL: &str = "offloading.refract.io/origin-uid";
/// ShadowPod label: the virtual node the pod was bound to.
pub const NODE_NAME_LABEL: &str = "offloading.refract.io/nodename";

/// Labels that identify a single pod and would defeat spreading, dropped from preset selectors.
const PER_POD_LABELS: &[&str] = &[
    "controller-revision-hash",
    "pod-template-hash",
    "statefulset.kubernetes.io/pod-name",
];

/// The provider's ShadowPod for `pod`, bound to `virtual_node` in the origin.
pub fn shadow_pod(
    pod: &Pod,
    virtual_node: &str,
    ctx: &Context<'_>,
) -> Result<serde_json::Value, ForgeError> {
    let name = name_of(&pod.metadata, "Pod")?;
    let mut meta = remote_meta(&pod.metadata, name, ctx);
    let labels = meta.labels.get_or_insert_with(Default::default);
    labels.insert(NODE_NAME_LABEL.into(), virtual_node.into());
    if let Some(uid) = &pod.metadata.uid {
        labels.insert(ORIGIN_UID_LABEL.into(), uid.clone());
    }
    let spec = pod
        .spec
        .as_ref()
        .map(|s| remote_pod_spec(s, pod, virtual_node, ctx));
    let mut object = serde_json::json!({
        "apiVersion": SHADOWPOD_API_VERSION,
        "kind": "ShadowPod",
        "metadata": meta,
        "spec": {"pod": spec},
    });
    // Keep the envelope tidy: no nulls for absent metadata.
    if let Some(m) = object["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    Ok(object)
}

fn remote_pod_spec(local: &PodSpec, pod: &Pod, virtual_node: &str, ctx: &Context<'_>) -> PodSpec {
    PodSpec {
        containers: local.containers.clone(),
        init_containers: local.init_containers.clone(),
        volumes: local.volumes.as_ref().map(|v| remote_volumes(v, ctx)),
        active_deadline_seconds: local.active_deadline_seconds,
        dns_config: local.dns_config.clone(),
        dns_policy: local.dns_policy.clone(),
        enable_service_links: local.enable_service_links,
        host_aliases: local.host_aliases.clone(),
        hostname: local.hostname.clone(),
        image_pull_secrets: local.image_pull_secrets.clone(),
        readiness_gates: local.readiness_gates.clone(),
        restart_policy: local.restart_policy.clone(),
        security_context: local.security_context.clone(),
        set_hostname_as_fqdn: local.set_hostname_as_fqdn,
        share_process_namespace: local.share_process_namespace,
        subdomain: local.subdomain.clone(),
        termination_grace_period_seconds: local.termination_grace_period_seconds,
        topology_spread_constraints: local.topology_spread_constraints.clone(),
        tolerations: local.tolerations.as_ref().map(|t| {
            t.iter()
                .filter(|t| t.key.as_deref() != Some(VIRTUAL_NODE_TAINT_KEY))
                .cloned()
                .collect()
        }),
        // The origin's service account and token mean nothing to the provider's API server.
        service_account_name: None,
        automount_service_account_token: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        affinity: anti_affinity(pod, virtual_node, ctx),
        ..Default::default()
    }
}

/// Volumes as the provider can satisfy them: the origin's root CA ConfigMap under its reflected
/// name, and no projected service-account token.
fn remote_volumes(volumes: &[Volume], ctx: &Context<'_>) -> Vec<Volume> {
    volumes
        .iter()
        .cloned()
        .map(|mut v| {
            if let Some(projected) = v.projected.as_mut() {
                if let Some(sources) = projected.sources.as_mut() {
                    sources.retain(|s| s.service_account_token.is_none());
                    for s in sources.iter_mut() {
                        if let Some(cm) = s.config_map.as_mut() {
                            if cm.name == ROOT_CA_NAME {
                                cm.name = remote_root_ca_name(&ctx.options.local_cluster_id);
                            }
                        }
                    }
                }
            }
            if let Some(cm) = v.config_map.as_mut() {
                if cm.name == ROOT_CA_NAME {
                    cm.name = remote_root_ca_name(&ctx.options.local_cluster_id);
                }
            }
            v
        })
        .collect()
}

fn anti_affinity(pod: &Pod, virtual_node: &str, ctx: &Context<'_>) -> Option<Affinity> {
    let annotations = pod.metadata.annotations.as_ref();
    let preset = annotations.and_then(|a| a.get(ANTI_AFFINITY_PRESET_ANNOTATION))?;
    let selector = || {
        let mut labels: BTreeMap<String, String> = pod
            .metadata
            .labels
            .iter()
            .flatten()
            .filter(|(k, _)| !ctx.options.skip_labels.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(NODE_NAME_LABEL.into(), virtual_node.into());
        match annotations.and_then(|a| a.get(ANTI_AFFINITY_LABELS_ANNOTATION)) {
            Some(keep) => {
                let keep: Vec<&str> = keep.split(',').collect();
                labels.retain(|k, _| keep.contains(&k.as_str()));
            }
            None => labels.retain(|k, _| !PER_POD_LABELS.contains(&k.as_str())),
        }
        PodAffinityTerm {
            topology_key: "kubernetes.io/hostname".into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(labels),
                match_expressions: None,
            }),
            ..Default::default()
        }
    };
    let anti = match preset.as_str() {
        "propagate" => pod
            .spec
            .as_ref()?
            .affinity
            .as_ref()?
            .pod_anti_affinity
            .clone()?,
        "soft" => PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 1,
                    pod_affinity_term: selector(),
                },
            ]),
            ..Default::default()
        },
        "hard" => PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![selector()]),
            ..Default::default()
        },
        _ => return None,
    };
    Some(Affinity {
        pod_anti_affinity: Some(anti),
        ..Default::default()
    })
}
