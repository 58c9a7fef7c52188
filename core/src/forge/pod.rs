//! Pods: the ShadowPod the provider should hold for a pod bound to the virtual node.
//!
//! The pod spec is copied verbatim except what refers to the origin cluster or would let a
//! tenant reach into the provider's nodes: scheduling constraints are removed (the provider
//! schedules), host namespaces are forced off, and the virtual-node toleration is dropped so the pod cannot
//! be offloaded again. Anti-affinity presets (`liqo.io/anti-affinity-preset`) add spreading
//! constraints. How the pod reaches an API server (tokens, environment, ServiceAccount) is
//! [`api_server`]'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Pod, PodAffinityTerm, PodAntiAffinity, PodSpec, Toleration, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::meta::{name_of, remote_meta};
use super::{Context, ForgeError};
use crate::keys::{
    ANTI_AFFINITY_LABELS_ANNOTATION, ANTI_AFFINITY_PRESET_ANNOTATION, NODE_NAME_LABEL,
    ORIGIN_FINISHED_ANNOTATION, ORIGIN_UID_LABEL, REMOTE_RUNTIME_CLASS_ANNOTATION,
    VIRTUAL_NODE_TAINT_KEY,
};

mod api_server;

/// The ShadowPod API version.
pub const SHADOWPOD_API_VERSION: &str = "offloading.refract.io/v1alpha1";
/// Liqo's own RuntimeClass: it only steers pods onto virtual nodes, and means nothing on the
/// provider.
pub const LIQO_RUNTIME_CLASS: &str = "liqo";

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
    if let Some(phase) = finished_phase(pod) {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(ORIGIN_FINISHED_ANNOTATION.into(), phase.into());
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

/// The RuntimeClass of the provider pod: the one the origin pod's
/// `liqo.io/remote-runtime-class-name` names, else the origin pod's own unless it is Liqo's,
/// else the offloading patch's unless it is Liqo's, else none (the provider's default).
fn remote_runtime_class(local: &PodSpec, pod: &Pod, ctx: &Context<'_>) -> Option<String> {
    let patched = ctx
        .options
        .offloading_patch
        .runtime_class_name
        .as_ref()
        .filter(|c| !c.is_empty() && c.as_str() != LIQO_RUNTIME_CLASS);
    pod_runtime_class(local, pod).or_else(|| patched.cloned())
}

fn pod_runtime_class(local: &PodSpec, pod: &Pod) -> Option<String> {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REMOTE_RUNTIME_CLASS_ANNOTATION))
        .filter(|c| !c.is_empty());
    let own = local
        .runtime_class_name
        .as_ref()
        .filter(|c| !c.is_empty() && c.as_str() != LIQO_RUNTIME_CLASS);
    annotated.or(own).cloned()
}

/// The phase a pod finished in (`Succeeded` or `Failed`), if it did: such a pod is never run
/// again, wherever it ran.
pub fn finished_phase(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .filter(|phase| matches!(*phase, "Succeeded" | "Failed"))
}

fn remote_pod_spec(local: &PodSpec, pod: &Pod, virtual_node: &str, ctx: &Context<'_>) -> PodSpec {
    let mut spec = PodSpec {
        containers: local.containers.clone(),
        init_containers: local.init_containers.clone(),
        volumes: local.volumes.clone(),
        active_deadline_seconds: local.active_deadline_seconds,
        dns_config: local.dns_config.clone(),
        dns_policy: local.dns_policy.clone(),
        enable_service_links: local.enable_service_links,
        host_aliases: local.host_aliases.clone(),
        hostname: local.hostname.clone(),
        image_pull_secrets: local.image_pull_secrets.clone(),
        readiness_gates: local.readiness_gates.clone(),
        restart_policy: local.restart_policy.clone(),
        runtime_class_name: remote_runtime_class(local, pod, ctx),
        node_selector: patch_node_selector(ctx),
        security_context: local.security_context.clone(),
        set_hostname_as_fqdn: local.set_hostname_as_fqdn,
        share_process_namespace: local.share_process_namespace,
        subdomain: local.subdomain.clone(),
        termination_grace_period_seconds: local.termination_grace_period_seconds,
        topology_spread_constraints: local.topology_spread_constraints.clone(),
        tolerations: remote_tolerations(local, ctx),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        affinity: remote_affinity(pod, virtual_node, ctx),
        ..Default::default()
    };
    api_server::apply(&mut spec, pod, ctx);
    spec
}

/// The offloading patch's node selector (the origin pod's own speaks of origin nodes).
fn patch_node_selector(ctx: &Context<'_>) -> Option<BTreeMap<String, String>> {
    let selector = &ctx.options.offloading_patch.node_selector;
    (!selector.is_empty()).then(|| selector.clone())
}

/// The origin pod's tolerations but the virtual node's, then the offloading patch's.
fn remote_tolerations(local: &PodSpec, ctx: &Context<'_>) -> Option<Vec<Toleration>> {
    let patch = &ctx.options.offloading_patch.tolerations;
    if local.tolerations.is_none() && patch.is_empty() {
        return None;
    }
    let own = local.tolerations.iter().flatten();
    Some(
        own.filter(|t| t.key.as_deref() != Some(VIRTUAL_NODE_TAINT_KEY))
            .chain(patch)
            .cloned()
            .collect(),
    )
}

/// The offloading patch's node affinity with the anti-affinity preset's pod anti-affinity.
/// (Liqo lets a preset replace the patch's node affinity; here both hold.)
fn remote_affinity(pod: &Pod, virtual_node: &str, ctx: &Context<'_>) -> Option<Affinity> {
    let node_affinity = ctx
        .options
        .offloading_patch
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.clone());
    let pod_anti_affinity = anti_affinity(pod, virtual_node, ctx).and_then(|a| a.pod_anti_affinity);
    (node_affinity.is_some() || pod_anti_affinity.is_some()).then(|| Affinity {
        node_affinity,
        pod_anti_affinity,
        ..Default::default()
    })
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
