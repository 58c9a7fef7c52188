//! The `NamespaceOffloading` custom resource: which namespaces are extended, and how.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use kube::CustomResource;
use refract_shared::offloading::MappingStrategy;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The only name a NamespaceOffloading may have (one per namespace).
pub const NAME: &str = "offloading";

/// Extends its namespace to the peers its `clusterSelector` selects.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "offloading.refract.io",
    version = "v1alpha1",
    kind = "NamespaceOffloading",
    namespaced,
    status = "NamespaceOffloadingStatus",
    shortname = "nso",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.offloadingPhase"}"#,
    printcolumn = r#"{"name":"Remote namespace","type":"string","jsonPath":".status.remoteNamespaceName"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingSpec {
    /// How the twin namespace is named on the provider.
    #[serde(default)]
    pub namespace_mapping_strategy: MappingStrategy,
    /// The twin namespace's name with `SelectedName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace_name: Option<String>,
    /// Where pods of the namespace may run.
    #[serde(default)]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    /// Which peers (by their virtual node's labels) the namespace is extended to; none selects
    /// all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<NodeSelector>,
}

/// Where pods of an extended namespace may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum PodOffloadingStrategy {
    /// Only in the origin cluster.
    Local,
    /// Only on providers.
    Remote,
    /// Anywhere.
    #[default]
    LocalAndRemote,
}

/// What the local agents made of the NamespaceOffloading.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    /// The twin namespace's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace_name: Option<String>,
    /// `Ready`, `NoClusterSelected`, `InProgress`, `SomeFailed` or `AllFailed`, over every
    /// selected peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloading_phase: Option<String>,
    /// Per provider cluster id: the state of its twin namespace.
    #[serde(default)]
    pub remote_namespaces_conditions: BTreeMap<String, Vec<RemoteNamespaceCondition>>,
}

/// The state of one twin namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteNamespaceCondition {
    /// `OffloadingRequired` or `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// A PascalCase reason.
    pub reason: String,
    /// A sentence for humans (omitted when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The phase of a NamespaceOffloading from every peer's conditions: `NoClusterSelected` when no
/// peer is selected, `Ready` when every selected peer's twin is ready, `AllFailed` when every
/// selected peer's creation failed for good, `SomeFailed` when some did, else `InProgress`.
pub fn phase_of(peers: &BTreeMap<String, Vec<RemoteNamespaceCondition>>) -> &'static str {
    let is = |conds: &[RemoteNamespaceCondition], type_: &str, status: &str| {
        conds.iter().any(|c| c.type_ == type_ && c.status == status)
    };
    let selected: Vec<&Vec<RemoteNamespaceCondition>> = peers
        .values()
        .filter(|c| is(c, "OffloadingRequired", "True"))
        .collect();
    let failed = selected
        .iter()
        .filter(|c| c.iter().any(|c| c.reason == "CreationLoopBackOff"))
        .count();
    match () {
        _ if selected.is_empty() => "NoClusterSelected",
        _ if selected.iter().all(|c| is(c, "Ready", "True")) => "Ready",
        _ if failed == selected.len() => "AllFailed",
        _ if failed > 0 => "SomeFailed",
        _ => "InProgress",
    }
}

/// The CRD as YAML, for `local-agent crd` and `deploy/`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&NamespaceOffloading::crd()).expect("CRD serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_peer(selected: bool, ready: Option<(&str, &str)>) -> Vec<RemoteNamespaceCondition> {
        let mk = |type_: &str, status: &str, reason: &str| RemoteNamespaceCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
        };
        let mut c = vec![mk(
            "OffloadingRequired",
            if selected { "True" } else { "False" },
            "",
        )];
        if let Some((status, reason)) = ready {
            c.push(mk("Ready", status, reason));
        }
        c
    }

    fn phase(peers: &[(&str, Vec<RemoteNamespaceCondition>)]) -> &'static str {
        phase_of(
            &peers
                .iter()
                .map(|(p, c)| (p.to_string(), c.clone()))
                .collect(),
        )
    }

    #[test]
    fn the_phase_speaks_of_every_selected_peer() {
        let ready = || mk_peer(true, Some(("True", "NamespaceCreated")));
        let failed = || mk_peer(true, Some(("False", "CreationLoopBackOff")));
        let creating = || mk_peer(true, Some(("False", "Creating")));
        let unselected = || mk_peer(false, None);
        assert_eq!(phase(&[]), "NoClusterSelected");
        assert_eq!(phase(&[("a", unselected())]), "NoClusterSelected");
        assert_eq!(phase(&[("a", ready()), ("b", unselected())]), "Ready");
        assert_eq!(phase(&[("a", ready()), ("b", ready())]), "Ready");
        assert_eq!(phase(&[("a", ready()), ("b", creating())]), "InProgress");
        assert_eq!(phase(&[("a", ready()), ("b", failed())]), "SomeFailed");
        assert_eq!(phase(&[("a", failed()), ("b", failed())]), "AllFailed");
    }
}
