//! ShadowPods: the pod must meet the tenant's Pod Security Standards level, stay off node
//! placement the provider decides (`nodeName`, priority, control-plane tolerations, node labels
//! and schedulers, see [`super::scheduling`]), and never run with the provider's own
//! ServiceAccount credentials.
//!
//! Tokens a tenant's pod may mount come only from Secrets the tenant itself sent (checked by
//! the write path, which can read the Secrets), or from a ServiceAccount of its namespace the
//! tenant's policy lists (`serviceAccounts`); here the pod is held to what needs no read: any
//! other pod runs as `default` with no automounted and no projected token.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

use super::{decode, pod_security, scheduling, TenantPolicy, Violation};

/// Taint keys of the control plane: tolerating them would put tenant pods next to it.
const CONTROL_PLANE_TAINTS: &[&str] = &[
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// Tolerations every pod gets from the API server's admission (DefaultTolerationSeconds):
/// always allowed.
const DEFAULT_TOLERATIONS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// Checks a ShadowPod, and makes sure its pod never mounts the provider's token.
pub(super) fn check(
    shadow: &mut serde_json::Value,
    policy: &TenantPolicy,
) -> Result<(), Violation> {
    let spec_json = &shadow["spec"]["pod"];
    if !spec_json.is_object() {
        return Err(Violation::new("spec.pod", "a ShadowPod needs a pod spec"));
    }
    let spec: PodSpec = decode(spec_json, "spec.pod")?;
    let annotations: BTreeMap<String, String> = match &shadow["metadata"]["annotations"] {
        serde_json::Value::Null => BTreeMap::new(),
        a => decode(a, "metadata.annotations")?,
    };
    let prefixed = |v: Violation| Violation::new(v.field.replacen("spec", "spec.pod", 1), v.reason);
    pod_security::check(policy.pod_security, &spec, spec_json, &annotations).map_err(
        |v| match v.field.starts_with("spec") {
            true => prefixed(v),
            false => v,
        },
    )?;
    placement(&spec, policy).map_err(prefixed)?;
    scheduling::check(&spec, policy).map_err(prefixed)?;
    if !credentials(&spec, policy).map_err(prefixed)? {
        // The pod never gets the token of a ServiceAccount its tenant may not use.
        shadow["spec"]["pod"]["automountServiceAccountToken"] = false.into();
    }
    Ok(())
}

fn placement(spec: &PodSpec, policy: &TenantPolicy) -> Result<(), Violation> {
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err(Violation::new(
            "spec.nodeName",
            "the provider's scheduler places tenant pods; nodeName is not allowed",
        ));
    }
    class_allowed(
        "spec.priorityClassName",
        "PriorityClass",
        spec.priority_class_name.as_deref(),
        &policy.priority_classes,
    )?;
    class_allowed(
        "spec.runtimeClassName",
        "RuntimeClass",
        spec.runtime_class_name.as_deref(),
        &policy.runtime_classes,
    )?;
    if spec.priority.is_some() {
        return Err(Violation::new(
            "spec.priority",
            "the priority is set by the provider from priorityClassName",
        ));
    }
    for (i, t) in spec.tolerations.iter().flatten().enumerate() {
        let key = t.key.as_deref().unwrap_or_default();
        let field = format!("spec.tolerations[{i}]");
        if key.is_empty() {
            return Err(Violation::new(
                field,
                "a toleration of every taint (no key) is not allowed",
            ));
        }
        if CONTROL_PLANE_TAINTS.contains(&key) {
            return Err(Violation::new(
                field,
                format!("tolerating the control plane's taint {key:?} is not allowed"),
            ));
        }
        let allowed = policy.toleration_keys.is_empty()
            || DEFAULT_TOLERATIONS.contains(&key)
            || policy.toleration_keys.iter().any(|k| k == key);
        if !allowed {
            return Err(Violation::new(
                field,
                format!(
                    "tolerating taint {key:?} is not allowed for this tenant (allowed: {})",
                    listed(&policy.toleration_keys)
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the pod may run with a provider ServiceAccount's token: only as a ServiceAccount
/// the tenant's policy lists. Otherwise it runs as `default`, without any provider token.
fn credentials(spec: &PodSpec, policy: &TenantPolicy) -> Result<bool, Violation> {
    let account = spec
        .service_account_name
        .as_deref()
        .or(spec.service_account.as_deref())
        .filter(|a| !a.is_empty());
    let allowed = account.is_some_and(|a| policy.service_accounts.iter().any(|s| s == a));
    if let Some(account) = account.filter(|a| !allowed && *a != "default") {
        return Err(Violation::new(
            "spec.serviceAccountName",
            format!(
                "ServiceAccount {account:?} is not allowed for this tenant (allowed: {}); other tenant pods run as \"default\" without its token",
                listed(&policy.service_accounts)
            ),
        ));
    }
    if allowed {
        return Ok(true);
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let projected = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        if projected
            .into_iter()
            .flatten()
            .any(|s| s.service_account_token.is_some())
        {
            return Err(Violation::new(
                format!("spec.volumes[{i}].projected"),
                "a projected serviceAccountToken would be the provider's token, and this pod's ServiceAccount is not one the tenant may use; tokens come from the tenant's own token Secrets",
            ));
        }
    }
    Ok(false)
}

/// The Secrets a pod reads: volumes, image pull Secrets, env and envFrom of every container.
pub fn secrets_read(spec: &PodSpec) -> Vec<String> {
    let mut names: Vec<String> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect();
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            names.push(s);
        }
        let projected = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        names.extend(
            projected
                .into_iter()
                .flatten()
                .filter_map(|s| s.secret.as_ref().map(|s| s.name.clone())),
        );
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            let from = e
                .value_from
                .as_ref()
                .and_then(|f| f.secret_key_ref.as_ref());
            names.extend(from.map(|r| r.name.clone()));
        }
        for f in c.env_from.iter().flatten() {
            names.extend(f.secret_ref.as_ref().map(|r| r.name.clone()));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// A class the pod names (`kind`, at `field`) must be one the tenant's policy lists.
fn class_allowed(
    field: &str,
    kind: &str,
    named: Option<&str>,
    allowed: &[String],
) -> Result<(), Violation> {
    match named.filter(|c| !c.is_empty()) {
        Some(class) if !allowed.iter().any(|c| c == class) => Err(Violation::new(
            field,
            format!(
                "{kind} {class:?} is not allowed for this tenant (allowed: {})",
                listed(allowed)
            ),
        )),
        _ => Ok(()),
    }
}

fn listed(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shadow(pod: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "p"}, "spec": {"pod": pod}})
    }

    fn refusal(pod: serde_json::Value, policy: &TenantPolicy) -> String {
        check(&mut shadow(pod), policy).unwrap_err().field
    }

    #[test]
    fn placement_and_credentials_are_the_providers() {
        let p = TenantPolicy::default();
        let c = json!([{"name": "a", "image": "x"}]);
        let cases = [
            (
                json!({"nodeName": "n1", "containers": c}),
                "spec.pod.nodeName",
            ),
            (
                json!({"priorityClassName": "system-node-critical", "containers": c}),
                "spec.pod.priorityClassName",
            ),
            (
                json!({"priority": 2000000000, "containers": c}),
                "spec.pod.priority",
            ),
            (
                json!({"runtimeClassName": "gvisor", "containers": c}),
                "spec.pod.runtimeClassName",
            ),
            (
                json!({"tolerations": [{"operator": "Exists"}], "containers": c}),
                "spec.pod.tolerations[0]",
            ),
            (
                json!({"tolerations": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}], "containers": c}),
                "spec.pod.tolerations[0]",
            ),
            (
                json!({"serviceAccountName": "remote-agent", "containers": c}),
                "spec.pod.serviceAccountName",
            ),
            (
                json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}], "containers": c}),
                "spec.pod.volumes[0].projected",
            ),
            (
                json!({"hostNetwork": true, "containers": c}),
                "spec.pod.hostNetwork",
            ),
        ];
        for (pod, field) in cases {
            assert_eq!(refusal(pod, &p), field);
        }
    }

    #[test]
    fn the_policy_opens_priority_classes_and_taints() {
        let c = json!([{"name": "a", "image": "x"}]);
        let p = TenantPolicy {
            priority_classes: vec!["tenant-high".into()],
            runtime_classes: vec!["gvisor".into()],
            toleration_keys: vec!["gpu".into()],
            ..TenantPolicy::default()
        };
        let mut ok = shadow(
            json!({"priorityClassName": "tenant-high", "runtimeClassName": "gvisor", "tolerations": [{"key": "gpu", "operator": "Exists"}], "containers": c}),
        );
        assert_eq!(check(&mut ok, &p), Ok(()));
        assert_eq!(
            ok["spec"]["pod"]["automountServiceAccountToken"],
            json!(false)
        );
        let other =
            json!({"tolerations": [{"key": "spot", "operator": "Exists"}], "containers": c});
        assert_eq!(refusal(other, &p), "spec.pod.tolerations[0]");
    }

    #[test]
    fn only_listed_service_accounts_get_the_providers_token() {
        let c = json!([{"name": "a", "image": "x"}]);
        let p = TenantPolicy {
            service_accounts: vec!["reader".into()],
            ..TenantPolicy::default()
        };
        let projected = json!([{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]);
        let mut ok = shadow(
            json!({"serviceAccountName": "reader", "automountServiceAccountToken": true, "volumes": projected, "containers": c}),
        );
        assert_eq!(check(&mut ok, &p), Ok(()));
        assert_eq!(
            ok["spec"]["pod"]["automountServiceAccountToken"],
            json!(true)
        );
        let mut default = shadow(
            json!({"serviceAccountName": "default", "automountServiceAccountToken": true, "containers": c}),
        );
        assert_eq!(check(&mut default, &p), Ok(()));
        assert_eq!(
            default["spec"]["pod"]["automountServiceAccountToken"],
            json!(false),
            "default is not listed: no token"
        );
        let other = json!({"serviceAccountName": "admin", "automountServiceAccountToken": true, "containers": c});
        let refused = check(&mut shadow(other), &p).unwrap_err();
        assert_eq!(refused.field, "spec.pod.serviceAccountName");
        assert!(refused.reason.contains("allowed: reader"), "{refused}");
        let default_projected = json!({"volumes": projected, "containers": c});
        assert_eq!(
            refusal(default_projected, &p),
            "spec.pod.volumes[0].projected"
        );
    }

    #[test]
    fn secrets_read_lists_every_reference() {
        let spec: PodSpec = serde_json::from_value(json!({
            "volumes": [{"name": "a", "secret": {"secretName": "s1"}},
                        {"name": "b", "projected": {"sources": [{"secret": {"name": "s2"}}]}}],
            "containers": [{"name": "c", "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "k"}}}],
                            "envFrom": [{"secretRef": {"name": "s4"}}]}]
        }))
        .unwrap();
        assert_eq!(secrets_read(&spec), ["s1", "s2", "s3", "s4"]);
    }
}
