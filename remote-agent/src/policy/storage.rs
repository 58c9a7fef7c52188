//! PersistentVolumeClaims: a new volume of a class the provider allows; never someone else's
//! volume or data.

use super::{TenantPolicy, Violation};

/// Kinds a claim may be populated from: another claim or a snapshot of its own namespace.
const DATA_SOURCES: &[(&str, &str)] = &[
    ("", "PersistentVolumeClaim"),
    ("snapshot.storage.k8s.io", "VolumeSnapshot"),
];

/// Checks a claim's class, binding and data source.
pub(super) fn check_claim(
    claim: &serde_json::Value,
    policy: &TenantPolicy,
) -> Result<(), Violation> {
    let spec = &claim["spec"];
    if spec["volumeName"].as_str().is_some_and(|v| !v.is_empty()) {
        return Err(Violation::new(
            "spec.volumeName",
            "binding to a chosen volume is not allowed; the provider provisions one",
        ));
    }
    if let Some(class) = spec["storageClassName"].as_str() {
        let allowed = &policy.storage_classes;
        if !allowed.is_empty() && !allowed.iter().any(|c| c == class) {
            return Err(Violation::new(
                "spec.storageClassName",
                format!(
                    "StorageClass {class:?} is not allowed for this tenant (allowed: {})",
                    allowed.join(", ")
                ),
            ));
        }
    }
    for field in ["dataSource", "dataSourceRef"] {
        let source = &spec[field];
        if source.is_null() {
            continue;
        }
        if !source["namespace"].is_null() {
            return Err(Violation::new(
                format!("spec.{field}.namespace"),
                "a data source in another namespace is not allowed",
            ));
        }
        let group = source["apiGroup"].as_str().unwrap_or_default();
        let kind = source["kind"].as_str().unwrap_or_default();
        if !DATA_SOURCES.contains(&(group, kind)) {
            return Err(Violation::new(
                format!("spec.{field}"),
                format!("data source {kind:?} of group {group:?} is not allowed (PersistentVolumeClaim or VolumeSnapshot only)"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(spec: serde_json::Value, policy: &TenantPolicy) -> Option<String> {
        check_claim(&json!({"spec": spec}), policy)
            .err()
            .map(|v| v.field)
    }

    #[test]
    fn claims_get_a_new_volume_of_an_allowed_class() {
        let open = TenantPolicy::default();
        let fast = TenantPolicy {
            storage_classes: vec!["fast".into()],
            ..TenantPolicy::default()
        };
        assert_eq!(field(json!({"storageClassName": "any"}), &open), None);
        assert_eq!(field(json!({"storageClassName": "fast"}), &fast), None);
        assert_eq!(
            field(json!({"storageClassName": "gold"}), &fast).as_deref(),
            Some("spec.storageClassName")
        );
        assert_eq!(
            field(json!({"volumeName": "pv-of-another"}), &open).as_deref(),
            Some("spec.volumeName")
        );
        let elsewhere = json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "x", "namespace": "other"}});
        assert_eq!(
            field(elsewhere, &open).as_deref(),
            Some("spec.dataSourceRef.namespace")
        );
        let odd =
            json!({"dataSource": {"apiGroup": "example.com", "kind": "Populator", "name": "x"}});
        assert_eq!(field(odd, &open).as_deref(), Some("spec.dataSource"));
        let clone = json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}});
        assert_eq!(field(clone, &open), None);
    }
}
