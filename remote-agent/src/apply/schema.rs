//! The schema check of custom kinds: before an object of a custom kind is written, the
//! provider's API server tries the write without storing it (server-side dry run), as the
//! tenant. Its CustomResourceDefinition's schema refuses wrong types and values (422, the
//! tenant is told why). A field the schema does not declare is refused by older API servers
//! (1.20 answers a 500 naming it) and silently pruned by newer ones: a pruned field would
//! make the provider's copy differ from the origin's without anyone knowing, so any field the
//! dry run dropped refuses the object too, naming the fields. A kind the provider does not
//! serve (its CustomResourceDefinition not installed) is refused the same way.
//!
//! One extra request per write of a custom kind, none when the provider holds the desired
//! state already.

use kube::api::{DynamicObject, Patch, PatchParams};
use refract_core::keys::{DESIRED_HASH_ANNOTATION, REMOTE_FIELD_MANAGER};
use refract_shared::journey::TARGET as JOURNEY;
use serde_json::Value;
use tracing::Instrument as _;

use super::{Applier, ApplyError, ObjectKey};
use crate::kinds::Allowed;
use refract_core::options::Kind;

/// At most this many dropped fields are named in a refusal.
const NAMED_AT_MOST: usize = 10;

impl Applier {
    /// Checks `desired` (of `key`, hashed `hash`) against the provider's schema of its kind,
    /// for a custom kind whose copy on the provider does not hold that hash yet.
    pub(super) async fn check_schema(
        &self,
        key: &ObjectKey,
        desired: &Value,
        hash: &str,
    ) -> Result<(), ApplyError> {
        let Allowed::Reflected(Kind::Custom(custom)) = key.kind else {
            return Ok(());
        };
        let held = self
            .objects
            .get(key.kind, &key.namespace, &key.name)
            .is_some_and(|meta| {
                meta.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
                    .is_some_and(|h| h == hash)
            });
        if held {
            return Ok(());
        }
        let api = self.api(&key.tenant, key.kind, &key.namespace)?;
        let params = PatchParams::apply(REMOTE_FIELD_MANAGER).force().dry_run();
        let trying = tracing::trace_span!(target: JOURNEY, "schema");
        let stored = match api
            .patch(&key.name, &params, &Patch::Apply(desired))
            .instrument(trying)
            .await
        {
            Ok(stored) => stored,
            // The namespace is the tenant's (checked before): a 404 naming no object is the
            // resource's, unknown to the API server.
            Err(kube::Error::Api(s))
                if s.code == 404 && s.details.as_ref().is_none_or(|d| d.name.is_empty()) =>
            {
                return Err(ApplyError::KindNotServed {
                    api_version: custom.api_version().to_string(),
                    plural: custom.name().plural.clone(),
                })
            }
            // Invalid (422, 400), or a field the schema does not declare, which server-side
            // apply of Kubernetes up to 1.24 or so refuses with a 500 instead of pruning it.
            Err(kube::Error::Api(s))
                if s.code == 400
                    || s.code == 422
                    || (s.code == 500
                        && s.message.starts_with("failed to create typed patch object")) =>
            {
                return Err(ApplyError::Rejected(format!(
                    "the provider's schema of {} {} refuses it: {}",
                    custom.api_version(),
                    custom.kind(),
                    s.message
                )))
            }
            Err(other) => return Err(other.into()),
        };
        let dropped = dropped_fields(desired, &as_value(&stored));
        if dropped.is_empty() {
            return Ok(());
        }
        let mut named = dropped
            .iter()
            .take(NAMED_AT_MOST)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if dropped.len() > NAMED_AT_MOST {
            named.push_str(&format!(" and {} more", dropped.len() - NAMED_AT_MOST));
        }
        Err(ApplyError::Rejected(format!(
            "the provider's schema of {} {} has no field {named}: the provider would drop it (pruning), so the object is not written",
            custom.api_version(),
            custom.kind(),
        )))
    }
}

/// `object` as JSON.
fn as_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

/// The paths of the fields of `sent` (outside its metadata, type and status) that `stored`
/// lacks: what the API server pruned. Defaults it added are not looked at.
pub fn dropped_fields(sent: &Value, stored: &Value) -> Vec<String> {
    let mut dropped = Vec::new();
    let Some(sent) = sent.as_object() else {
        return dropped;
    };
    for (key, value) in sent {
        if matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            continue;
        }
        walk(key, value, stored.get(key), &mut dropped);
    }
    dropped
}

fn walk(path: &str, sent: &Value, stored: Option<&Value>, dropped: &mut Vec<String>) {
    let Some(stored) = stored else {
        dropped.push(path.to_string());
        return;
    };
    match (sent, stored) {
        (Value::Object(sent), Value::Object(_)) => {
            for (key, value) in sent {
                walk(&format!("{path}.{key}"), value, stored.get(key), dropped);
            }
        }
        (Value::Array(sent), Value::Array(stored)) => {
            for (i, value) in sent.iter().enumerate() {
                walk(&format!("{path}[{i}]"), value, stored.get(i), dropped);
            }
        }
        // A value stored in place of the one sent (a default, or a mutating webhook's) was
        // not dropped.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_the_schema_pruned_are_named_and_defaults_are_not() {
        let sent = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"a": "b"}},
            "spec": {"size": 3, "colour": "red", "parts": [{"name": "a", "extra": 1}, {"name": "b"}],
                     "nested": {"kept": true, "lost": {"deep": 1}}},
            "unknownTop": 1,
            "status": {"ready": true}
        });
        let stored = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "uid": "u"},
            "spec": {"size": 3, "replicas": 1, "parts": [{"name": "a"}, {"name": "b"}],
                     "nested": {"kept": true}}
        });
        assert_eq!(
            dropped_fields(&sent, &stored),
            vec![
                "spec.colour",
                "spec.nested.lost",
                "spec.parts[0].extra",
                "unknownTop"
            ]
        );
    }

    #[test]
    fn an_object_stored_whole_drops_nothing() {
        let sent = json!({"spec": {"size": 3, "tags": ["a", "b"], "empty": {}}});
        assert!(dropped_fields(&sent, &sent.clone()).is_empty());
    }
}
