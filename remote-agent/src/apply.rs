//! Applying tenants' requests to the provider cluster.
//!
//! Every write is checked against the tenant taken from the client certificate: namespaced
//! objects go only into namespaces labelled as that tenant's, and only the allowed kinds. The
//! origin and destination labels are set here from the authenticated identity, whatever the
//! message says. An object of the same name without those labels is foreign: never written,
//! never deleted (`Conflict`). A hash of the desired state is stored on each object; a request
//! whose hash matches is answered `Unchanged` without a write.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use kube::api::{
    Api, DeleteParams, DynamicObject, GetParams, ListParams, ObjectMeta, Preconditions,
};
use kube::ResourceExt;
use refract_shared::forge::token::SERVICE_ACCOUNT_LABEL;
use refract_shared::hash::desired_hash;
use refract_shared::keys::{
    DESIRED_HASH_ANNOTATION, DESTINATION_LABEL, ORIGIN_LABEL, TENANT_NAMESPACE_LABEL,
};
use refract_shared::options::Kind;
use refract_shared::proto::{Delete, ObjectRef, Outcome, Upsert};
use refract_shared::tls::ClusterId;

use crate::desired::DesiredStore;
pub use crate::desired::ObjectKey;
use crate::kinds::Allowed;
use crate::objects::TenantObjects;
use merge::{merge_patch, writes_without_apply, OwnedKeys};
use tokens::{is_token_secret, token_kind};
use write::{Mode, Refused};

pub(crate) mod merge;
mod tokens;
mod write;

/// Annotation on a twin namespace: the origin namespace it mirrors.
pub const ORIGINAL_NAME_ANNOTATION: &str = "refract.io/original-name";

/// Writes tenants' objects into the provider cluster with the remote agent's own identity.
#[derive(Clone)]
pub struct Applier {
    client: kube::Client,
    provider: ClusterId,
    pod_security_level: String,
    /// Tenant objects (namespaces included) as the watch sees them: most checks cost no
    /// request.
    objects: TenantObjects,
    /// The desired state of every tenant object this process has been sent.
    pub desired: DesiredStore,
    /// Kinds whose API refuses guarded creates (see [`write::Mode::CreateOnly`]): their new
    /// objects are checked against a watch of every object of the kind where there is one
    /// ([`TenantObjects::sees_every`]), read before being created otherwise.
    unguarded: Arc<Mutex<BTreeSet<Allowed>>>,
}

/// The result of one request.
pub type Answer = (Outcome, String);

fn api_error(e: kube::Error) -> Answer {
    match e {
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => (Outcome::Invalid, s.message),
        kube::Error::Api(s) if s.code == 403 => (
            Outcome::Denied,
            format!("provider API refused: {}", s.message),
        ),
        other => (Outcome::Transient, other.to_string()),
    }
}

impl Applier {
    /// An applier writing with `client` as provider `provider`, reading what the tenant
    /// objects' watch knows from `objects`.
    pub fn new(
        client: kube::Client,
        provider: ClusterId,
        pod_security_level: String,
        objects: TenantObjects,
    ) -> Self {
        Self {
            client,
            provider,
            pod_security_level,
            objects,
            desired: DesiredStore::default(),
            unguarded: Arc::default(),
        }
    }

    fn api(&self, kind: Allowed, namespace: &str) -> Api<DynamicObject> {
        let ar = kind.resource();
        match kind {
            Allowed::Namespace => Api::all_with(self.client.clone(), &ar),
            _ => Api::namespaced_with(self.client.clone(), namespace, &ar),
        }
    }

    fn is_ours(&self, tenant: &ClusterId, meta: &ObjectMeta) -> bool {
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
    /// anything else by its origin and destination labels.
    fn owns(&self, tenant: &ClusterId, kind: Allowed, meta: &ObjectMeta) -> bool {
        match kind {
            Allowed::Namespace => {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(TENANT_NAMESPACE_LABEL))
                    .map(String::as_str)
                    == Some(tenant.as_str())
            }
            _ => self.is_ours(tenant, meta),
        }
    }

