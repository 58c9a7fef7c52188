//! What Tap may show of a message: everything but the values of Secrets (their data, which
//! includes the ServiceAccount tokens the origin sends for offloaded pods). Each value is
//! replaced by its size, so an operator still sees which keys changed.

use refract_wire::proto::{local_message, LocalMessage};

/// `message` with the data of any Secret it carries redacted.
pub fn local_message(message: &LocalMessage) -> LocalMessage {
    let mut message = message.clone();
    if let Some(local_message::Kind::Upsert(upsert)) = message.kind.as_mut() {
        let named_secret = upsert.object.as_ref().is_some_and(|o| o.kind == "Secret");
        upsert.object_json = redact_object(&upsert.object_json, named_secret);
    }
    message
}

/// The object JSON with Secret values redacted. The reference is not trusted alone: the JSON's
/// own kind counts too, and what cannot be parsed is not shown if it may be a Secret.
fn redact_object(json: &[u8], named_secret: bool) -> Vec<u8> {
    let Ok(mut object) = serde_json::from_slice::<serde_json::Value>(json) else {
        return match named_secret {
            true => b"\"<redacted: not JSON>\"".to_vec(),
            false => json.to_vec(),
        };
    };
    if !named_secret && object["kind"] != "Secret" {
        return json.to_vec();
    }
    for field in ["data", "stringData"] {
        if let Some(values) = object.get_mut(field).and_then(|v| v.as_object_mut()) {
            for value in values.values_mut() {
                let size = value.as_str().map(str::len).unwrap_or_default();
                *value = format!("<redacted: {size} characters>").into();
            }
        } else if let Some(value) = object.get_mut(field).filter(|v| !v.is_null()) {
            *value = "<redacted>".into();
        }
    }
    serde_json::to_vec(&object).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_wire::proto::{ObjectRef, Upsert};

    fn upsert(kind: &str, json: serde_json::Value) -> LocalMessage {
        LocalMessage {
            kind: Some(local_message::Kind::Upsert(Upsert {
                object: Some(ObjectRef {
                    kind: kind.into(),
                    ..Default::default()
                }),
                object_json: serde_json::to_vec(&json).unwrap(),
                ..Default::default()
            })),
        }
    }

    fn shown(message: &LocalMessage) -> serde_json::Value {
        match local_message(message).kind {
            Some(local_message::Kind::Upsert(u)) => serde_json::from_slice(&u.object_json).unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn secret_values_are_redacted_and_keys_kept() {
        let secret = serde_json::json!({"kind": "Secret", "metadata": {"name": "api-client-token"},
            "data": {"api-token-3c469e": "ZXlKaGJHY2lPaUpT"}, "stringData": {"password": "hunter2"}});
        let out = shown(&upsert("Secret", secret.clone()));
        assert_eq!(out["data"]["api-token-3c469e"], "<redacted: 16 characters>");
        assert_eq!(out["stringData"]["password"], "<redacted: 7 characters>");
        assert_eq!(out["metadata"]["name"], "api-client-token");
        // A reference that lies about the kind does not hide a Secret.
        let out = shown(&upsert("ConfigMap", secret));
        assert_eq!(out["data"]["api-token-3c469e"], "<redacted: 16 characters>");
        // Anything else is shown as sent.
        let cm = serde_json::json!({"kind": "ConfigMap", "data": {"a": "b"}});
        assert_eq!(shown(&upsert("ConfigMap", cm.clone())), cm);
    }

    #[test]
    fn an_unparsable_secret_is_not_shown() {
        let mut message = upsert("Secret", serde_json::json!({}));
        if let Some(local_message::Kind::Upsert(u)) = message.kind.as_mut() {
            u.object_json = b"{\"data\": {\"token\": \"abc".to_vec();
        }
        assert_eq!(shown(&message), "<redacted: not JSON>");
    }
}
