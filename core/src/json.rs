//! JSON serialization of values whose serialization has no error path.
//!
//! serde_json fails to serialize only a map whose key is not a string, or a type whose own
//! `Serialize` returns an error. Kubernetes API types (k8s-openapi's and kube's derived CRDs),
//! `serde_json::Value` and Refract's derived structs have neither, so their serialization is
//! total; these functions say so once instead of at every call. Do not pass anything else:
//! for a type that can fail, call serde_json and handle its error.

#![allow(
    clippy::expect_used,
    reason = "serialization of the types this module is for cannot fail (module docs)"
)]

use serde::Serialize;
use serde_json::Value;

/// `serde_json::to_value` for an API object, a `Value` or a derived struct.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).expect("serialization of an API type or JSON value is total")
}

/// `serde_json::to_vec` (compact) for an API object, a `Value` or a derived struct.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("serialization of an API type or JSON value is total")
}

/// `serde_json::to_string` (compact) for an API object, a `Value` or a derived struct.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("serialization of an API type or JSON value is total")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_text_as_serde_json() {
        let pod = k8s_openapi::api::core::v1::Pod::default();
        let value = serde_json::json!({"b": [1, "x"], "a": {"c": null}});
        assert_eq!(to_vec(&value), serde_json::to_vec(&value).unwrap());
        assert_eq!(to_string(&value), serde_json::to_string(&value).unwrap());
        assert_eq!(to_value(&pod), serde_json::to_value(&pod).unwrap());
    }
}