    /// Whether `namespace` exists and belongs to `tenant`. Answered from the watch of tenant
    /// namespaces when it knows the namespace as the tenant's; asked of the API server
    /// otherwise (a namespace created a moment ago may not have reached the watch yet).
    async fn owns_namespace(&self, tenant: &ClusterId, namespace: &str) -> Result<bool, Answer> {
        let owned = |meta: &ObjectMeta| self.owns(tenant, Allowed::Namespace, meta);
        let cached = self.objects.get(Allowed::Namespace, "", namespace);
        if cached.is_some_and(|ns| owned(&ns.metadata) && ns.metadata.deletion_timestamp.is_none())
        {
            return Ok(true);
        }
        let ns = self
            .api(Allowed::Namespace, "")
            .get_opt(namespace)
            .await
            .map_err(api_error)?;
        Ok(ns.is_some_and(|ns| owned(&ns.metadata)))
    }

    /// Checks a request's kind and namespace against the tenant's rights.
    async fn authorize(&self, tenant: &ClusterId, object: &ObjectRef) -> Result<Allowed, Answer> {
        let kind = Allowed::lookup(&object.api_version, &object.kind).ok_or_else(|| {
            (
                Outcome::Denied,
                format!(
                    "{} {} is not a kind tenants may write",
                    object.api_version, object.kind
                ),
            )
        })?;
        if kind != Allowed::Namespace && !self.owns_namespace(tenant, &object.namespace).await? {
            return Err((
                Outcome::Denied,
                format!(
                    "namespace {:?} is not a namespace of tenant {tenant}",
                    object.namespace
                ),
            ));
        }
        Ok(kind)
    }

    /// Applies one Upsert for `tenant`.
    pub async fn upsert(&self, tenant: &ClusterId, upsert: &Upsert) -> Answer {
        match self.try_upsert(tenant, upsert).await {
            Ok(a) | Err(a) => a,
        }
    }

