//! A stable hash of a desired state, so an unchanged object is never rewritten.

use sha2::{Digest, Sha256};

/// SHA-256 (hex, first 32 characters) of the canonical JSON of `value`. serde_json's maps are
/// ordered (BTreeMap), so equal objects always hash equally.
pub fn desired_hash(value: &serde_json::Value) -> String {
    bytes_hash(&serde_json::to_vec(value).expect("JSON values always serialize"))
}

/// SHA-256 (hex, first 32 characters) of `bytes`: for JSON that was serialized anyway, so a
/// value is not serialized twice.
pub fn bytes_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The hash the remote agent stores on an object in [`crate::keys::DESIRED_HASH_ANNOTATION`]:
/// of the object as applied, with an annotations map present and without the hash itself.
/// `local-agent preview` uses the same function to tell whether the provider is up to date.
pub fn object_hash(object: &serde_json::Value) -> String {
    let mut normalized = object.clone();
    if let Some(meta) = normalized
        .get_mut("metadata")
        .and_then(|m| m.as_object_mut())
    {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(a) = annotations.as_object_mut() {
            a.remove(crate::keys::DESIRED_HASH_ANNOTATION);
        }
    }
    desired_hash(&normalized)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_does_not_matter() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap();
        assert_eq!(desired_hash(&a), desired_hash(&b));
        let c: serde_json::Value = serde_json::from_str(r#"{"a":2}"#).unwrap();
        assert_ne!(desired_hash(&a), desired_hash(&c));
    }
}
