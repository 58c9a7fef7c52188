//! Custom resources: every field but the status is reflected as it is (the spec, and any other
//! top-level field the kind has), under the metadata every reflected object gets. What the
//! fields may hold is the provider's schema's to say: the remote agent tries each object
//! against its CustomResourceDefinition before writing it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize as _;

use super::meta::{name_of, remote_meta};
use super::{policy_skip, reflect, skip_or, Context, Decision, ForgeError};
use crate::options::Kind;

/// Top-level fields that are not the object's content: the type, the metadata (forged), and
/// the status, which the provider's controllers write.
const NOT_CONTENT: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];

/// Forges an object of the custom kind `kind`, given as JSON.
pub fn forge(
    kind: Kind,
    object: &serde_json::Value,
    ctx: &Context<'_>,
) -> Result<Decision, ForgeError> {
    let malformed = |source| ForgeError::Malformed {
        kind: kind.kind(),
        source,
    };
    let meta = ObjectMeta::deserialize(&object["metadata"]).map_err(malformed)?;
    skip_or(policy_skip(kind, &meta, ctx), || {
        let name = name_of(&meta, kind.kind())?;
        let mut out = serde_json::Map::new();
        if let Some(fields) = object.as_object() {
            for (key, value) in fields {
                if !NOT_CONTENT.contains(&key.as_str()) {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        out.insert(
            "metadata".into(),
            crate::json::to_value(&remote_meta(&meta, name, ctx)),
        );
        Ok(reflect(
            kind,
            ctx.remote_namespace,
            name,
            &serde_json::Value::Object(out),
        ))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::custom_kind::{register, CustomKindName};
    use crate::options::{KindOptions, ReflectionOptions};
    use crate::policy::Policy;

    fn widget() -> Kind {
        Kind::Custom(
            register(&CustomKindName {
                group: "forge.test.refract.example".into(),
                version: "v1".into(),
                kind: "Sprocket".into(),
                plural: "sprockets".into(),
            })
            .unwrap(),
        )
    }

    fn options() -> ReflectionOptions {
        let mut o = ReflectionOptions::new("origin", "provider");
        o.custom_kinds.push(crate::options::CustomReflection {
            kind: match widget() {
                Kind::Custom(c) => c,
                _ => unreachable!(),
            },
            options: KindOptions {
                policy: Policy::DenyList,
                workers: 1,
            },
            status: Vec::new(),
        });
        o
    }

    fn ctx(options: &ReflectionOptions) -> Context<'_> {
        Context {
            options,
            remote_namespace: "shop-origin",
            service: None,
            nodes: &crate::forge::NO_NODES,
        }
    }

    #[test]
    fn the_content_is_kept_and_the_status_and_server_fields_are_not() {
        let options = options();
        let ctx = ctx(&options);
        let origin = json!({
            "apiVersion": "forge.test.refract.example/v1", "kind": "Sprocket",
            "metadata": {"name": "w", "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
                         "labels": {"app": "shop"}, "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "y"}]},
            "spec": {"size": 3, "parts": ["a"]},
            "data": {"free": "form"},
            "status": {"ready": true}
        });
        let Decision::Reflect(desired) = forge(widget(), &origin, &ctx).unwrap() else {
            panic!("skipped");
        };
        assert_eq!(desired.namespace, "shop-origin");
        let o = &desired.object;
        assert_eq!(o["apiVersion"], "forge.test.refract.example/v1");
        assert_eq!(o["kind"], "Sprocket");
        assert_eq!(o["spec"], json!({"size": 3, "parts": ["a"]}));
        assert_eq!(o["data"], json!({"free": "form"}));
        assert!(o.get("status").is_none());
        assert_eq!(o["metadata"]["namespace"], "shop-origin");
        assert_eq!(o["metadata"]["labels"]["app"], "shop");
        assert!(o["metadata"].get("uid").is_none());
        assert!(o["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn the_kinds_policy_skips_as_for_built_in_kinds() {
        let options = options();
        let ctx = ctx(&options);
        let skipped = json!({"metadata": {"name": "w", "namespace": "shop",
            "annotations": {"liqo.io/skip-reflection": "true"}}, "spec": {}});
        assert!(matches!(
            forge(widget(), &skipped, &ctx).unwrap(),
            Decision::Skip { .. }
        ));
    }
}
