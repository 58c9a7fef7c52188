//! Streams the status of tenants' pods back to their origin.
//!
//! Level-triggered: on every pod change, and every few seconds for everything, each pod's
//! status is sent unless the tenant's current session already has exactly that status. A
//! reconnecting origin therefore gets every status again without asking. A ShadowPod whose pod
//! the provider cannot create is reported too, as a Pending status saying why.

use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use refract_shared::forge::pod::ORIGIN_UID_LABEL;
use refract_shared::hash::desired_hash;
use refract_shared::keys::ORIGIN_LABEL;
use refract_shared::proto::{remote_message, PodStatus, RemoteMessage};
use refract_shared::tls::ClusterId;
use tokio_util::sync::CancellationToken;

use crate::delivered::Delivered;
use crate::registry::Registry;
use crate::shadowpod::{ShadowPod, FAILED_CREATE};
use crate::shadowpod_controller::Stores;

/// How often every status is re-checked against what each session has.
const RESCAN: Duration = Duration::from_secs(2);

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

/// Starts the status stream.
pub fn spawn(stores: Stores, registry: Registry, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut delivered = Delivered::default();
        let mut tick = tokio::time::interval(RESCAN);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            for pod in stores.pods.state() {
                let Some(tenant) = pod
                    .labels()
                    .get(ORIGIN_LABEL)
                    .and_then(|t| ClusterId::parse(t).ok())
                else {
                    continue;
                };
                let Some(origin_uid) = pod.labels().get(ORIGIN_UID_LABEL).cloned() else {
                    continue;
                };
                let Some(session) = registry.session_of(&tenant) else {
                    continue;
                };
                let ns = pod.namespace().unwrap_or_default();
                let name = pod.name_any();
                let recreations = stores
                    .shadows
                    .get(&ObjectRef::new(&name).within(&ns))
                    .and_then(|s| s.status.as_ref().map(|s| s.recreations))
                    .unwrap_or(0);
                let status = serde_json::to_value(&pod.status).unwrap_or_default();
                let hash = desired_hash(&serde_json::json!([status, recreations]));
                let uid = pod.uid().unwrap_or_default();
                if delivered.has(&uid, &session, &hash) {
                    continue;
                }
                let message = RemoteMessage {
                    kind: Some(remote_message::Kind::PodStatus(PodStatus {
                        origin_uid,
                        namespace: ns,
                        name,
                        status_json: serde_json::to_vec(&status).unwrap_or_default(),
                        recreations,
                    })),
                };
                if registry.send_to(&tenant, message) {
                    delivered.record(uid, session, hash);
                }
            }
            for shadow in stores.shadows.state() {
                let Some(failure) = failed_create(&shadow) else {
                    continue;
                };
                let ns = shadow.namespace().unwrap_or_default();
                let name = shadow.name_any();
                if stores
                    .pods
                    .get(&ObjectRef::new(&name).within(&ns))
                    .is_some()
                {
                    continue;
                }
                let labels = shadow.labels();
                let tenant = labels
                    .get(ORIGIN_LABEL)
                    .and_then(|t| ClusterId::parse(t).ok());
                let (Some(tenant), Some(origin_uid)) = (tenant, labels.get(ORIGIN_UID_LABEL))
                else {
                    continue;
                };
                let Some(session) = registry.session_of(&tenant) else {
                    continue;
                };
                let hash = desired_hash(&failure);
                let uid = shadow.uid().unwrap_or_default();
                if delivered.has(&uid, &session, &hash) {
                    continue;
                }
                let message = RemoteMessage {
                    kind: Some(remote_message::Kind::PodStatus(PodStatus {
                        origin_uid: origin_uid.clone(),
                        namespace: ns,
                        name,
                        status_json: serde_json::to_vec(&failure).unwrap_or_default(),
                        recreations: shadow.status.as_ref().map_or(0, |s| s.recreations),
                    })),
                };
                if registry.send_to(&tenant, message) {
                    delivered.record(uid, session, hash);
                }
            }
            let live: std::collections::HashSet<String> = stores
                .pods
                .state()
                .iter()
                .filter_map(|p| p.uid())
                .chain(stores.shadows.state().iter().filter_map(|s| s.uid()))
                .collect();
            delivered.retain(&live);
        }
    });
}
