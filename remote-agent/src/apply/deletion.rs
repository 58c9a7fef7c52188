//! Deletion safety: what a tenant's request may delete at once.
//!
//! Two deletions wait for a grace period instead of happening at once, and say so in the
//! remote agent's log and in the answer: a twin namespace that holds PersistentVolumeClaims
//! (deleting it deletes the tenant's data), and an orphan collection that would remove more
//! than a share of the tenant's objects of a kind in a namespace (an empty or wrong snapshot
//! looks exactly like that). A namespace deletion still waiting is called off when the tenant
//! offloads the namespace again; a collection still waiting is called off when the stream
//! that asked for it is replaced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use tokio_util::sync::CancellationToken;

use super::{Applied, Applier, ApplyError};
use crate::kinds::Allowed;

/// How deletions are held back.
#[derive(Debug, Clone, Copy)]
pub struct DeletionSafety {
    /// How long a held-back deletion waits.
    pub grace: Duration,
    /// The share of a tenant's objects (of a kind, in a namespace) one collection may remove
    /// without waiting, in percent.
    pub max_share_percent: u8,
    /// Collections removing fewer objects than this never wait.
    pub min_count: usize,
}

impl Default for DeletionSafety {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(300),
            max_share_percent: 50,
            min_count: 10,
        }
    }
}

impl DeletionSafety {
    /// Whether removing `removing` of `total` objects at once must wait.
    pub fn holds_back(&self, removing: usize, total: usize) -> bool {
        removing >= self.min_count && removing * 100 > usize::from(self.max_share_percent) * total
    }
}

/// Namespace deletions waiting for their grace period, by tenant and namespace.
pub(super) type Deferred = Arc<Mutex<HashMap<(ClusterId, String), CancellationToken>>>;

impl Applier {
    /// Deletes `tenant`'s twin namespace, or schedules its deletion after the grace period
    /// when it holds claims.
    pub(super) async fn delete_namespace(
        &self,
        tenant: &ClusterId,
        name: &str,
        unchanged_since: Option<String>,
    ) -> Result<Applied, ApplyError> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), name);
        let held = claims
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        if held == 0 {
            return self
                .delete_now(tenant, Allowed::Namespace, "", name, None, unchanged_since)
                .await;
        }
        let key = (tenant.clone(), name.to_string());
        let grace = self.safety.grace;
        let token = {
            let mut deferred = self.deferred.locked();
            if deferred.contains_key(&key) {
                return Ok(Applied::Deferred(format!(
                    "namespace {name} holds {held} PersistentVolumeClaims; its deletion is already scheduled"
                )));
            }
            let token = CancellationToken::new();
            deferred.insert(key.clone(), token.clone());
            token
        };
        let message = format!(
            "namespace {name} holds {held} PersistentVolumeClaims: deleting it in {grace:?} unless the tenant offloads it again"
        );
        tracing::warn!(%tenant, namespace = %name, claims = held, ?grace, "twin namespace holds claims; its deletion waits for the grace period");
        let applier = self.clone();
        let tenant = tenant.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            tokio::select! {
                _ = token.cancelled() => {
                    tracing::info!(%tenant, namespace = %name, "scheduled deletion of a twin namespace called off: offloaded again");
                    return;
                }
                _ = tokio::time::sleep(grace) => {}
            }
            applier.deferred.locked().remove(&key);
            let result = applier
                .delete_now(
                    &tenant,
                    Allowed::Namespace,
                    "",
                    &name,
                    None,
                    unchanged_since,
                )
                .await;
            tracing::info!(%tenant, namespace = %name, ?result, "grace period over; deleted the twin namespace");
        });
        Ok(Applied::Deferred(message))
    }

    /// Calls off a scheduled deletion of `tenant`'s namespace `name` (it is offloaded again).
    pub(super) fn keep_namespace(&self, tenant: &ClusterId, name: &str) {
        let key = (tenant.clone(), name.to_string());
        if let Some(token) = self.deferred.locked().remove(&key) {
            token.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_shares_of_enough_objects_wait() {
        let s = DeletionSafety::default();
        assert!(!s.holds_back(1, 1), "one object of one never waits");
        assert!(!s.holds_back(9, 9));
        assert!(s.holds_back(10, 10));
        assert!(s.holds_back(11, 20));
        assert!(!s.holds_back(10, 20), "exactly half is allowed");
        assert!(!s.holds_back(10, 100));
    }
}