    async fn try_upsert(&self, tenant: &ClusterId, upsert: &Upsert) -> Result<Answer, Answer> {
        let object = upsert
            .object
            .as_ref()
            .ok_or((Outcome::Invalid, "Upsert without object".to_string()))?;
        let kind = self.authorize(tenant, object).await?;
        let mut desired = self.desired_object(tenant, kind, object, &upsert.object_json)?;
        if kind == Allowed::ShadowPod {
            self.check_pod_security(&desired)?;
        }
        let token = is_token_secret(kind, &desired);
        if token {
            self.own_token_secret(tenant, object, &mut desired).await?;
        }
        // `object_hash` without its copy: `desired_object` left an annotations map without the
        // hash in it.
        let hash = desired_hash(&desired);
        desired["metadata"]["annotations"][DESIRED_HASH_ANNOTATION] = hash.clone().into();
        let key = ObjectKey {
            tenant: tenant.clone(),
            kind,
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        };
        let api = self.api(kind, &object.namespace);
        let merges = writes_without_apply(kind, token);
        // The watch knows every object of ours: one it has is checked without a request, and
        // one it does not have is most likely new, so it is created in one request that cannot
        // take over an existing object. Only when that create finds the object there (someone
        // else's, or one written a moment ago), or the API refuses it and the watch does not
        // see foreign objects of the kind, is its metadata read.
        let known = self.objects.get(kind, &object.namespace, &object.name);
        let mut consistent_read = false;
        match known {
            Some(known) => {
                if let Some(answer) =
                    self.settled(tenant, kind, object, token, &hash, &known.metadata)
                {
                    return self.settle(answer, key, desired, known.resource_version());
                }
                return self
                    .update(&api, key, desired, merges, &known.metadata)
                    .await
                    .map_err(Refused::into_answer);
            }
            None if self.guards_creates(kind) => {
                let mode = if merges {
                    Mode::Create
                } else {
                    Mode::CreateOnly
                };
                match self.write(&api, key.clone(), desired.clone(), mode).await {
                    Err(Refused::Exists) => consistent_read = true,
                    Err(Refused::GuardUnsupported) => {
                        // Concurrent first creates may all find out; say it once.
                        let new = self
                            .unguarded
                            .lock()
                            .expect("unguarded poisoned")
                            .insert(kind);
                        if new {
                            tracing::info!(
                                kind = kind.kind(),
                                "this API refuses guarded creates; checking new objects against the watch, or reading them first, instead"
                            );
                        }
                    }
                    Err(Refused::Failed(answer)) => return Err(answer),
                    Ok(answer) => return Ok(answer),
                }
            }
            // No guarded create, but the watch sees foreign objects of this kind too: one it
            // does not have is absent as far as a read from the API server's cache would tell.
            None if self.objects.sees_every(kind) => {
                return self
                    .write(&api, key, desired, Mode::Apply)
                    .await
                    .map_err(Refused::into_answer);
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
        let existing = api
            .get_metadata_opt_with(&object.name, &params)
            .await
            .map_err(api_error)?;
        if let Some(existing) = &existing {
            if let Some(answer) =
                self.settled(tenant, kind, object, token, &hash, &existing.metadata)
            {
                return self.settle(answer, key, desired, existing.resource_version());
            }
        }
        let written = match &existing {
            Some(existing) => {
                self.update(&api, key, desired, merges, &existing.metadata)
                    .await
            }
            None if merges => self.write(&api, key, desired, Mode::Create).await,
            None => self.write(&api, key, desired, Mode::Apply).await,
        };
        written.map_err(Refused::into_answer)
    }

    /// What to answer without writing, given the object on the provider: `Conflict` for a
    /// foreign object (or a Secret of the other sort), `Unchanged` when it holds the desired
    /// state; `None` when it must be written.
    fn settled(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        object: &ObjectRef,
        token: bool,
        hash: &str,
        existing: &ObjectMeta,
    ) -> Option<Answer> {
        if !self.owns(tenant, kind, existing) {
            return Some((
                Outcome::Conflict,
                format!(
                    "{} {} exists on cluster {:?} and was not reflected by {tenant}; left untouched",
                    kind.kind(),
                    object.display_name(),
                    self.provider.as_str()
                ),
            ));
        }
        let existing_token = kind == Allowed::Reflected(Kind::Secret)
            && existing
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(SERVICE_ACCOUNT_LABEL));
        if token != existing_token {
            return Some((
                Outcome::Conflict,
                format!(
                    "Secret {} exists as {} and cannot be replaced by {}; left untouched",
                    object.display_name(),
                    token_kind(existing_token),
                    token_kind(token),
                ),
            ));
        }
        let annotations = existing.annotations.as_ref();
        (annotations
            .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
            .map(String::as_str)
            == Some(hash))
        .then(|| (Outcome::Unchanged, String::new()))
    }

    /// Returns a settled answer; an object found holding the desired state is remembered as
    /// written at `resource_version`.
    fn settle(
        &self,
        answer: Answer,
        key: ObjectKey,
        desired: serde_json::Value,
        resource_version: Option<String>,
    ) -> Result<Answer, Answer> {
        if answer.0 == Outcome::Unchanged {
            self.desired.remember(key, desired, resource_version);
        }
        Ok(answer)
    }

    /// Whether creates of `kind` go through the guarded apply (see [`write::Mode`]).
    fn guards_creates(&self, kind: Allowed) -> bool {
        !self
            .unguarded
            .lock()
            .expect("unguarded poisoned")
            .contains(&kind)
    }

    /// Writes a change of an object the provider has, whose metadata is `existing`: a merge
    /// patch where `merges` (see [`merge`]), a server-side apply otherwise.
    async fn update(
        &self,
        api: &Api<DynamicObject>,
        key: ObjectKey,
        desired: serde_json::Value,
        merges: bool,
        existing: &ObjectMeta,
    ) -> Result<Answer, Refused> {
        if !merges {
            return self.write(api, key, desired, Mode::Apply).await;
        }
        let managed = existing.managed_fields.as_deref().unwrap_or_default();
        let mut owned = OwnedKeys::of_managed_fields(managed);
        if let Some(previous) = self.desired.keys_of(&key) {
            owned.extend(previous);
        }
        let patch = merge_patch(desired.clone(), &owned);
        self.write_body(api, key, desired, patch, Mode::Merge).await
    }

    /// Writes `desired`, recording it as the agent's own write while it is under way (so its
    /// watch events are never taken for someone else's edit).
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        key: ObjectKey,
        desired: serde_json::Value,
        mode: Mode,
    ) -> Result<Answer, Refused> {
        self.write_body(api, key, desired.clone(), desired, mode)
            .await
    }

