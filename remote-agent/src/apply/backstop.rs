//! Writing each twin namespace's ResourceQuota and LimitRange ([`crate::quota::backstop`]):
//! when the namespace is written, at start, and when the policy changes.

use k8s_openapi::api::core::v1::{LimitRange, ResourceQuota};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use refract_core::keys::REMOTE_FIELD_MANAGER;
use refract_shared::tls::ClusterId;

use super::Applier;
use crate::quota::backstop;

impl Applier {
    /// Writes the ResourceQuota and LimitRange of `tenant`'s twin namespace `namespace` as its
    /// quota says, or deletes them when the quota limits nothing they would hold.
    pub async fn write_backstop(
        &self,
        tenant: &ClusterId,
        namespace: &str,
    ) -> Result<(), kube::Error> {
        let quota = self.quota_of(tenant);
        let quotas: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        keep(&quotas, backstop::resource_quota(namespace, &quota)).await?;
        let ranges: Api<LimitRange> = Api::namespaced(self.client.clone(), namespace);
        keep(&ranges, backstop::limit_range(namespace, &quota)).await
    }

    /// Writes the backstop of every twin namespace the watch has, as the policy now in force
    /// says; a failure is logged and the others go on.
    pub async fn write_backstops(&self) {
        let namespaces = self.objects.tenant_namespaces();
        let mut failed = 0;
        for (namespace, tenant) in &namespaces {
            if let Err(error) = self.write_backstop(tenant, namespace).await {
                failed += 1;
                tracing::warn!(%tenant, %namespace, %error, "failed to write the namespace's ResourceQuota and LimitRange");
            }
        }
        tracing::info!(
            namespaces = namespaces.len(),
            failed,
            "tenant quotas written to each twin namespace's ResourceQuota and LimitRange"
        );
    }
}

/// Applies `desired`, or deletes the object when there is none to have.
async fn keep<K>(api: &Api<K>, desired: Option<serde_json::Value>) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match desired {
        Some(object) => {
            let params = PatchParams::apply(REMOTE_FIELD_MANAGER).force();
            api.patch(backstop::NAME, &params, &Patch::Apply(object))
                .await
                .map(drop)
        }
        None => match api.delete(backstop::NAME, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        },
    }
}
