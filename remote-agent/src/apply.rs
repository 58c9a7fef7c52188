//! Applying tenants' requests to the provider cluster: the one write path.
//!
//! [`Applier::apply`] takes a tenant's Upsert through, in order: the size limit; authorization
//! (a kind tenants may write, in a namespace labelled as that tenant's); decoding and the
//! envelope check; the tenant's policy ([`crate::policy`]), which refuses or normalizes; the
//! labels and annotations the remote agent owns, set from the authenticated identity whatever
//! the message says; references the pod makes (Secrets must be the tenant's); then a hash of
//! the desired state, and the write unless the provider already holds that hash. An object of
//! a custom kind is first tried against the provider's schema of the kind ([`schema`]). Restoring a
//! drifted copy ([`Applier::restore`]) goes through the same checks. An object of the same
//! name without the tenant's labels is foreign: never written, never deleted.
//!
//! Results are typed ([`Applied`], [`ApplyError`]); only the gRPC edge maps them to the wire.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};

use kube::api::{Api, DynamicObject, GetParams, ObjectMeta};
use kube::ResourceExt;
use refract_core::hash::{bytes_hash, desired_hash};
use refract_core::keys::{DESIRED_HASH_ANNOTATION, ORIGIN_HASH_ANNOTATION, SERVICE_ACCOUNT_LABEL};
use refract_core::lock::Locked;
use refract_core::options::Kind;
use refract_shared::journey::TARGET as JOURNEY;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{ObjectRef, Upsert};
use tracing::Instrument as _;

use crate::identity::Identities;
use crate::kinds::Allowed;
use crate::networks::SharedNetworks;
use crate::objects::TenantObjects;
use crate::policy::{self, Policies};
pub use deletion::DeletionSafety;
use desired::DesiredStore;
pub use desired::ObjectKey;
pub use error::{answer, Applied, ApplyError};
use judge::decode_desired;
use merge::{has_node_ports, keep_node_ports, merge_patch, OwnedKeys};
use reservations::Reservations;
use rules::Rules;
pub(crate) use strategy::keep;
pub use strategy::needs_managed_fields;
use strategy::{Purpose, Strategy};
pub(crate) use tokens::is_token_secret;
use tokens::token_kind;
use write::{Mode, Refused};

mod deletion;
pub mod desired;
mod error;
mod fences;
pub mod judge;
pub(crate) mod merge;
mod ownership;
mod packed;
mod references;
mod reservations;
mod rules;
mod schema;
mod strategy;
#[cfg(test)]
mod tests;
mod tokens;
mod write;

pub use refract_core::keys::ORIGINAL_NAME_ANNOTATION;

/// Writes tenants' objects into the provider cluster, each tenant's as that tenant
/// ([`crate::identity`]).
#[derive(Clone)]
pub struct Applier {
    /// The agent's own client (namespaces, fences) and each tenant's.
    identities: Identities,
    provider: ClusterId,
    /// What each tenant may have written, and the names none may take.
    rules: Arc<RwLock<Arc<Rules>>>,
    /// The provider's own networks, which no tenant endpoint may point into; kept current by
    /// [`crate::networks`].
    networks: SharedNetworks,
    /// The largest object (its JSON, in bytes) a tenant may send.
    max_object_bytes: usize,
    /// Which deletions wait for a grace period.
    safety: DeletionSafety,
    /// Namespace deletions waiting for their grace period.
    deferred: deletion::Deferred,
    /// Tenant objects (namespaces included) as the watch sees them: most checks cost no
    /// request.
    objects: TenantObjects,
    /// The desired state of every tenant object this process has been sent.
    pub desired: DesiredStore,
    /// Kinds whose API refuses guarded creates (see [`Purpose::Create`]): their new
    /// objects are read before being created.
    unguarded: Arc<Mutex<BTreeSet<Allowed>>>,
    /// Quota room taken by writes the watch has not shown yet.
    reservations: Arc<Reservations>,
    /// Counts the policy's changes, for what follows quotas (the virtual node's capacity).
    policies_changed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Copies rewritten on the provider: a copy the origin was asked to send again is
    /// counted as restored here, when the write shows it had changed.
    drift: Option<crate::restore::Drift>,
}

/// The result of one request.
pub type ApplyResult = Result<Applied, ApplyError>;

