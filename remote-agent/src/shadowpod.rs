//! The `ShadowPod` custom resource: a pod the provider keeps running for a tenant.

use k8s_openapi::api::core::v1::PodSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A pod the remote agent keeps alive for a tenant, whether or not the tenant is connected.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "offloading.refract.io",
    version = "v1alpha1",
    kind = "ShadowPod",
    namespaced,
    status = "ShadowPodStatus",
    shortname = "shpod",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Recreations","type":"integer","jsonPath":".status.recreations"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodSpec {
    /// The pod to run.
    #[schemars(schema_with = "preserve_unknown")]
    pub pod: PodSpec,
}

/// What happened to the shadowed pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodStatus {
    /// The pod's phase, mirrored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// How many times the pod was re-created after being deleted.
    #[serde(default)]
    pub recreations: u32,
    /// The UID of the current pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Why the pod could not be created, while it cannot (`FailedCreate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the provider's API server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// [`ShadowPodStatus::reason`] while the provider cannot create the pod.
pub const FAILED_CREATE: &str = "FailedCreate";

/// The PodSpec schema is large and validated by the API server when the pod is created; the
/// CRD keeps it as an object.
fn preserve_unknown(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// The CRD as YAML, for `remote-agent crd` and `deploy/`.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&ShadowPod::crd())
}
