//! What a tenant's pod refers to on the provider: every Secret it reads must be the tenant's
//! own (reflected or a token Secret), never one of the provider's, such as the legacy token
//! Secret the provider's controller made for the namespace's `default` ServiceAccount.

use kube::api::GetParams;
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;

use super::{Applier, ApplyError};
use crate::kinds::Allowed;
use crate::policy;

impl Applier {
    /// Refuses a ShadowPod whose pod reads a Secret that exists and is not the tenant's. A
    /// Secret not there yet is fine: only the tenant can create it in its namespace.
    pub(super) async fn check_references(
        &self,
        tenant: &ClusterId,
        namespace: &str,
        shadow: &serde_json::Value,
    ) -> Result<(), ApplyError> {
        let spec: k8s_openapi::api::core::v1::PodSpec =
            policy::decode(&shadow["spec"]["pod"], "spec.pod")?;
        let kind = Allowed::Reflected(Kind::Secret);
        for name in policy::secrets_read(&spec) {
            let meta = match self.objects.get(kind, namespace, &name) {
                Some(known) => Some(known.metadata),
                None => self
                    .api(tenant, kind, namespace)?
                    .get_metadata_opt_with(&name, &GetParams::any())
                    .await?
                    .map(|m| m.metadata),
            };
            if meta.is_some_and(|m| !self.is_ours(tenant, &m)) {
                return Err(ApplyError::Reference(format!(
                    "the pod reads Secret {namespace}/{name}, which is the provider's, not the tenant's"
                )));
            }
        }
        Ok(())
    }
}