/// How an [`Applier`] judges tenants' objects.
#[derive(Debug, Clone)]
pub struct Limits {
    /// What each tenant may have written.
    pub policies: Policies,
    /// The provider's own networks.
    pub networks: policy::ProviderNetworks,
    /// The largest object (its JSON, in bytes) a tenant may send.
    pub max_object_bytes: usize,
    /// Which deletions wait for a grace period.
    pub safety: DeletionSafety,
    /// The namespace the remote agent runs in, which no tenant may have.
    pub own_namespace: String,
}

impl Applier {
    /// Tenant objects as the watch sees them.
    pub fn objects(&self) -> &TenantObjects {
        &self.objects
    }

    /// Tenants' identities.
    pub fn identities(&self) -> &Identities {
        &self.identities
    }

    /// An applier writing as `identities` say as provider `provider`, reading what the tenant
    /// objects' watch knows from `objects`.
    pub fn new(
        identities: Identities,
        provider: ClusterId,
        limits: Limits,
        objects: TenantObjects,
    ) -> Self {
        Self {
            identities,
            provider,
            rules: Arc::new(RwLock::new(Arc::new(Rules::new(
                limits.policies,
                limits.own_namespace,
            )))),
            networks: Arc::new(RwLock::new(limits.networks)),
            max_object_bytes: limits.max_object_bytes,
            safety: limits.safety,
            deferred: Arc::default(),
            objects,
            desired: DesiredStore::default(),
            unguarded: Arc::default(),
            reservations: Arc::default(),
            policies_changed: Arc::new(tokio::sync::watch::channel(0).0),
            drift: None,
        }
    }

    /// This applier, counting the restores it lands in `drift`.
    pub fn with_drift(mut self, drift: crate::restore::Drift) -> Self {
        self.drift = Some(drift);
        self
    }

    fn api(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        namespace: &str,
    ) -> Result<Api<DynamicObject>, kube::Error> {
        api_as(&self.identities, tenant, kind, namespace)
    }

    /// The agent's own client.
    fn own_client(&self) -> kube::Client {
        self.identities.own().clone()
    }

    /// Applies one Upsert for `tenant`: the one write path (see the module's documentation).
    pub async fn apply(&self, tenant: &ClusterId, upsert: &Upsert) -> ApplyResult {
        let object = upsert
            .object
            .as_ref()
            .ok_or_else(|| ApplyError::Malformed("Upsert without object".into()))?;
        let size = upsert.object_json.len();
        if size > self.max_object_bytes {
            return Err(ApplyError::TooLarge {
                size,
                limit: self.max_object_bytes,
            });
        }
        let judging = tracing::trace_span!(target: JOURNEY, "judge");
        let (kind, mut desired) = async {
            let kind = self.authorize(tenant, object).await?;
            let desired = decode_desired(kind, object, &upsert.object_json)?;
            if kind == Allowed::Namespace {
                self.keep_namespace(tenant, &object.name);
            }
            let desired = self.judged(tenant, kind, desired)?;
            if kind == Allowed::ShadowPod {
                self.check_references(tenant, &object.namespace, &desired)
                    .await?;
            }
            Ok::<_, ApplyError>((kind, desired))
        }
        .instrument(judging)
        .await?;
        let token = is_token_secret(kind, &desired);
        if token {
            self.own_token_secret(tenant, object, &mut desired).await?;
        }
        let key = ObjectKey {
            tenant: tenant.clone(),
            kind,
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        };
        self.take_room(&key, &mut desired, size)?;
        // What the tenant sent, for a reconnect to compare (see `crate::inventory`).
        desired["metadata"]["annotations"][ORIGIN_HASH_ANNOTATION] =
            bytes_hash(&upsert.object_json).into();
        // `object_hash` without its copy: `desired_object` left an annotations map without the
        // hash in it.
        let hash = desired_hash(&desired);
        desired["metadata"]["annotations"][DESIRED_HASH_ANNOTATION] = hash.clone().into();
        // The copy the origin was asked to send again, after someone changed it here: the
        // version that writer left, to tell whether this write changes it back. Only when
        // this is the same desired state again: a change of the tenant's is no restore.
        let resend = self
            .drift
            .as_ref()
            .and_then(|d| Some((d, d.take_awaited(&key)?)))
            .filter(|_| self.desired.holds_hash(&key, &hash));
        // Compared with the version just before this write, read from etcd: the other writer
        // may have written again since the change that asked for the resend (a volume
        // controller binds a claim in several writes), and a write that changes nothing
        // answers with that later version. One read per restore, which are few.
        let resend = match resend {
            Some((drift, Some(left))) => {
                let now = self.current_version(&key).await.ok().flatten();
                Some((drift, now.or(Some(left))))
            }
            other => other,
        };
        let written = match self.check_schema(&key, &desired, &hash).await {
            Ok(()) => {
                self.write_desired(key.clone(), desired, &hash, token)
                    .instrument(tracing::trace_span!(target: JOURNEY, "write"))
                    .await
            }
            Err(refused) => Err(refused),
        };
        self.after_write(&key, &written).await;
        if let (Some((drift, left)), Ok(Applied::Written)) = (resend, &written) {
            match left {
                None => drift.restored(&key, "deleted"),
                Some(left) if Some(&left) != self.desired.written_version(&key).as_ref() => {
                    drift.restored(&key, "changed")
                }
                // The write changed nothing: what was written there touched none of it.
                Some(_) => {}
            }
        }
        written
    }

