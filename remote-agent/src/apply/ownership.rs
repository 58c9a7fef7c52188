//! Ownership: which provider objects are a tenant's (its labels, never its name), and whether
//! a request's kind and namespace are the tenant's to write.

use kube::api::ObjectMeta;
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL, TENANT_NAMESPACE_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::ObjectRef;

use super::{Applier, ApplyError};
use crate::kinds::Allowed;

impl Applier {
    /// Whether an object with `meta` is `tenant`'s on this provider: its origin and
    /// destination labels.
    pub(super) fn is_ours(&self, tenant: &ClusterId, meta: &ObjectMeta) -> bool {
        let label = |k: &str| {
            meta.labels
                .as_ref()
                .and_then(|l| l.get(k))
                .map(String::as_str)
        };
        label(ORIGIN_LABEL) == Some(tenant.as_str())
            && label(DESTINATION_LABEL) == Some(self.provider.as_str())
    }

    /// Whether an object of `kind` with `meta` is `tenant`'s: a namespace by its tenant label,
    /// anything else by its origin and destination labels and the kind's own
    /// ([`Allowed::own_labels`]: a slice the provider's controller made for a reflected
    /// Service carries the Service's labels, and is not the tenant's).
    pub(super) fn owns(&self, tenant: &ClusterId, kind: Allowed, meta: &ObjectMeta) -> bool {
        match kind {
            Allowed::Namespace => {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(TENANT_NAMESPACE_LABEL))
                    .map(String::as_str)
                    == Some(tenant.as_str())
            }
            _ => {
                self.is_ours(tenant, meta)
                    && kind.own_labels().iter().all(|(key, value)| {
                        meta.labels
                            .as_ref()
                            .and_then(|l| l.get(*key))
                            .map(String::as_str)
                            == Some(*value)
                    })
            }
        }
    }

    /// Whether `namespace` exists and belongs to `tenant`. Answered from the watch of tenant
    /// namespaces when it knows the namespace as the tenant's; asked of the API server
    /// otherwise (a namespace created a moment ago may not have reached the watch yet).
    pub(super) async fn owns_namespace(
        &self,
        tenant: &ClusterId,
        namespace: &str,
    ) -> Result<bool, ApplyError> {
        if self
            .objects
            .has_live_namespace(namespace, TENANT_NAMESPACE_LABEL, tenant.as_str())
        {
            return Ok(true);
        }
        let ns = self
            .api(tenant, Allowed::Namespace, "")?
            .get_opt(namespace)
            .await?;
        Ok(ns.is_some_and(|ns| self.owns(tenant, Allowed::Namespace, &ns.metadata)))
    }

    /// Checks a request's kind and namespace against the tenant's rights.
    pub(super) async fn authorize(
        &self,
        tenant: &ClusterId,
        object: &ObjectRef,
    ) -> Result<Allowed, ApplyError> {
        let kind = Allowed::lookup(&object.api_version, &object.kind).ok_or_else(|| {
            ApplyError::KindNotAllowed {
                api_version: object.api_version.clone(),
                kind: object.kind.clone(),
            }
        })?;
        if kind != Allowed::Namespace {
            self.tenant_namespace(tenant, &object.namespace).await?;
        }
        Ok(kind)
    }

    /// Checks that `namespace` is `tenant`'s, and that the tenant's identity may write there
    /// (its binding, written once per namespace in this process).
    pub(super) async fn tenant_namespace(
        &self,
        tenant: &ClusterId,
        namespace: &str,
    ) -> Result<(), ApplyError> {
        if !self.owns_namespace(tenant, namespace).await? {
            return Err(ApplyError::NotTenantNamespace {
                tenant: tenant.clone(),
                namespace: namespace.to_string(),
            });
        }
        self.identities
            .bind(tenant, namespace)
            .await
            .map_err(|e| ApplyError::Transient(e.to_string()))
    }
}
