//! Deletion: a tenant's Delete, its orphan collection after a snapshot, and what a request
//! may delete at once. A foreign object is never deleted.
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
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Preconditions};
use kube::ResourceExt;
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL, SERVICE_ACCOUNT_LABEL};
use refract_core::lock::Locked;
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::Delete;
use tokio_util::sync::CancellationToken;

use super::{Applied, Applier, ApplyError, ApplyResult, ObjectKey};
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
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.own_client(), name);
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

/// A tenant's deletions.
impl Applier {
    /// Applies one Delete for `tenant`. A foreign object is never deleted.
    pub async fn delete(&self, tenant: &ClusterId, delete: &Delete) -> ApplyResult {
        let object = delete
            .object
            .as_ref()
            .ok_or_else(|| ApplyError::Malformed("Delete without object".into()))?;
        let kind = match Allowed::lookup(&object.api_version, &object.kind) {
            Some(Allowed::Namespace) => Allowed::Namespace,
            _ => self.authorize(tenant, object).await?,
        };
        let key = ObjectKey {
            tenant: tenant.clone(),
            kind,
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        };
        self.desired.forget(&key);
        // From now on the watch says what it holds, until it is gone.
        self.reservations.release(&key);
        self.delete_owned(
            tenant,
            kind,
            &object.namespace,
            &object.name,
            delete.grace_period_seconds,
            None,
        )
        .await
    }

    /// Deletes `tenant`'s object, if it is the tenant's. With `unchanged_since`, only if
    /// nothing has written it since that resourceVersion. A twin namespace holding claims is
    /// deleted after the grace period (see the module's documentation).
    async fn delete_owned(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        namespace: &str,
        name: &str,
        grace: Option<i64>,
        unchanged_since: Option<String>,
    ) -> ApplyResult {
        if kind != Allowed::Namespace {
            return self
                .delete_now(tenant, kind, namespace, name, grace, unchanged_since)
                .await;
        }
        if self.owned_meta(tenant, kind, "", name).await?.is_none() {
            return Ok(Applied::AlreadyAbsent);
        }
        self.delete_namespace(tenant, name, unchanged_since).await
    }

    /// The metadata of `tenant`'s object as the API server has it: `None` when it is absent,
    /// `Conflict` when it is someone else's.
    async fn owned_meta(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, ApplyError> {
        let Some(existing) = self
            .api(tenant, kind, namespace)?
            .get_metadata_opt(name)
            .await?
        else {
            return Ok(None);
        };
        if !self.owns(tenant, kind, &existing.metadata) {
            return Err(ApplyError::Conflict(format!(
                "{} {namespace}/{name} is not the tenant's; left untouched",
                kind.kind()
            )));
        }
        Ok(Some(existing.metadata))
    }

    /// Deletes `tenant`'s object now, if it is the tenant's (see [`Applier::delete_owned`]).
    async fn delete_now(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        namespace: &str,
        name: &str,
        grace: Option<i64>,
        unchanged_since: Option<String>,
    ) -> ApplyResult {
        let Some(existing) = self.owned_meta(tenant, kind, namespace, name).await? else {
            return Ok(Applied::AlreadyAbsent);
        };
        let guarded = unchanged_since.is_some();
        if guarded && existing.resource_version != unchanged_since {
            return Ok(Applied::WrittenSince);
        }
        if kind == Allowed::ShadowPod {
            // Stop the pod with the origin's grace period; the ShadowPod's own deletion would
            // leave it to the garbage collector with the pod's default.
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(self.identities.client(tenant)?, namespace);
            let params = DeleteParams {
                grace_period_seconds: grace.map(|g| g.max(0) as u32),
                ..Default::default()
            };
            match pods.delete(name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: existing.uid,
                resource_version: unchanged_since,
            }),
            ..Default::default()
        };
        if let Some(g) = grace {
            params.grace_period_seconds = Some(g.max(0) as u32);
        }
        match self
            .api(tenant, kind, namespace)?
            .delete(name, &params)
            .await
        {
            Ok(_) => {
                if kind == Allowed::Namespace {
                    self.identities.forget(name);
                }
                Ok(Applied::Deleted)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Applied::AlreadyAbsent),
            // The resourceVersion precondition failed: written meanwhile, so it stays.
            Err(kube::Error::Api(s)) if guarded && s.code == 409 => Ok(Applied::WrittenSince),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes `tenant`'s objects of `kind` in `namespace` that `keep` does not name: called
    /// only after the tenant said it sent every such object (SnapshotComplete).
    ///
    /// The tenant's stream goes on meanwhile, so `keep` is asked about each object just before
    /// it is deleted (an Upsert received since the SnapshotComplete counts), and the delete
    /// holds only while the object is as listed: one written since (by an Upsert received
    /// after that check) stays. An Upsert answered `Unchanged` in that gap is remembered after
    /// the object is forgotten here, so the restorer re-creates the object from it.
    pub async fn delete_orphans(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        namespace: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, ApplyError> {
        if kind != Allowed::Namespace {
            match self.tenant_namespace(tenant, namespace).await {
                Err(ApplyError::NotTenantNamespace { .. }) => return Ok(Vec::new()),
                checked => checked?,
            }
        }
        let mut selector = format!(
            "{ORIGIN_LABEL}={tenant},{DESTINATION_LABEL}={}",
            self.provider
        );
        // Token Secrets follow their ShadowPod (owner reference), not the Secret snapshot.
        if kind == Allowed::Reflected(Kind::Secret) {
            selector.push_str(&format!(",!{SERVICE_ACCOUNT_LABEL}"));
        }
        let list = self
            .api(tenant, kind, namespace)?
            .list_metadata(&ListParams::default().labels(&selector))
            .await?;
        let total = list.items.len();
        let orphans: Vec<_> = list
            .items
            .into_iter()
            .filter(|o| !keep(&o.name_any()))
            .collect();
        if self.safety.holds_back(orphans.len(), total) {
            let grace = self.safety.grace;
            tracing::warn!(
                %tenant, kind = kind.kind(), %namespace, removing = orphans.len(), of = total, ?grace,
                "the tenant's snapshot would remove most of its objects at once; waiting for the grace period first"
            );
            tokio::time::sleep(grace).await;
        }
        let mut deleted = Vec::new();
        for obj in orphans {
            let name = obj.name_any();
            if keep(&name) {
                continue;
            }
            self.desired.forget(&ObjectKey {
                tenant: tenant.clone(),
                kind,
                namespace: namespace.to_string(),
                name: name.clone(),
            });
            let result = self
                .delete_owned(tenant, kind, namespace, &name, None, obj.resource_version())
                .await;
            if result == Ok(Applied::Deleted) {
                deleted.push(name);
            }
        }
        Ok(deleted)
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