    /// The resourceVersion of `key` on the provider now, read from etcd (`None`: absent).
    async fn current_version(&self, key: &ObjectKey) -> Result<Option<String>, kube::Error> {
        let api = self.api(&key.tenant, key.kind, &key.namespace)?;
        let meta = api
            .get_metadata_opt_with(&key.name, &GetParams::default())
            .await?;
        Ok(meta.and_then(|m| m.metadata.resource_version))
    }

    /// Writes `desired` (hashed `hash`) for `key` unless the provider holds it already.
    async fn write_desired(
        &self,
        key: ObjectKey,
        desired: serde_json::Value,
        hash: &str,
        token: bool,
    ) -> ApplyResult {
        let kind = key.kind;
        let (namespace, name) = (key.namespace.clone(), key.name.clone());
        let api = self.api(&key.tenant, kind, &namespace)?;
        let strategy = Strategy::of(kind, token);
        // The watch knows every object of ours: one it has is checked without a request, and
        // one it does not have is most likely new, so it is created in one request that cannot
        // take over an existing object. Only when that create finds the object there (someone
        // else's, or one written a moment ago), or the API refuses it, is its metadata read.
        let known = self.objects.get(kind, &namespace, &name);
        let mut consistent_read = false;
        match known {
            Some(known) => {
                if let Some(result) = self.settled(&key, token, hash, &known.metadata, &desired) {
                    return self.settle(result, key, desired, known.resource_version());
                }
                return self
                    .update(&api, key, desired, strategy, &known.metadata)
                    .await
                    .map_err(Refused::into_error);
            }
            None if self.guards_creates(kind) => {
                let create = Purpose::Create { guarded: true };
                let mode = strategy.mode(create);
                match self.write(&api, key.clone(), desired.clone(), mode).await {
                    Err(Refused::Exists) => consistent_read = true,
                    Err(Refused::GuardUnsupported) => {
                        // Concurrent first creates may all find out; say it once.
                        let new = self.unguarded.locked().insert(kind);
                        if new {
                            tracing::info!(
                                kind = kind.kind(),
                                "this API refuses guarded creates; reading new objects before creating them instead"
                            );
                        }
                    }
                    Err(Refused::Failed(error)) => return Err(error),
                    Ok(applied) => return Ok(applied),
                }
            }
            None => {}
        }
        // After a refused create the object exists: read it from etcd, not from the API
        // server's cache, which may not have it yet.
        let params = if consistent_read {
            GetParams::default()
        } else {
            GetParams::any()
        };
        let existing = api.get_metadata_opt_with(&name, &params).await?;
        if let Some(existing) = &existing {
            if let Some(result) = self.settled(&key, token, hash, &existing.metadata, &desired) {
                return self.settle(result, key, desired, existing.resource_version());
            }
        }
        let written = match &existing {
            Some(existing) => {
                self.update(&api, key, desired, strategy, &existing.metadata)
                    .await
            }
            None => {
                let create = Purpose::Create {
                    guarded: self.guards_creates(kind),
                };
                self.write(&api, key, desired, strategy.mode(create)).await
            }
        };
        written.map_err(Refused::into_error)
    }

