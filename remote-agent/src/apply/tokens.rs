//! Pods' ServiceAccount token Secrets: a Secret kind of its own on the provider.
//!
//! A token Secret (labelled with the service account) belongs to one pod: it must be named
//! after it, its ShadowPod must be the tenant's, and it is owned by that ShadowPod so it goes
//! with the pod. It never replaces a reflected Secret of the same name, nor the reverse.

use kube::ResourceExt;
use refract_core::forge::token::token_secret_name;
use refract_core::keys::{FOR_POD_ANNOTATION, SERVICE_ACCOUNT_LABEL};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::ObjectRef;

use super::{Applier, ApplyError};
use crate::kinds::Allowed;

impl Applier {
    /// Ties a pod's token Secret to the pod's ShadowPod (owner reference), so it goes with the
    /// pod even if the origin never says so. A token Secret must be named after its pod, and
    /// that pod's ShadowPod must be the tenant's: tokens are never mounted anywhere else.
    pub(super) async fn own_token_secret(
        &self,
        tenant: &ClusterId,
        object: &ObjectRef,
        desired: &mut serde_json::Value,
    ) -> Result<(), ApplyError> {
        let pod = desired["metadata"]["annotations"][FOR_POD_ANNOTATION]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if pod.is_empty() || token_secret_name(&pod) != object.name {
            return Err(ApplyError::Malformed(format!(
                "a token Secret must be named <pod>-token after its {FOR_POD_ANNOTATION} annotation ({pod:?})"
            )));
        }
        let shadow = self
            .api(tenant, Allowed::ShadowPod, &object.namespace)?
            .get_opt(&pod)
            .await?
            .filter(|s| self.is_ours(tenant, &s.metadata))
            .ok_or_else(|| {
                ApplyError::Reference(format!(
                    "no ShadowPod {}/{pod} of tenant {tenant} for these tokens",
                    object.namespace
                ))
            })?;
        desired["metadata"]["ownerReferences"] = serde_json::json!([{
            "apiVersion": refract_core::forge::pod::SHADOWPOD_API_VERSION,
            "kind": "ShadowPod",
            "name": pod,
            "uid": shadow.uid().unwrap_or_default(),
        }]);
        Ok(())
    }
}

/// Whether `object` (of `kind`) is a pod's token Secret rather than a reflected Secret.
pub(crate) fn is_token_secret(kind: Allowed, object: &serde_json::Value) -> bool {
    kind == Allowed::Reflected(Kind::Secret)
        && object["metadata"]["labels"][SERVICE_ACCOUNT_LABEL].is_string()
}

pub(super) fn token_kind(token: bool) -> &'static str {
    if token {
        "a pod's ServiceAccount token Secret"
    } else {
        "a reflected Secret"
    }
}
