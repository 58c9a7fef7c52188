//! The pure part of the write path: a tenant's object decoded, checked against the envelope and
//! the tenant's policy, and stamped with the labels the remote agent owns. No client, no I/O:
//! what [`crate::apply::Applier`] writes is exactly what this returns, and the fuzz properties
//! of tenant input run it directly.

use refract_core::keys::{
    DESIRED_HASH_ANNOTATION, DESTINATION_LABEL, ORIGIN_HASH_ANNOTATION, ORIGIN_LABEL,
    PSA_ENFORCE_LABEL, TENANT_NAMESPACE_LABEL,
};
use refract_shared::tls::ClusterId;
use refract_wire::proto::ObjectRef;

use super::{ApplyError, DisplayName};
use crate::kinds::Allowed;
use crate::policy::{self, ProviderNetworks, ReservedNames, TenantPolicy};

/// Decodes a request's object and checks it names what the envelope names.
pub fn decode_desired(
    kind: Allowed,
    object: &ObjectRef,
    json: &[u8],
) -> Result<serde_json::Value, ApplyError> {
    let malformed = ApplyError::Malformed;
    let value: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| malformed(format!("object is not valid JSON: {e}")))?;
    if !value.is_object() || !value["metadata"].is_object() {
        return Err(malformed("object has no metadata".into()));
    }
    let field = |v: &serde_json::Value, f: &str| v[f].as_str().unwrap_or_default().to_string();
    let meta = &value["metadata"];
    let (name, namespace) = (field(meta, "name"), field(meta, "namespace"));
    let expected_namespace = match kind {
        Allowed::Namespace => "",
        _ => object.namespace.as_str(),
    };
    if field(&value, "kind") != object.kind
        || field(&value, "apiVersion") != object.api_version
        || name != object.name
        || namespace != expected_namespace
    {
        return Err(malformed(format!(
            "object {}/{} {namespace}/{name} does not match the envelope {}",
            field(&value, "apiVersion"),
            field(&value, "kind"),
            object.display_name()
        )));
    }
    Ok(value)
}

/// Who writes, and under which rules.
pub struct Judge<'a> {
    /// The tenant, from its certificate.
    pub tenant: &'a ClusterId,
    /// This provider.
    pub provider: &'a ClusterId,
    /// The tenant's policy.
    pub policy: &'a TenantPolicy,
    /// The provider's own networks, which no tenant endpoint may point into.
    pub networks: &'a ProviderNetworks,
    /// Namespace names no tenant may have.
    pub reserved: &'a ReservedNames,
}

impl Judge<'_> {
    /// The object as the provider will hold it: checked against the tenant's policy (refused,
    /// or normalized), fields only the API server sets removed, and the labels the remote
    /// agent owns stamped from the authenticated identity. The desired-state hash is left out.
    pub fn judge(
        &self,
        kind: Allowed,
        mut value: serde_json::Value,
    ) -> Result<serde_json::Value, ApplyError> {
        let malformed = |m: &str| ApplyError::Malformed(m.into());
        if !value.is_object() || !value["metadata"].is_object() {
            return Err(malformed("object has no metadata"));
        }
        if kind == Allowed::Namespace {
            let name = value["metadata"]["name"].as_str().unwrap_or_default();
            policy::namespace::check_name(
                name,
                self.tenant.as_str(),
                &self.policy.namespaces,
                self.reserved,
            )?;
        }
        policy::check(kind, &mut value, self.policy, self.networks)?;
        policy::strip_server_fields(&mut value);
        let meta = value["metadata"]
            .as_object_mut()
            .ok_or_else(|| malformed("object has no metadata"))?;
        let labels = meta
            .entry("labels")
            .or_insert_with(|| serde_json::json!({}));
        if !labels.is_object() {
            return Err(malformed("metadata.labels is not a map"));
        }
        labels[ORIGIN_LABEL] = self.tenant.as_str().into();
        labels[DESTINATION_LABEL] = self.provider.as_str().into();
        for (key, value) in kind.own_labels() {
            labels[*key] = (*value).into();
        }
        if kind == Allowed::Namespace {
            labels[TENANT_NAMESPACE_LABEL] = self.tenant.as_str().into();
            labels[PSA_ENFORCE_LABEL] = self.policy.pod_security.as_str().into();
        }
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| serde_json::json!({}));
        let Some(annotations) = annotations.as_object_mut() else {
            return Err(malformed("metadata.annotations is not a map"));
        };
        // Set by the applier, never by the tenant.
        annotations.remove(DESIRED_HASH_ANNOTATION);
        annotations.remove(ORIGIN_HASH_ANNOTATION);
        Ok(value)
    }
}
