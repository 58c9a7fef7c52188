//! Twin namespaces: their names and labels and annotations are the provider's to decide. A
//! tenant's twin namespaces carry its identity in their names unless the policy allows others,
//! and never take the provider's own ([`check_name`]). The remote agent stamps its own labels
//! (tenant, origin, destination, Pod Security Admission); of what the origin sent only the
//! name of the origin namespace it mirrors is kept.

use refract_core::keys::ORIGINAL_NAME_ANNOTATION;

use super::Violation;

/// Keeps only what the provider accepts of a namespace from a tenant.
pub(super) fn check(ns: &mut serde_json::Value) -> Result<(), Violation> {
    let original = ns["metadata"]["annotations"][ORIGINAL_NAME_ANNOTATION].clone();
    if !original.is_null() {
        let valid = original.as_str().is_some_and(is_dns_label);
        if !valid {
            return Err(Violation::new(
                format!("metadata.annotations[{ORIGINAL_NAME_ANNOTATION}]"),
                "must be the name of the origin namespace",
            ));
        }
    }
    let Some(object) = ns.as_object_mut() else {
        return Err(Violation::new("", "must be an object"));
    };
    object.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
    let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) else {
        return Err(Violation::new("metadata", "must be an object"));
    };
    meta.insert("labels".into(), serde_json::json!({}));
    let mut annotations = serde_json::Map::new();
    if !original.is_null() {
        annotations.insert(ORIGINAL_NAME_ANNOTATION.into(), original);
    }
    meta.insert("annotations".into(), annotations.into());
    Ok(())
}

/// Namespace names no tenant may have, whatever its policy says.
#[derive(Debug, Clone)]
pub struct ReservedNames {
    /// The namespace the remote agent runs in.
    pub own_namespace: String,
    /// Every tenant the policy file names: a name carrying another tenant's identity is that
    /// tenant's, even where it also ends in a shorter tenant id.
    pub tenants: Vec<String>,
}

impl Default for ReservedNames {
    fn default() -> Self {
        Self {
            own_namespace: "refract-system".into(),
            tenants: Vec::new(),
        }
    }
}

/// Whether `tenant` may have a twin namespace named `name`: one carrying its identity (ending
/// in `-<tenant>`, as the default naming makes them), or one its policy's `namespaces` allows
/// (exact names, or prefixes ending in `*`); never `default`, `kube-*`, the agent's own
/// namespace, nor a name carrying a longer tenant id the policy names.
pub fn check_name(
    name: &str,
    tenant: &str,
    allowed: &[String],
    reserved: &ReservedNames,
) -> Result<(), Violation> {
    let field = "metadata.name";
    if name == "default" || name.starts_with("kube-") || name == reserved.own_namespace {
        return Err(Violation::new(
            field,
            format!("namespace {name} is one of the provider's own; a tenant can never have it"),
        ));
    }
    let carries = |id: &str| {
        name.strip_suffix(id)
            .and_then(|rest| rest.strip_suffix('-'))
            .is_some_and(|prefix| !prefix.is_empty())
    };
    let other = reserved
        .tenants
        .iter()
        .find(|t| t.len() > tenant.len() && carries(t));
    if let Some(other) = other {
        return Err(Violation::new(
            field,
            format!("namespace {name} carries tenant {other}'s identity"),
        ));
    }
    let matches = |pattern: &String| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    };
    if carries(tenant) || allowed.iter().any(matches) {
        return Ok(());
    }
    Err(Violation::new(
        field,
        format!(
            "twin namespace {name} does not carry tenant {tenant}'s identity (a name ending in -{tenant}, as the default naming makes); the provider's policy allows other names with namespaces: [\"{name}\"] under tenants.{tenant}"
        ),
    ))
}

/// Whether `name` can name a namespace: an RFC 1123 label.
fn is_dns_label(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&name.len())
        && name.chars().all(|c| alnum(c) || c == '-')
        && name.starts_with(alnum)
        && name.ends_with(alnum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_annotations_and_spec_are_the_providers() {
        let mut ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "t", "labels": {"pod-security.kubernetes.io/enforce": "privileged", "team": "x"},
            "annotations": {ORIGINAL_NAME_ANNOTATION: "shop", "scheduler.alpha.kubernetes.io/node-selector": "a=b"}},
            "spec": {"finalizers": ["x"]}});
        check(&mut ns).unwrap();
        assert_eq!(
            ns,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t", "labels": {},
                "annotations": {ORIGINAL_NAME_ANNOTATION: "shop"}}})
        );
        let mut bad =
            json!({"metadata": {"name": "t", "annotations": {ORIGINAL_NAME_ANNOTATION: "../x"}}});
        assert!(check(&mut bad).is_err());
    }

    fn reserved(tenants: &[&str]) -> ReservedNames {
        ReservedNames {
            own_namespace: "refract-system".into(),
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn a_tenant_gets_names_carrying_its_identity_and_what_its_policy_allows() {
        let none: &[String] = &[];
        let ok = |name, allowed: &[String]| check_name(name, "origin", allowed, &reserved(&[]));
        assert!(ok("shop-origin", none).is_ok());
        assert!(ok("a-b-origin", none).is_ok());
        let squat = ok("monitoring", none).unwrap_err();
        assert!(
            squat
                .reason
                .contains("namespaces: [\"monitoring\"] under tenants.origin"),
            "{squat}"
        );
        assert!(
            ok("origin", none).is_err(),
            "the id alone carries no namespace name"
        );
        assert!(ok("-origin", none).is_err());
        assert!(ok("shoporigin", none).is_err());
        let allowed = vec!["lab".to_string(), "team-*".to_string()];
        assert!(ok("lab", &allowed).is_ok());
        assert!(ok("team-a", &allowed).is_ok());
        assert!(ok("labs", &allowed).is_err());
        assert!(ok("anything", &["*".to_string()]).is_ok());
    }

    #[test]
    fn the_providers_own_namespaces_are_never_a_tenants() {
        let any = ["*".to_string()];
        for name in [
            "default",
            "kube-system",
            "kube-public",
            "kube-squat",
            "refract-system",
        ] {
            let refused = check_name(name, "origin", &any, &reserved(&[])).unwrap_err();
            assert!(
                refused.reason.contains("provider's own"),
                "{name}: {refused}"
            );
        }
    }

    #[test]
    fn a_name_carrying_a_longer_tenant_id_is_that_tenants() {
        let none: &[String] = &[];
        let tenants = reserved(&["origin", "b-origin"]);
        let refused = check_name("apps-b-origin", "origin", none, &tenants).unwrap_err();
        assert!(
            refused.reason.contains("tenant b-origin's identity"),
            "{refused}"
        );
        assert!(check_name("apps-b-origin", "b-origin", none, &tenants).is_ok());
        assert!(check_name("apps-origin", "origin", none, &tenants).is_ok());
    }
}