    /// What to answer without writing, given the object on the provider: `Conflict` for a
    /// foreign object (or a Secret of the other sort), `Unchanged` when it holds the desired
    /// state; `None` when it must be written.
    fn settled(
        &self,
        key: &ObjectKey,
        token: bool,
        hash: &str,
        existing: &ObjectMeta,
        desired: &serde_json::Value,
    ) -> Option<ApplyResult> {
        let (tenant, kind) = (&key.tenant, key.kind);
        let shown = if key.namespace.is_empty() {
            key.name.clone()
        } else {
            format!("{}/{}", key.namespace, key.name)
        };
        // A copy this agent wrote for the tenant and then saw changed on the provider, down to
        // its labels, is still the tenant's: restoring it takes the labels back. An object that
        // replaced a deleted copy does not carry the agent's hash, and stays foreign.
        let drifted = self.desired.drifted(key);
        let written_by_us = existing
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(DESIRED_HASH_ANNOTATION));
        let restoring_our_copy = drifted && written_by_us;
        if !restoring_our_copy && !self.owns(tenant, kind, existing) {
            return Some(Err(ApplyError::Conflict(format!(
                "{} {} exists on cluster {:?} and was not reflected by {tenant}; left untouched",
                kind.kind(),
                shown,
                self.provider.as_str()
            ))));
        }
        if kind == Allowed::Namespace {
            let mirrored = existing
                .annotations
                .as_ref()
                .and_then(|a| a.get(ORIGINAL_NAME_ANNOTATION));
            let wanted = desired["metadata"]["annotations"][ORIGINAL_NAME_ANNOTATION].as_str();
            if let (Some(mirrored), Some(wanted)) = (mirrored, wanted) {
                if mirrored != wanted {
                    return Some(Err(ApplyError::Conflict(format!(
                        "namespace {} already mirrors origin namespace {mirrored:?}; two origin namespaces cannot share it (choose another remote name for {wanted:?})",
                        key.name
                    ))));
                }
            }
        }
        let existing_token = kind == Allowed::Reflected(Kind::Secret)
            && existing
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(SERVICE_ACCOUNT_LABEL));
        if token != existing_token {
            return Some(Err(ApplyError::Conflict(format!(
                "Secret {} exists as {} and cannot be replaced by {}; left untouched",
                shown,
                token_kind(existing_token),
                token_kind(token),
            ))));
        }
        if drifted {
            // Changed on the provider, and sent again by the origin to be restored: the copy
            // may still carry this very hash.
            return None;
        }
        let annotations = existing.annotations.as_ref();
        (annotations
            .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
            .map(String::as_str)
            == Some(hash))
        .then_some(Ok(Applied::Unchanged))
    }

    /// Returns a settled answer; an object found holding the desired state is remembered as
    /// written at `resource_version`.
    fn settle(
        &self,
        result: ApplyResult,
        key: ObjectKey,
        desired: serde_json::Value,
        resource_version: Option<String>,
    ) -> ApplyResult {
        if result == Ok(Applied::Unchanged) {
            let keep = keep(key.kind, &desired);
            self.desired.remember(key, &desired, keep, resource_version);
        }
        result
    }

    /// Whether creates of `kind` are guarded (see [`Purpose::Create`]).
    fn guards_creates(&self, kind: Allowed) -> bool {
        !self.unguarded.locked().contains(&kind)
    }

    /// Writes a change of an object the provider has, whose metadata is `existing`, the way
    /// `strategy` writes it.
    async fn update(
        &self,
        api: &Api<DynamicObject>,
        key: ObjectKey,
        desired: serde_json::Value,
        strategy: Strategy,
        existing: &ObjectMeta,
    ) -> Result<Applied, Refused> {
        let mode = strategy.mode(Purpose::Update);
        if strategy == Strategy::ServerSideApply {
            return self.write(api, key, desired, mode).await;
        }
        let managed = existing.managed_fields.as_deref().unwrap_or_default();
        let mut owned = OwnedKeys::of_managed_fields(managed);
        if let Some(previous) = self.desired.keys_of(&key) {
            owned.extend(previous);
        }
        // The watch holds metadata only: a read, for the rare update of a Service with node
        // ports, before anything is recorded.
        let live = if key.kind == Allowed::Reflected(Kind::Service) && has_node_ports(&desired) {
            api.get_opt(&key.name)
                .await
                .map_err(|e| Refused::Failed(e.into()))?
        } else {
            None
        };
        self.desired
            .begin_write(key.clone(), &desired, keep(key.kind, &desired));
        let mut patch = merge_patch(desired, &owned);
        if let Some(live) = live {
            keep_node_ports(&mut patch, &live.data);
        }
        self.send(api, key, patch, mode).await
    }

    /// Writes `desired`, recording it as the agent's own write while it is under way (so its
    /// watch events are never taken for someone else's edit).
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        key: ObjectKey,
        desired: serde_json::Value,
        mode: Mode,
    ) -> Result<Applied, Refused> {
        self.desired
            .begin_write(key.clone(), &desired, keep(key.kind, &desired));
        self.send(api, key, desired, mode).await
    }

    /// Sends `body`, which makes the object what [`DesiredStore::begin_write`] just recorded
    /// for `key`, and records how the write ended.
    async fn send(
        &self,
        api: &Api<DynamicObject>,
        key: ObjectKey,
        body: serde_json::Value,
        mode: Mode,
    ) -> Result<Applied, Refused> {
        match write::write(api, &key.name, body, mode).await {
            Ok(rv) => {
                self.desired.set_written(&key, rv);
                Ok(Applied::Written)
            }
            Err(Refused::Failed(error)) => {
                self.desired.set_uncertain(&key);
                Err(Refused::Failed(error))
            }
            // Nothing was written: the object is not ours to remember (yet).
            Err(refused) => {
                self.desired.abandon_write(&key);
                Err(refused)
            }
        }
    }

    /// Re-applies a remembered desired object (restoring a copy edited or deleted on the
    /// provider), through the same checks as a tenant's request. `observed` is the
    /// resourceVersion of the edited copy: the apply only succeeds if nothing wrote the object
    /// since, so a restore can never overwrite a newer write of the tenant's.
    pub async fn restore(
        &self,
        key: &ObjectKey,
        desired: &serde_json::Value,
        observed: Option<&str>,
    ) -> ApplyResult {
        let mut judged = self.judged(&key.tenant, key.kind, desired.clone())?;
        let token = is_token_secret(key.kind, desired);
        if token {
            // Owned by its ShadowPod as it is now: one restored with its namespace is a new
            // object, and a Secret naming the old one would be taken by the garbage collector.
            self.own_token_secret(&key.tenant, &key.object_ref(), &mut judged)
                .await?;
        }
        if let Some(origin) = desired["metadata"]["annotations"][ORIGIN_HASH_ANNOTATION].as_str() {
            judged["metadata"]["annotations"][ORIGIN_HASH_ANNOTATION] = origin.into();
        }
        judged["metadata"]["annotations"][DESIRED_HASH_ANNOTATION] = desired_hash(&judged).into();
        if let Some(rv) = observed {
            judged["metadata"]["resourceVersion"] = rv.into();
        }
        if key.kind != Allowed::Namespace {
            // A namespace restored a moment ago has no binding yet.
            self.tenant_namespace(&key.tenant, &key.namespace).await?;
        }
        let api = self.api(&key.tenant, key.kind, &key.namespace)?;
        let mode = Strategy::of(key.kind, token).mode(Purpose::Restore);
        let rv = write::write(&api, &key.name, judged, mode)
            .await
            .map_err(Refused::into_error)?;
        self.desired.set_written(key, rv);
        if key.kind == Allowed::Namespace {
            // Its binding and quota went with the namespace deleted. A failure is retried by
            // the next write in it (see `tenant_namespace`).
            if let Err(error) = self.write_fences(&key.tenant, &key.name).await {
                tracing::warn!(tenant = %key.tenant, namespace = %key.name, %error, "failed to write the restored namespace's fences");
            }
        }
        Ok(Applied::Written)
    }

    /// The provider's own networks, for [`crate::networks`] to keep current.
    pub fn networks(&self) -> SharedNetworks {
        self.networks.clone()
    }
}

