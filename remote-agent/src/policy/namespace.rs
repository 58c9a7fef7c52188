//! Twin namespaces: their labels and annotations are the provider's. The remote agent stamps
//! its own (tenant, origin, destination, Pod Security Admission); of what the origin sent only
//! the name of the origin namespace it mirrors is kept.

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
}
