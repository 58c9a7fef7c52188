//! Streams the status of tenants' pods back to their origin.
//!
//! Level-triggered: on every pod change, and every few seconds for everything, each pod's
//! status is sent unless the tenant's current session already has exactly that status. A
//! reconnecting origin therefore gets every status again without asking.

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
use crate::shadowpod_controller::Stores;

/// How often every status is re-checked against what each session has.
const RESCAN: Duration = Duration::from_secs(2);

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
                if registry.send_to(&tenant, message).await {
                    delivered.record(uid, session, hash);
                }
            }
            let live: std::collections::HashSet<String> =
                stores.pods.state().iter().filter_map(|p| p.uid()).collect();
            delivered.retain(&live);
        }
    });
}
