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
//!
//! Every restore that changed the copy is counted per object ([`drift`]): one that changes
//! nothing answered a write outside Refract's fields (a status), and is not drift. The origin
//! is told at a fight's first restore and then at most once per window, and a copy restored
//! too often in the window is quarantined: left as the other writer made it, said to the
//! origin, and restored again once nobody else wrote it for a quiet period or an operator
//! clears it ([`fights`]).

use kube::runtime::watcher;
use kube::ResourceExt;
use refract_core::keys::{DESIRED_HASH_ANNOTATION, ORIGIN_LABEL, TENANT_REMOVAL_ANNOTATION};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::Outcome;
use tokio::sync::mpsc;

use crate::apply::desired::Restore;
use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use crate::objects::{Change, Meta};

pub mod drift;
pub mod fights;

pub use drift::{Cleared, Drift};

/// Restores tenant objects as their changes arrive, until the stream ends; and quarantined
/// ones once their fight is over (quiet, or `cleared` by an operator).
pub fn spawn_restorer(
    applier: Applier,
    drift: Drift,
    Cleared(mut cleared): Cleared,
    mut changes: mpsc::Receiver<Change>,
) {
    tokio::spawn(async move {
        loop {
            // Only while fights are kept: an agent nobody fights with never wakes for this.
            let due = drift.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                change = changes.recv() => {
                    let Some((kind, event)) = change else { return };
                    on_change(&applier, &drift, kind, event).await;
                }
                Some(key) = cleared.recv() => {
                    restore_released(&applier, &drift, key, "cleared by an operator").await;
                }
                () = sleep_until(due), if due.is_some() => {
                    for key in drift.release_due() {
                        let quiet = drift.rule().quiet;
                        let why = format!("nobody else wrote it for {}", refract_core::duration::format(quiet));
                        restore_released(&applier, &drift, key, &why).await;
                    }
                }
            }
        }
    });
}

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

async fn on_change(applier: &Applier, drift: &Drift, kind: Allowed, event: watcher::Event<Meta>) {
    match event {
        watcher::Event::Apply(obj) if obj.metadata.deletion_timestamp.is_none() => {
            check(
                applier,
                drift,
                kind,
                &obj,
                obj.resource_version().as_deref(),
            )
            .await
        }
        // A claim deleted on the provider is not re-created: a new claim would be a
        // new, empty volume behind the origin's back (Liqo does the same).
        watcher::Event::Delete(_) if kind == Allowed::Reflected(Kind::PersistentVolumeClaim) => {}
        watcher::Event::Delete(obj) => check(applier, drift, kind, &obj, None).await,
        _ => {}
    }
}

/// Restores `key`, released from quarantine, from whatever the watch holds of it now.
async fn restore_released(applier: &Applier, drift: &Drift, key: ObjectKey, why: &str) {
    tracing::info!(
        tenant = %key.tenant, kind = key.kind.kind(), namespace = %key.namespace, name = %key.name,
        "quarantine of the reflected object ended ({why}); restoring it"
    );
    match applier.objects().get(key.kind, &key.namespace, &key.name) {
        Some(obj) => {
            let version = obj.resource_version();
            check(applier, drift, key.kind, &obj, version.as_deref()).await
        }
        None => restore_key(applier, drift, key, None, None).await,
    }
}

async fn check(
    applier: &Applier,
    drift: &Drift,
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
    let observed_hash = obj
        .annotations()
        .get(DESIRED_HASH_ANNOTATION)
        .map(String::as_str);
    restore_key(applier, drift, key, resource_version, observed_hash).await
}

