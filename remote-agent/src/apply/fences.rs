//! What fences each twin namespace, written by the agent's own identity (no tenant may change
//! them): the RoleBinding that lets the tenant's identity write there ([`crate::identity`]),
//! the ResourceQuota and LimitRange of its quota ([`crate::quota::backstop`]), and its
//! NetworkPolicy ([`crate::network_fence`]). Written when the namespace is written, at start,
//! when the policy changes, and (the NetworkPolicy) when the provider's networks change.

use k8s_openapi::api::core::v1::{LimitRange, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use refract_core::keys::REMOTE_FIELD_MANAGER;
use refract_core::lock::RwLocked as _;
use refract_shared::tls::ClusterId;

use super::{Applier, ApplyError};
use crate::network_fence;
use crate::quota::backstop;

impl Applier {
    /// Writes the fences of `tenant`'s twin namespace `namespace`: its binding, then its
    /// ResourceQuota and LimitRange as its quota says (deleted when the quota limits nothing
    /// they would hold). Callers must have checked the namespace is the tenant's.
    pub async fn write_fences(
        &self,
        tenant: &ClusterId,
        namespace: &str,
    ) -> Result<(), ApplyError> {
        // Written again even if this process wrote it before: the namespace may have been
        // deleted and created again since, without it.
        self.identities.forget(namespace);
        self.identities
            .bind(tenant, namespace)
            .await
            .map_err(|e| ApplyError::Transient(e.to_string()))?;
        let quota = self.quota_of(tenant);
        let quotas: Api<ResourceQuota> = Api::namespaced(self.own_client(), namespace);
        keep(
            &quotas,
            backstop::NAME,
            backstop::resource_quota(namespace, &quota),
        )
        .await?;
        let ranges: Api<LimitRange> = Api::namespaced(self.own_client(), namespace);
        keep(
            &ranges,
            backstop::NAME,
            backstop::limit_range(namespace, &quota),
        )
        .await?;
        let fence = self.network_fence_of(tenant);
        let networks = self.networks.read_locked().cidrs.clone();
        let policy = network_fence::network_policy(namespace, tenant, &fence, &networks);
        let policies: Api<NetworkPolicy> = Api::namespaced(self.own_client(), namespace);
        keep(&policies, network_fence::NAME, policy).await?;
        Ok(())
    }

    /// Writes the fences of every twin namespace the watch has, as the policy now in force
    /// says; a failure is logged and the others go on.
    pub async fn write_all_fences(&self) {
        let namespaces = self.objects.tenant_namespaces();
        let mut failed = 0;
        for (namespace, tenant) in &namespaces {
            if let Err(error) = self.write_fences(tenant, namespace).await {
                failed += 1;
                tracing::warn!(%tenant, %namespace, %error, "failed to write the twin namespace's fences");
            }
        }
        tracing::info!(
            namespaces = namespaces.len(),
            failed,
            "each twin namespace's tenant binding, ResourceQuota, LimitRange and NetworkPolicy written"
        );
    }
}

/// Applies `desired` as `name`, or deletes that object when there is none to have.
async fn keep<K>(
    api: &Api<K>,
    name: &str,
    desired: Option<serde_json::Value>,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match desired {
        Some(object) => {
            let params = PatchParams::apply(REMOTE_FIELD_MANAGER).force();
            api.patch(name, &params, &Patch::Apply(object))
                .await
                .map(drop)
        }
        None => match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        },
    }
}
