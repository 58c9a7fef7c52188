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
    /// `Ready`, `NoClusterSelected`, `InProgress` or `AllFailed`.
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

/// The CRD as YAML, for `local-agent crd` and `deploy/`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&NamespaceOffloading::crd()).expect("CRD serializes")
}
