//! Keeping tenants' objects as they sent them: a copy deleted or edited on the provider is
//! re-applied from the desired state the tenant last sent.
//!
//! Fed by the watch of tenant objects ([`crate::objects`]). An event whose resourceVersion is
//! not the one the remote agent last wrote means someone else touched the object. Twin
//! namespaces, ShadowPods and token Secrets are restored here, from the desired state kept
//! whole: server-side apply with force takes back the fields Refract owns, and is a no-op (no
//! write) when nothing of ours changed. Every other kind is restored from the origin: the
//! tenant is answered [`Outcome::Resend`] for the object (through the provider's outbox, see
//! [`crate::outbox`]) and sends it again, through the one write path; a tenant not connected
//! gets it on its next session, whose inventory leaves the object out. A twin namespace
//! deleted on the provider is re-created once its deletion completes, and everything that was
//! in it restored the same way ([`refill`]); while it terminates, its objects' deletions are
//! left to that. A tenant whose namespace is marked for removal is forgotten instead.

use kube::runtime::watcher;
use kube::ResourceExt;
use refract_core::keys::{DESIRED_HASH_ANNOTATION, ORIGIN_LABEL, TENANT_REMOVAL_ANNOTATION};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, Ack, Outcome, RemoteMessage};
use tokio::sync::mpsc;

use crate::apply::desired::Restore;
use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use crate::objects::{Change, Meta};
use crate::outbox::{Outbox, Subject};

/// Restores tenant objects as their changes arrive, until the stream ends.
pub fn spawn_restorer(applier: Applier, outbox: Outbox, mut changes: mpsc::Receiver<Change>) {
    tokio::spawn(async move {
        while let Some((kind, event)) = changes.recv().await {
            match event {
                watcher::Event::Apply(obj) if obj.metadata.deletion_timestamp.is_none() => {
                    check(
                        &applier,
                        &outbox,
                        kind,
                        &obj,
                        obj.resource_version().as_deref(),
                    )
                    .await
                }
                // A claim deleted on the provider is not re-created: a new claim would be a
                // new, empty volume behind the origin's back (Liqo does the same).
                watcher::Event::Delete(_)
                    if kind == Allowed::Reflected(Kind::PersistentVolumeClaim) => {}
                watcher::Event::Delete(obj) => check(&applier, &outbox, kind, &obj, None).await,
                _ => {}
            }
        }
    });
}

async fn check(
    applier: &Applier,
    outbox: &Outbox,
    kind: Allowed,
    obj: &Meta,
    resource_version: Option<&str>,
) {
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
    if kind != Allowed::Namespace && applier.objects().namespace_terminating(&key.namespace) {
        // Deleted with its namespace, which refuses writes until it is gone: everything of it
        // is restored once the namespace is back (see `refill`).
        return;
    }
    let observed_hash = obj
        .annotations()
        .get(DESIRED_HASH_ANNOTATION)
        .map(String::as_str);
    let Some(restore) = applier
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
    let desired = match restore {
        Restore::Here(desired) => desired,
        Restore::FromOrigin => {
            ask_origin(outbox, &key, what);
            return;
        }
    };
    let restored = restore_here(applier, &key, &desired, resource_version, what).await;
    if restored && kind == Allowed::Namespace && resource_version.is_none() {
        refill(applier, outbox, &key.tenant, &key.name, what).await;
    }
}

/// Puts back `key` from its whole desired state; true when it was written.
async fn restore_here(
    applier: &Applier,
    key: &ObjectKey,
    desired: &serde_json::Value,
    resource_version: Option<&str>,
    what: &str,
) -> bool {
    let kind = key.kind.kind();
    match applier.restore(key, desired, resource_version).await {
        Ok(_) => {
            tracing::info!(
                tenant = %key.tenant, kind, namespace = %key.namespace, name = %key.name,
                "reflected object {what} on the provider; restored the tenant's desired state"
            );
            true
        }
        Err(error) => {
            tracing::warn!(
                tenant = %key.tenant, kind, namespace = %key.namespace, name = %key.name,
                %error, "reflected object {what} on the provider; restoring it failed"
            );
            false
        }
    }
}

/// Puts back everything of `tenant` in its twin namespace `namespace`, which was deleted with
/// it and has just been re-created: ShadowPods (whose controller starts their pods again) and
/// token Secrets from here, every other object from the origin.
async fn refill(
    applier: &Applier,
    outbox: &Outbox,
    tenant: &ClusterId,
    namespace: &str,
    what: &str,
) {
    let contents = applier.desired.refill(tenant, namespace);
    tracing::info!(%tenant, %namespace, objects = contents.len(), "twin namespace {what} on the provider and re-created; restoring its objects");
    let what = format!("{what} with its namespace");
    for (key, restore) in contents {
        match restore {
            Restore::Here(desired) => {
                restore_here(applier, &key, &desired, None, &what).await;
            }
            Restore::FromOrigin => ask_origin(outbox, &key, &what),
        }
    }
}

/// Asks the tenant to send `key` again, through its record in the provider's outbox: a
/// tenant whose stream is full is asked when it has room; one not connected gets the copy on
/// its next session, whose inventory leaves it out.
fn ask_origin(outbox: &Outbox, key: &ObjectKey, what: &str) {
    let message = RemoteMessage {
        kind: Some(remote_message::Kind::Ack(Ack {
            object: Some(key.object_ref()),
            // Any revision: the copy is to be restored to whatever the origin holds now.
            revision: String::new(),
            outcome: Outcome::Resend as i32,
            message: format!("the copy was {what} on the provider; send it again to restore it"),
            awaited: false,
        })),
    };
    tracing::info!(
        tenant = %key.tenant, kind = key.kind.kind(), namespace = %key.namespace, name = %key.name,
        "reflected object {what} on the provider; restoring it from the origin (asked now if connected, else on its next session)"
    );
    let subject = Subject::notice(key.kind.kind(), &key.namespace, &key.name);
    outbox.put(&key.tenant, subject, String::new(), message);
}

#[cfg(test)]
mod tests;
