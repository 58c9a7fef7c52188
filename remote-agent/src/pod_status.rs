//! Streams the status of tenants' pods back to their origin.
//!
//! Level-triggered: on every change of a pod or ShadowPod that pod's status is sent at once,
//! and every few seconds every pod's is, each unless the tenant's current session already has
//! exactly that status. A reconnecting origin therefore gets every status again without asking,
//! and a status a full stream could not take is sent on the next round. A ShadowPod whose pod
//! the provider cannot create is reported too, as a Pending status saying why.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use refract_core::hash::desired_hash;
use refract_core::keys::{ORIGIN_LABEL, ORIGIN_UID_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, PodStatus, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::delivered::Delivered;
use crate::registry::Registry;
use crate::shadowpod::{ShadowPod, FAILED_CREATE};
use crate::shadowpod_controller::Stores;

/// How often every status is re-checked against what each session has (a new session, a
/// stream that was full); changes are sent as they happen.
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

/// A status to send for the origin pod named by `labels` (of a provider pod, or of its
/// ShadowPod while the pod cannot be created).
struct Report<'a> {
    labels: &'a std::collections::BTreeMap<String, String>,
    /// The provider object's UID, which keys what was delivered.
    uid: String,
    namespace: String,
    name: String,
    status: serde_json::Value,
    recreations: u32,
}

/// Sends `report` to its tenant unless the tenant's current session has it already.
fn offer(registry: &Registry, delivered: &mut Delivered, report: Report<'_>) {
    let tenant = report
        .labels
        .get(ORIGIN_LABEL)
        .and_then(|t| ClusterId::parse(t).ok());
    let (Some(tenant), Some(origin_uid)) = (tenant, report.labels.get(ORIGIN_UID_LABEL)) else {
        return;
    };
    let Some(session) = registry.session_of(&tenant) else {
        return;
    };
    let hash = desired_hash(&serde_json::json!([report.status, report.recreations]));
    if delivered.has(&report.uid, &session, &hash) {
        return;
    }
    let message = RemoteMessage {
        kind: Some(remote_message::Kind::PodStatus(PodStatus {
            origin_uid: origin_uid.clone(),
            namespace: report.namespace,
            name: report.name,
            status_json: serde_json::to_vec(&report.status).unwrap_or_default(),
            recreations: report.recreations,
            sent_unix_millis: unix_millis_now(),
        })),
    };
    if registry.send_to(&tenant, message) {
        delivered.record(report.uid, session, hash);
    }
}

fn unix_millis_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Offers the status of one provider pod.
fn offer_pod(stores: &Stores, registry: &Registry, delivered: &mut Delivered, pod: &Pod) {
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let recreations = stores
        .shadows
        .get(&ObjectRef::new(&name).within(&namespace))
        .and_then(|s| s.status.as_ref().map(|s| s.recreations))
        .unwrap_or(0);
    let report = Report {
        labels: pod.labels(),
        uid: pod.uid().unwrap_or_default(),
        status: serde_json::to_value(&pod.status).unwrap_or_default(),
        recreations,
        namespace,
        name,
    };
    offer(registry, delivered, report);
}

/// Offers the Pending status of a ShadowPod whose pod the provider cannot create.
fn offer_failed_create(
    stores: &Stores,
    registry: &Registry,
    delivered: &mut Delivered,
    shadow: &ShadowPod,
) {
    let Some(failure) = failed_create(shadow) else {
        return;
    };
    let (namespace, name) = (shadow.namespace().unwrap_or_default(), shadow.name_any());
    if stores
        .pods
        .get(&ObjectRef::new(&name).within(&namespace))
        .is_some()
    {
        return;
    }
    let report = Report {
        labels: shadow.labels(),
        uid: shadow.uid().unwrap_or_default(),
        status: failure,
        recreations: shadow.status.as_ref().map_or(0, |s| s.recreations),
        namespace,
        name,
    };
    offer(registry, delivered, report);
}

/// Starts the status stream.
pub fn spawn(stores: Stores, registry: Registry, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut delivered = Delivered::default();
        let mut tick = tokio::time::interval(RESCAN);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = stores.changed.changed() => {
                    for (namespace, name) in stores.changed.take() {
                        if let Some(pod) = stores.pods.get(&ObjectRef::new(&name).within(&namespace)) {
                            offer_pod(&stores, &registry, &mut delivered, &pod);
                        }
                        if let Some(shadow) = stores.shadows.get(&ObjectRef::new(&name).within(&namespace)) {
                            offer_failed_create(&stores, &registry, &mut delivered, &shadow);
                        }
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            for pod in stores.pods.state() {
                offer_pod(&stores, &registry, &mut delivered, &pod);
            }
            for shadow in stores.shadows.state() {
                offer_failed_create(&stores, &registry, &mut delivered, &shadow);
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
