//! A stable hash of a desired state, so an unchanged object is never rewritten.

use sha2::{Digest, Sha256};

/// SHA-256 (hex, first 32 characters) of the canonical JSON of `value`. serde_json's maps are
/// ordered (BTreeMap), so equal objects always hash equally.
pub fn desired_hash(value: &serde_json::Value) -> String {
    bytes_hash(&crate::json::to_vec(value))
}

/// SHA-256 (hex, first 32 characters) of `bytes`: for JSON that was serialized anyway, so a
/// value is not serialized twice.
pub fn bytes_hash(bytes: &[u8]) -> String {
    hex_prefix(&Sha256::digest(bytes))
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

/// The digest of one bucket (a tenant's objects of one kind in one namespace) that a reconnect
/// compares, over `(name, origin hash)` pairs in any order: equal sets give equal digests.
pub fn bucket_digest<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut sorted: Vec<_> = entries.into_iter().collect();
    sorted.sort_unstable();
    let mut hasher = Sha256::new();
    for (name, hash) in sorted {
        hasher.update(name.as_bytes());
        hasher.update(b"\n");
        hasher.update(hash.as_bytes());
        hasher.update(b"\n");
    }
    hex_prefix(&hasher.finalize())
}

/// The first 16 bytes of a SHA-256 digest, in hex. Written digit by digit: this runs for every
/// object sent and every object applied, and a `format!` per byte cost more than the digest.
fn hex_prefix(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(32);
    for byte in digest.iter().take(16) {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_digests_ignore_order_and_see_every_change() {
        let a = bucket_digest([("a", "1"), ("b", "2")]);
        assert_eq!(a, bucket_digest([("b", "2"), ("a", "1")]));
        assert_ne!(a, bucket_digest([("a", "1"), ("b", "3")]));
        assert_ne!(a, bucket_digest([("a", "1")]));
        // The separator keeps names and hashes from running into each other.
        assert_ne!(bucket_digest([("ab", "c")]), bucket_digest([("a", "bc")]));
        assert_eq!(bucket_digest([]), bucket_digest(Vec::<(&str, &str)>::new()));
    }

    #[test]
    fn hashes_are_the_hex_of_the_digest_prefix() {
        // SHA-256("abc"), its first 16 bytes.
        assert_eq!(bytes_hash(b"abc"), "ba7816bf8f01cfea414140de5dae2223");
        assert_eq!(hex_prefix(&[0x00, 0x0f, 0xf0, 0xff]), "000ff0ff");
    }

    #[test]
    fn key_order_does_not_matter() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap();
        assert_eq!(desired_hash(&a), desired_hash(&b));
        let c: serde_json::Value = serde_json::from_str(r#"{"a":2}"#).unwrap();
        assert_ne!(desired_hash(&a), desired_hash(&c));
    }
}
