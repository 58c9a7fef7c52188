//! Keeping tenants' objects as they sent them: a copy deleted or edited on the provider is
//! re-applied from the desired state the tenant last sent.
//!
//! Fed by the watch of tenant objects ([`crate::objects`]). An event whose resourceVersion is
//! not the one the remote agent last wrote means someone else touched the object; server-side
//! apply with force takes back the fields Refract owns, and is a no-op (no write) when nothing
//! of ours changed. A tenant whose namespace is marked for removal is forgotten instead.

use kube::runtime::watcher;
use kube::ResourceExt;
use refract_shared::keys::{DESIRED_HASH_ANNOTATION, ORIGIN_LABEL, TENANT_REMOVAL_ANNOTATION};
use refract_shared::options::Kind;
use refract_shared::tls::ClusterId;
use tokio::sync::mpsc;

use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use crate::objects::{Change, Meta};

/// Restores tenant objects as their changes arrive, until the stream ends.
pub fn spawn_restorer(applier: Applier, mut changes: mpsc::Receiver<Change>) {
    tokio::spawn(async move {
        while let Some((kind, event)) = changes.recv().await {
            match event {
                watcher::Event::Apply(obj) if obj.metadata.deletion_timestamp.is_none() => {
                    check(&applier, kind, &obj, obj.resource_version().as_deref()).await
                }
                // A claim deleted on the provider is not re-created: a new claim would be a
                // new, empty volume behind the origin's back (Liqo does the same).
                watcher::Event::Delete(_)
                    if kind == Allowed::Reflected(Kind::PersistentVolumeClaim) => {}
                watcher::Event::Delete(obj) => check(&applier, kind, &obj, None).await,
                _ => {}
            }
        }
    });
}

async fn check(applier: &Applier, kind: Allowed, obj: &Meta, resource_version: Option<&str>) {
    let Some(tenant) = obj
        .labels()
        .get(ORIGIN_LABEL)
        .and_then(|t| ClusterId::parse(t).ok())
    else {
        return;
    };
    if kind == Allowed::Namespace && obj.annotations().contains_key(TENANT_REMOVAL_ANNOTATION) {
        // The tenant is being removed: nothing of it comes back.
        applier.desired.forget_tenant(&tenant);
        return;
    }
    let key = ObjectKey {
        tenant,
        kind,
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    };
    tracing::debug!(tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name, ?resource_version, "tenant object changed on the provider");
    let observed_hash = obj
        .annotations()
        .get(DESIRED_HASH_ANNOTATION)
        .map(String::as_str);
    let Some(desired) = applier
        .desired
        .needs_restore(&key, resource_version, observed_hash)
    else {
        return;
    };
    let what = if resource_version.is_none() {
        "deleted"
    } else {
        "changed"
    };
    match applier.restore(&key, &desired, resource_version).await {
        Ok(_) => tracing::info!(
            tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name,
            "reflected object {what} on the provider; restored the tenant's desired state"
        ),
        Err(error) => tracing::warn!(
            tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name,
            %error, "reflected object {what} on the provider; restoring it failed"
        ),
    }
}
