//! Server-side apply of rendered manifests, reporting what each object needed.

use anyhow::Context;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::Value;

/// The field manager refractctl applies as.
pub const FIELD_MANAGER: &str = "refractctl";

/// What applying one object did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It did not exist.
    Created,
    /// It existed and changed.
    Configured,
    /// It existed as applied.
    Unchanged,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// Versions deploy/ uses that Kubernetes 1.20, the oldest release refractctl supports, serves
/// under an older name with the same fields: (apiVersion, kind, the older apiVersion).
const OLDER_VERSIONS: &[(&str, &str, &str)] =
    &[("policy/v1", "PodDisruptionBudget", "policy/v1beta1")];

/// `object` in a version the cluster serves: as it is, or under its older version when the
/// cluster serves only that.
pub async fn served(client: &kube::Client, object: &Value) -> anyhow::Result<Value> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let Some((_, _, older)) = OLDER_VERSIONS
        .iter()
        .find(|(v, k, _)| *v == api_version && *k == kind)
    else {
        return Ok(object.clone());
    };
    if discovery::pinned_kind(client, &gvk(api_version, kind))
        .await
        .is_ok()
    {
        return Ok(object.clone());
    }
    let mut older_object = object.clone();
    older_object["apiVersion"] = Value::from(*older);
    Ok(older_object)
}

fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    GroupVersionKind::gvk(group, version, kind)
}

/// The API of `object`'s kind, namespaced where the kind is.
pub async fn api_for(client: &kube::Client, object: &Value) -> anyhow::Result<Api<DynamicObject>> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk(api_version, kind))
        .await
        .with_context(|| format!("the cluster does not serve {api_version} {kind}"))?;
    Ok(match capabilities.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default"),
            &resource,
        ),
    })
}

/// `kind namespace/name` of an object, for messages.
pub fn describe(object: &Value) -> String {
    let m = &object["metadata"];
    match m["namespace"].as_str() {
        Some(ns) => format!(
            "{} {ns}/{}",
            object["kind"].as_str().unwrap_or("?"),
            m["name"].as_str().unwrap_or("?")
        ),
        None => format!(
            "{} {}",
            object["kind"].as_str().unwrap_or("?"),
            m["name"].as_str().unwrap_or("?")
        ),
    }
}

/// Applies `object` (server-side, taking over fields others set) and says what it did.
pub async fn apply(client: &kube::Client, object: &Value) -> anyhow::Result<Outcome> {
    let object = &served(client, object).await?;
    let api = api_for(client, object).await?;
    let name = object["metadata"]["name"]
        .as_str()
        .context("an object without metadata.name")?;
    let what = describe(object);
    let before = api
        .get_opt(name)
        .await
        .with_context(|| format!("failed to read {what}"))?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let after = api
        .patch(name, &params, &Patch::Apply(object))
        .await
        .with_context(|| format!("failed to apply {what}"))?;
    Ok(match before {
        None => Outcome::Created,
        Some(b) if b.metadata.resource_version == after.metadata.resource_version => {
            Outcome::Unchanged
        }
        Some(_) => Outcome::Configured,
    })
}

/// Applies every object in order, printing one line each with `say`.
pub async fn apply_all(
    client: &kube::Client,
    objects: &[Value],
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    for object in objects {
        let outcome = apply(client, object).await?;
        say(&format!("{} {}", describe(object), outcome.as_str()));
    }
    Ok(())
}

/// Deletes `object` if it exists; true if it did.
pub async fn delete(client: &kube::Client, object: &Value) -> anyhow::Result<bool> {
    let object = &served(client, object).await?;
    let api = api_for(client, object).await?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e).with_context(|| format!("failed to delete {}", describe(object))),
    }
}