/// The API of `kind` in `namespace` as `tenant` acts on it: namespaces with the agent's own
/// identity (no tenant may create one), anything else as the tenant, so the API server refuses
/// whatever lies outside the tenant's namespaces.
fn api_as(
    identities: &Identities,
    tenant: &ClusterId,
    kind: Allowed,
    namespace: &str,
) -> Result<Api<DynamicObject>, kube::Error> {
    let ar = kind.resource();
    Ok(match kind {
        Allowed::Namespace => Api::all_with(identities.own().clone(), &ar),
        _ => Api::namespaced_with(identities.client(tenant)?, namespace, &ar),
    })
}

/// A test hook, used by the end-to-end test of tenant identities only: writes `object` (its
/// name from its metadata) as `tenant` into `namespace` the way every tenant write reaches the
/// API server, without any of the agent's own checks. Aimed at a namespace that is not the
/// tenant's, the API server itself must refuse it.
#[doc(hidden)]
pub async fn write_unchecked(
    identities: &Identities,
    tenant: &ClusterId,
    kind: Allowed,
    namespace: &str,
    object: serde_json::Value,
) -> Result<(), ApplyError> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api = api_as(identities, tenant, kind, namespace)?;
    write::write(&api, &name, object, Mode::Apply)
        .await
        .map(drop)
        .map_err(Refused::into_error)
}

pub(crate) trait DisplayName {
    fn display_name(&self) -> String;
}

impl DisplayName for ObjectRef {
    fn display_name(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}