    /// Sends `body` to make the object `desired` (they differ for a merge patch only).
    async fn write_body(
        &self,
        api: &Api<DynamicObject>,
        key: ObjectKey,
        desired: serde_json::Value,
        body: serde_json::Value,
        mode: Mode,
    ) -> Result<Answer, Refused> {
        self.desired.begin_write(key.clone(), desired);
        match write::write(api, &self.client, &key.name, body, mode).await {
            Ok(rv) => {
                self.desired.set_written(&key, rv);
                Ok((Outcome::Applied, String::new()))
            }
            Err(Refused::Failed(answer)) => {
                self.desired.set_written(&key, None);
                Err(Refused::Failed(answer))
            }
            // Nothing was written: the object is not ours to remember (yet).
            Err(refused) => {
                self.desired.forget(&key);
                Err(refused)
            }
        }
    }

    /// Re-applies a remembered desired object (restoring a copy edited or deleted on the
    /// provider); returns the outcome for logs. `observed` is the resourceVersion of the
    /// edited copy: the apply only succeeds if nothing wrote the object since, so a restore
    /// can never overwrite a newer write of the tenant's.
    pub async fn restore(
        &self,
        key: &ObjectKey,
        desired: &serde_json::Value,
        observed: Option<&str>,
    ) -> Answer {
        let api = self.api(key.kind, &key.namespace);
        let mut desired = desired.clone();
        if let Some(rv) = observed {
            desired["metadata"]["resourceVersion"] = rv.into();
        }
        match write::write(&api, &self.client, &key.name, desired, Mode::Apply).await {
            Ok(rv) => {
                self.desired.set_written(key, rv);
                (Outcome::Applied, String::new())
            }
            Err(refused) => refused.into_answer(),
        }
    }

    /// Refuses a ShadowPod whose pod breaks the provider's security level.
    fn check_pod_security(&self, shadow: &serde_json::Value) -> Result<(), Answer> {
        let spec: k8s_openapi::api::core::v1::PodSpec =
            serde_json::from_value(shadow["spec"]["pod"].clone())
                .map_err(|e| (Outcome::Invalid, format!("spec.pod is not a PodSpec: {e}")))?;
        match crate::pod_security::violation(&self.pod_security_level, &spec) {
            Some(v) => Err((
                Outcome::Denied,
                format!(
                    "pod violates the provider's {:?} pod security level: {v}",
                    self.pod_security_level
                ),
            )),
            None => Ok(()),
        }
    }