/// Restores `key`, seen at `resource_version` (`None`: deleted) carrying `observed_hash`, if
/// it is not as the agent last wrote it and its fight allows.
async fn restore_key(
    applier: &Applier,
    drift: &Drift,
    key: ObjectKey,
    resource_version: Option<&str>,
    observed_hash: Option<&str>,
) {
    let kind = key.kind;
    tracing::debug!(tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name, ?resource_version, "tenant object changed on the provider");
    if kind != Allowed::Namespace && applier.objects().namespace_terminating(&key.namespace) {
        // Deleted with its namespace, which refuses writes until it is gone: everything of it
        // is restored once the namespace is back (see `refill`).
        return;
    }
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
    if !drift.foreign_write(&key) {
        tracing::debug!(tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name, "quarantined object {what} on the provider again; left alone");
        return;
    }
    let desired = match restore {
        Restore::Here(desired) => desired,
        Restore::FromOrigin => {
            // Whether it had really changed is known when the copy sent again lands (see
            // `Applier::upsert`).
            applier.desired.mark_drifted(&key);
            drift.await_resend(&key, resource_version);
            ask_origin(drift, &key, what);
            return;
        }
    };
    let restored = restore_here(applier, &key, &desired, resource_version, what).await;
    if restored == Some(true) {
        drift.restored(&key, what);
    }
    if restored.is_some() && kind == Allowed::Namespace && resource_version.is_none() {
        refill(applier, drift, &key.tenant, &key.name, what).await;
    }
}

/// Puts back `key` from its whole desired state, over the copy seen at `resource_version`
/// (`None`: deleted). Whether that changed the copy (server-side apply writes nothing when
/// none of Refract's fields were touched, as by a status update); `None` when it failed.
async fn restore_here(
    applier: &Applier,
    key: &ObjectKey,
    desired: &serde_json::Value,
    resource_version: Option<&str>,
    what: &str,
) -> Option<bool> {
    let kind = key.kind.kind();
    match applier.restore(key, desired, resource_version).await {
        Ok(_) => {
            let written = applier.desired.written_version(key);
            let changed = resource_version.is_none() || written.as_deref() != resource_version;
            if changed {
                tracing::info!(
                    tenant = %key.tenant, kind, namespace = %key.namespace, name = %key.name,
                    "reflected object {what} on the provider; restored the tenant's desired state"
                );
            } else {
                tracing::debug!(tenant = %key.tenant, kind, namespace = %key.namespace, name = %key.name, "reflected object written on the provider outside Refract's fields; nothing to restore");
            }
            Some(changed)
        }
        Err(error) => {
            tracing::warn!(
                tenant = %key.tenant, kind, namespace = %key.namespace, name = %key.name,
                %error, "reflected object {what} on the provider; restoring it failed"
            );
            None
        }
    }
}

/// Puts back everything of `tenant` in its twin namespace `namespace`, which was deleted with
/// it and has just been re-created: ShadowPods (whose controller starts their pods again) and
/// token Secrets from here, every other object from the origin.
async fn refill(applier: &Applier, drift: &Drift, tenant: &ClusterId, namespace: &str, what: &str) {
    let contents = applier.desired.refill(tenant, namespace);
    tracing::info!(%tenant, %namespace, objects = contents.len(), "twin namespace {what} on the provider and re-created; restoring its objects");
    let what = format!("{what} with its namespace");
    for (key, restore) in contents {
        match restore {
            Restore::Here(desired) => {
                restore_here(applier, &key, &desired, None, &what).await;
            }
            Restore::FromOrigin => ask_origin(drift, &key, &what),
        }
    }
}

/// Asks the tenant to send `key` again, through its record in the provider's outbox: a
/// tenant whose stream is full is asked when it has room; one not connected gets the copy on
/// its next session, whose inventory leaves it out.
fn ask_origin(drift: &Drift, key: &ObjectKey, what: &str) {
    tracing::info!(
        tenant = %key.tenant, kind = key.kind.kind(), namespace = %key.namespace, name = %key.name,
        "reflected object {what} on the provider; restoring it from the origin (asked now if connected, else on its next session)"
    );
    // No revision: the copy is to be restored to whatever the origin holds now.
    let message = format!("the copy was {what} on the provider; send it again to restore it");
    drift.notify(key, Outcome::Resend, 0, message);
}

#[cfg(test)]
mod tests;
