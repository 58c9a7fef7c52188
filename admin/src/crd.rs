//! The `NamespaceOffloading` custom resource: which namespaces are extended, and how.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use refract_core::offloading::MappingStrategy;
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
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Remote namespace","type":"string","jsonPath":".status.remoteNamespaceName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
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
    /// Standard conditions over every selected peer: `Ready` (so `kubectl wait
    /// --for=condition=Ready nso/offloading` works), with the phase as its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
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

/// The standard `Ready` condition of `phase` (see [`phase_of`]) for generation `generation`:
/// `True` only when the phase is `Ready`. Its transition time is `previous`'s while the status
/// stays the same (so every agent writes the same condition), else `now`.
pub fn ready_condition(
    phase: &str,
    previous: &[Condition],
    generation: Option<i64>,
    now: Time,
) -> Condition {
    let status = if phase == "Ready" { "True" } else { "False" };
    let message = match phase {
        "Ready" => "the namespace is extended to every selected peer",
        "NoClusterSelected" => "the clusterSelector selects no peer",
        "SomeFailed" => {
            "some selected peers refused the twin namespace; see remoteNamespacesConditions"
        }
        "AllFailed" => {
            "every selected peer refused the twin namespace; see remoteNamespacesConditions"
        }
        _ => "twin namespaces are being created",
    };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(now);
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: phase.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// The CRD as YAML, for `local-agent crd` and `deploy/`.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&NamespaceOffloading::crd())
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

    #[test]
    fn the_ready_condition_keeps_its_transition_time_while_its_status_holds() {
        let t = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let first = ready_condition("InProgress", &[], Some(1), t(100));
        assert_eq!(
            (first.status.as_str(), first.reason.as_str()),
            ("False", "InProgress")
        );
        let later = ready_condition("SomeFailed", &[first], Some(2), t(200));
        assert_eq!(later.last_transition_time, t(100), "still False");
        assert_eq!(later.observed_generation, Some(2));
        let ready = ready_condition("Ready", &[later], Some(2), t(300));
        assert_eq!(
            (ready.status.as_str(), ready.last_transition_time.clone()),
            ("True", t(300))
        );
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
