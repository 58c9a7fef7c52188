//! Streams the status of tenants' pods back to their origin.
//!
//! On every change of a pod or ShadowPod, the status of the origin pod it stands for is put in
//! the tenant's [`Outbox`], which sends it unless the tenant's current session has exactly
//! that status, and sends every status again to a reconnecting origin. Nothing rescans: the
//! stores are read once when they are ready, then only what changed. A ShadowPod whose pod the
//! provider cannot create is reported too, as a Pending status saying why.

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use refract_core::hash::desired_hash;
use refract_core::keys::{ORIGIN_LABEL, ORIGIN_UID_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, PodStatus, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::outbox::{Outbox, Subject};
use crate::shadowpod::{ShadowPod, FAILED_CREATE};
use crate::shadowpod_controller::{of_shadowpod, Stores};

/// The status the origin pod shows while the provider cannot create its pod: Pending, not
/// scheduled, with the provider's reason.
fn failed_create(shadow: &ShadowPod) -> Option<serde_json::Value> {
    let status = shadow.status.as_ref()?;
    if status.reason.as_deref() != Some(FAILED_CREATE) {
        return None;
    }
    let message = status.message.clone().unwrap_or_default();
    Some(serde_json::json!({
        "phase": "Pending",
        "reason": PROVIDER_FAILED_CREATE,
        "message": message,
        "conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": PROVIDER_FAILED_CREATE,
            "message": message,
        }],
    }))
}

/// The reason an origin pod shows while its provider cannot create it.
pub const PROVIDER_FAILED_CREATE: &str = "ProviderFailedCreate";

/// The status of the origin pod that the provider pod or ShadowPod `namespace/name` stands
/// for, with its tenant; `None` when there is none to send (no such object of a tenant, or a
/// ShadowPod whose pod simply does not exist yet).
fn report(
    stores: &Stores,
    namespace: &str,
    name: &str,
) -> Option<(ClusterId, RemoteMessage, String)> {
    let shadow = stores.shadows.get(&ObjectRef::new(name).within(namespace));
    let recreations = shadow
        .as_ref()
        .and_then(|s| s.status.as_ref().map(|s| s.recreations))
        .unwrap_or(0);
    let pod = stores
        .pods
        .get(&ObjectRef::new(name).within(namespace))
        .filter(|p| of_shadowpod(p));
    let (labels, status) = match (&pod, &shadow) {
        (Some(pod), _) => (
            pod.labels(),
            serde_json::to_value(&pod.status).unwrap_or_default(),
        ),
        (None, Some(shadow)) => (shadow.labels(), failed_create(shadow)?),
        (None, None) => return None,
    };
    let tenant = ClusterId::parse(labels.get(ORIGIN_LABEL)?).ok()?;
    let origin_uid = labels.get(ORIGIN_UID_LABEL)?.clone();
    let hash = desired_hash(&serde_json::json!([status, recreations]));
    let message = RemoteMessage {
        kind: Some(remote_message::Kind::PodStatus(PodStatus {
            origin_uid,
            namespace: namespace.to_string(),
            name: name.to_string(),
            status_json: serde_json::to_vec(&status).unwrap_or_default(),
            recreations,
            // Stamped when sent (see `Outbox`).
            sent_unix_millis: 0,
        })),
    };
    Some((tenant, message, hash))
}

/// Puts the current status of `namespace/name` in its tenant's outbox, or takes it out.
fn offer(stores: &Stores, outbox: &Outbox, namespace: &str, name: &str) {
    let subject = Subject::pod(namespace, name);
    match report(stores, namespace, name) {
        Some((tenant, message, hash)) => outbox.put(&tenant, subject, hash, message),
        None => outbox.remove(&subject),
    }
}

/// Starts the status stream.
pub fn spawn(stores: Stores, outbox: Outbox, shutdown: CancellationToken) {
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = stores.listed() => {}
        }
        // Whatever changed while the stores listed is in them now.
        stores.changed.take();
        let everything: std::collections::BTreeSet<(String, String)> = stores
            .pods
            .state()
            .iter()
            .filter(|p| of_shadowpod(p))
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .chain(
                stores
                    .shadows
                    .state()
                    .iter()
                    .map(|s| (s.namespace().unwrap_or_default(), s.name_any())),
            )
            .collect();
        for (namespace, name) in everything {
            offer(&stores, &outbox, &namespace, &name);
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = stores.changed.changed() => {}
            }
            for (namespace, name) in stores.changed.take() {
                offer(&stores, &outbox, &namespace, &name);
            }
        }
    });
}
