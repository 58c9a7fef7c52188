//! Where a tenant's pod may ask to run: only through node labels the policy lets it select
//! (`nodeSelector`, node affinity, and the topology keys of pod affinity and spread
//! constraints), next to or away from its own pods only (pod affinity never names another
//! namespace), and by the provider's default scheduler. A tenant that could select any label
//! would pick the provider's control-plane or dedicated nodes; one whose pod affinity named
//! other namespaces would learn where other tenants' pods run.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, PodAffinityTerm, PodSpec};

use super::{TenantPolicy, Violation};

/// Node label keys tenants' pods may select by default: the well-known topology and platform
/// labels, which every cluster sets the same way and which single out no node role.
pub const DEFAULT_NODE_LABEL_KEYS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// The scheduler every tenant pod is placed by.
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Checks the pod's scheduling constraints against `policy`.
pub(super) fn check(spec: &PodSpec, policy: &TenantPolicy) -> Result<(), Violation> {
    if let Some(name) = spec.scheduler_name.as_deref() {
        if !name.is_empty() && name != DEFAULT_SCHEDULER {
            return Err(Violation::new(
                "spec.schedulerName",
                format!("only the provider's {DEFAULT_SCHEDULER} places tenant pods, not {name:?}"),
            ));
        }
    }
    let keys = &policy.node_label_keys;
    for key in spec.node_selector.iter().flatten().map(|(k, _)| k) {
        selectable(key, keys, "spec.nodeSelector")?;
    }
    let affinity = spec.affinity.as_ref();
    let node = affinity.and_then(|a| a.node_affinity.as_ref());
    let required = node
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let preferred = node
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .map(|p| &p.preference);
    for term in required.iter().chain(preferred) {
        node_term(term, keys)?;
    }
    let pod_terms = affinity
        .into_iter()
        .flat_map(|a| {
            let pod = a.pod_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            });
            let anti = a.pod_anti_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            });
            pod.into_iter().chain(anti)
        })
        .flat_map(|(required, preferred)| {
            let preferred = preferred.iter().flatten().map(|w| &w.pod_affinity_term);
            required.iter().flatten().chain(preferred)
        });
    for term in pod_terms {
        pod_term(term, keys)?;
    }
    for spread in spec.topology_spread_constraints.iter().flatten() {
        selectable(&spread.topology_key, keys, "spec.topologySpreadConstraints")?;
    }
    Ok(())
}

fn node_term(term: &NodeSelectorTerm, keys: &[String]) -> Result<(), Violation> {
    let field = "spec.affinity.nodeAffinity";
    for requirement in term.match_expressions.iter().flatten() {
        selectable(&requirement.key, keys, field)?;
    }
    if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
        // `metadata.name`: a node chosen by name, as nodeName would.
        return Err(Violation::new(
            field,
            "matchFields would choose nodes by name; the provider's scheduler places tenant pods",
        ));
    }
    Ok(())
}

fn pod_term(term: &PodAffinityTerm, keys: &[String]) -> Result<(), Violation> {
    let field = "spec.affinity.podAffinity";
    if term.namespaces.as_ref().is_some_and(|n| !n.is_empty()) || term.namespace_selector.is_some()
    {
        return Err(Violation::new(
            field,
            "pod affinity may only look at the pod's own namespace (no namespaces or namespaceSelector)",
        ));
    }
    selectable(&term.topology_key, keys, field)
}

/// Whether `key` is a node label the tenant may select.
fn selectable(key: &str, keys: &[String], field: &str) -> Result<(), Violation> {
    let allowed = keys.iter().any(|k| match k.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => k == key,
    });
    if allowed {
        return Ok(());
    }
    Err(Violation::new(
        field,
        format!("node label {key:?} is not one this tenant may select (nodeLabelKeys in the provider's policy)"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn verdict(spec: serde_json::Value) -> Result<(), Violation> {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        let spec: PodSpec = serde_json::from_value(spec).unwrap();
        check(&spec, &TenantPolicy::default())
    }

    #[test]
    fn topology_and_platform_labels_are_selectable_by_default() {
        let hostname = json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]});
        assert_eq!(
            verdict(json!({
                "schedulerName": "default-scheduler",
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [hostname]}},
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
                        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}}]}
                },
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}]
            })),
            Ok(())
        );
    }

    #[test]
    fn other_schedulers_node_roles_and_other_namespaces_are_refused() {
        let refused = [
            (
                json!({"schedulerName": "my-scheduler"}),
                "spec.schedulerName",
            ),
            (
                json!({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}),
                "spec.nodeSelector",
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "dedicated", "operator": "In", "values": ["payments"]}]}]}}}}),
                "spec.affinity.nodeAffinity",
            ),
            (
                json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference":
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp-1"]}]}}]}}}),
                "spec.affinity.nodeAffinity",
            ),
            (
                json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "namespaces": ["other-tenant-ns"], "labelSelector": {}}]}}}),
                "spec.affinity.podAffinity",
            ),
            (
                json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "node-role.kubernetes.io/master", "whenUnsatisfiable": "DoNotSchedule"}]}),
                "spec.topologySpreadConstraints",
            ),
        ];
        for (spec, field) in refused {
            let shown = spec.to_string();
            assert_eq!(verdict(spec).unwrap_err().field, field, "{shown}");
        }
    }

    #[test]
    fn the_policy_widens_the_selectable_labels() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "c"}], "nodeSelector": {"dedicated.example/pool": "tenants"}}))
        .unwrap();
        let policy = TenantPolicy {
            node_label_keys: vec!["dedicated.example/*".into()],
            ..TenantPolicy::default()
        };
        assert_eq!(check(&spec, &policy), Ok(()));
        assert!(check(&spec, &TenantPolicy::default()).is_err());
    }
}
