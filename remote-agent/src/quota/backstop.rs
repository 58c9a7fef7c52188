//! Kubernetes' own count behind the remote agent's: in each twin namespace a ResourceQuota with
//! the tenant's `hard` limits, and a LimitRange giving containers that name no request or limit
//! the defaults the quota needs (a ResourceQuota on `requests.cpu` refuses pods that do not
//! say). The ResourceQuota bounds each namespace by the tenant's whole quota: the remote agent
//! bounds the namespaces together; this holds even if its count were wrong.

use serde_json::json;

use super::Quota;

/// The name of the ResourceQuota and the LimitRange in each twin namespace.
pub const NAME: &str = "refract-tenant-quota";

/// The compute resources a container gets defaults for: those `quota` limits.
pub fn defaulted_resources(quota: &Quota) -> Vec<&'static str> {
    ["cpu", "memory", "ephemeral-storage"]
        .into_iter()
        .filter(|r| {
            quota.hard.contains_key(&format!("requests.{r}"))
                || quota.hard.contains_key(&format!("limits.{r}"))
        })
        .collect()
}

/// The ResourceQuota of a twin namespace `namespace`; `None` when `quota` limits nothing
/// Kubernetes counts.
pub fn resource_quota(namespace: &str, quota: &Quota) -> Option<serde_json::Value> {
    if quota.hard.is_empty() {
        return None;
    }
    let hard: serde_json::Map<String, serde_json::Value> = quota
        .hard
        .iter()
        .map(|(k, v)| (k.clone(), v.quantity().into()))
        .collect();
    Some(json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {"hard": hard},
    }))
}

/// The LimitRange of a twin namespace `namespace`; `None` when no compute resource is limited.
pub fn limit_range(namespace: &str, quota: &Quota) -> Option<serde_json::Value> {
    let resources = defaulted_resources(quota);
    if resources.is_empty() {
        return None;
    }
    let pick = |from: &std::collections::BTreeMap<String, super::Amount>| {
        resources
            .iter()
            .filter_map(|r| Some((r.to_string(), from.get(*r)?.quantity().into())))
            .collect::<serde_json::Map<String, serde_json::Value>>()
    };
    let defaults = &quota.container_defaults;
    Some(json!({
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {"limits": [{
            "type": "Container",
            "defaultRequest": pick(&defaults.requests),
            "default": pick(&defaults.limits),
        }]},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Amount;

    #[test]
    fn the_backstop_carries_the_tenants_limits_and_defaults_only_what_is_limited() {
        let mut quota = Quota::default();
        assert!(
            limit_range("shop-origin", &quota).is_none(),
            "nothing compute limited"
        );
        quota
            .hard
            .insert("requests.memory".into(), Amount::units(1 << 30));
        let rq = resource_quota("shop-origin", &quota).unwrap();
        assert_eq!(rq["metadata"]["namespace"], "shop-origin");
        assert_eq!(rq["spec"]["hard"]["pods"], "1000");
        assert_eq!(rq["spec"]["hard"]["requests.memory"], "1073741824");
        let lr = limit_range("shop-origin", &quota).unwrap();
        let limits = &lr["spec"]["limits"][0];
        assert_eq!(limits["defaultRequest"]["memory"], "134217728");
        assert!(limits["defaultRequest"].get("cpu").is_none());
        quota.hard.clear();
        assert!(resource_quota("shop-origin", &quota).is_none());
    }
}