    /// Decodes the message's object, checks it names what the envelope names, and stamps the
    /// labels and annotations the remote agent owns.
    fn desired_object(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        object: &ObjectRef,
        json: &[u8],
    ) -> Result<serde_json::Value, Answer> {
        let invalid = |m: String| (Outcome::Invalid, m);
        let mut value: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| invalid(format!("object is not valid JSON: {e}")))?;
        if !value.is_object() || !value["metadata"].is_object() {
            return Err(invalid("object has no metadata".into()));
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
            return Err(invalid(format!(
                "object {}/{} {namespace}/{name} does not match the envelope {}",
                field(&value, "apiVersion"),
                field(&value, "kind"),
                object.display_name()
            )));
        }
        let meta = value["metadata"].as_object_mut().expect("checked above");
        let labels = meta
            .entry("labels")
            .or_insert_with(|| serde_json::json!({}));
        if !labels.is_object() {
            return Err(invalid("metadata.labels is not a map".into()));
        }
        labels[ORIGIN_LABEL] = tenant.as_str().into();
        labels[DESTINATION_LABEL] = self.provider.as_str().into();
        if kind == Allowed::Namespace {
            labels[TENANT_NAMESPACE_LABEL] = tenant.as_str().into();
            labels["pod-security.kubernetes.io/enforce"] = self.pod_security_level.clone().into();
        }
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| serde_json::json!({}));
        let Some(annotations) = annotations.as_object_mut() else {
            return Err(invalid("metadata.annotations is not a map".into()));
        };
        annotations.remove(DESIRED_HASH_ANNOTATION);
        Ok(value)
    }

    /// Applies one Delete for `tenant`. A foreign object is never deleted.
    pub async fn delete(&self, tenant: &ClusterId, delete: &Delete) -> Answer {
        let result = async {
            let object = delete
                .object
                .as_ref()
                .ok_or((Outcome::Invalid, "Delete without object".to_string()))?;
            let kind = match Allowed::lookup(&object.api_version, &object.kind) {
                Some(Allowed::Namespace) => Allowed::Namespace,
                _ => self.authorize(tenant, object).await?,
            };
            self.desired.forget(&ObjectKey {
                tenant: tenant.clone(),
                kind,
                namespace: object.namespace.clone(),
                name: object.name.clone(),
            });
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
        .await;
        match result {
            Ok(a) | Err(a) => a,
        }
    }

    /// Deletes `tenant`'s object, if it is the tenant's. With `unchanged_since`, only if
    /// nothing has written it since that resourceVersion.
    async fn delete_owned(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        namespace: &str,
        name: &str,
        grace: Option<i64>,
        unchanged_since: Option<String>,
    ) -> Result<Answer, Answer> {
        let api = self.api(kind, namespace);
        let Some(existing) = api.get_opt(name).await.map_err(api_error)? else {
            return Ok((Outcome::Unchanged, "already absent".into()));
        };
        let guarded = unchanged_since.is_some();
        if guarded && existing.resource_version() != unchanged_since {
            return Ok((Outcome::Unchanged, "written since it was listed".into()));
        }
        if !self.owns(tenant, kind, &existing.metadata) {
            return Ok((
                Outcome::Conflict,
                format!(
                    "{} {namespace}/{name} is not the tenant's; left untouched",
                    kind.kind()
                ),
            ));
        }
        if kind == Allowed::ShadowPod {
            // Stop the pod with the origin's grace period; the ShadowPod's own deletion would
            // leave it to the garbage collector with the pod's default.
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(self.client.clone(), namespace);
            let params = DeleteParams {
                grace_period_seconds: grace.map(|g| g.max(0) as u32),
                ..Default::default()
            };
            match pods.delete(name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(e)),
            }
        }
        let mut params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: existing.uid(),
                resource_version: unchanged_since,
            }),
            ..Default::default()
        };
        if let Some(g) = grace {
            params.grace_period_seconds = Some(g.max(0) as u32);
        }
        match api.delete(name, &params).await {
            Ok(_) => Ok((Outcome::Applied, String::new())),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Ok((Outcome::Unchanged, "already absent".into()))
            }
            // The resourceVersion precondition failed: written meanwhile, so it stays.
            Err(kube::Error::Api(s)) if guarded && s.code == 409 => {
                Ok((Outcome::Unchanged, "written since it was listed".into()))
            }
            Err(e) => Err(api_error(e)),
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
    ) -> Result<Vec<String>, Answer> {
        if kind != Allowed::Namespace && !self.owns_namespace(tenant, namespace).await? {
            return Ok(Vec::new());
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
            .api(kind, namespace)
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(api_error)?;
        let mut deleted = Vec::new();
        for obj in list.items {
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
            if let Ok((Outcome::Applied, _)) = self
                .delete_owned(tenant, kind, namespace, &name, None, obj.resource_version())
                .await
            {
                deleted.push(name);
            }
        }
        Ok(deleted)
    }
}

trait DisplayName {
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
