//! Streams events about tenants' objects back to their origin.
//!
//! Events are watched in the tenants' namespaces only: one watch per live tenant namespace,
//! started and stopped as the tenant objects' store of namespaces changes, so the provider's
//! own events are never read. An event whose involved object is one of the reflected kinds
//! (or a ShadowPod) is sent once per session; the origin records it on the matching local
//! object.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{self, remote_message, ObjectRef, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::kinds::Allowed;
use crate::objects::TenantObjects;
use crate::registry::Registry;

/// Kinds whose events are sent back.
pub const EVENT_KINDS: &[&str] = &[
    "Pod",
    "ShadowPod",
    "Service",
    "EndpointSlice",
    "Ingress",
    "ConfigMap",
    "Secret",
    "PersistentVolumeClaim",
];

/// Per tenant: the session and the keys of the events sent on it.
type Sent = Arc<Mutex<HashMap<ClusterId, (String, HashSet<String>)>>>;

/// Starts the event stream: follows the tenant namespaces in `objects`.
pub fn spawn(
    client: kube::Client,
    registry: Registry,
    objects: TenantObjects,
    shutdown: CancellationToken,
) {
    let Some(mut namespaces_changed) = objects.follow(Allowed::Namespace) else {
        return;
    };
    tokio::spawn(async move {
        let sent = Sent::default();
        // namespace → (its tenant, the token that stops its watch)
        let mut watched: BTreeMap<String, (ClusterId, CancellationToken)> = BTreeMap::new();
        loop {
            let now = objects.tenant_namespaces();
            watched.retain(|ns, (tenant, stop)| {
                let keep = now.get(ns) == Some(tenant);
                if !keep {
                    stop.cancel();
                }
                keep
            });
            for (ns, tenant) in now {
                if watched.contains_key(&ns) {
                    continue;
                }
                let stop = shutdown.child_token();
                watched.insert(ns.clone(), (tenant.clone(), stop.clone()));
                let watch =
                    watch_namespace(client.clone(), registry.clone(), sent.clone(), ns, tenant);
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = watch => {}
                    }
                });
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = namespaces_changed.changed() => if changed.is_err() { return },
            }
        }
    });
}

/// Sends `tenant` the events of its namespace `ns` as they come.
async fn watch_namespace(
    client: kube::Client,
    registry: Registry,
    sent: Sent,
    ns: String,
    tenant: ClusterId,
) {
    let mut events = watcher(
        Api::<Event>::namespaced(client, &ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    while let Some(event) = events.next().await {
        let Ok(event) = event else { continue };
        let involved = &event.involved_object;
        let kind = involved.kind.clone().unwrap_or_default();
        if !EVENT_KINDS.contains(&kind.as_str()) {
            continue;
        }
        let Some(session) = registry.session_of(&tenant) else {
            continue;
        };
        let key = format!("{}/{}/{}", ns, event.name_any(), event.count.unwrap_or(1));
        {
            let mut sent = sent.locked();
            let entry = sent
                .entry(tenant.clone())
                .or_insert_with(|| (session.clone(), HashSet::new()));
            if entry.0 != session {
                *entry = (session.clone(), HashSet::new());
            }
            if !entry.1.insert(key.clone()) {
                continue;
            }
        }
        let message = RemoteMessage {
            kind: Some(remote_message::Kind::Event(proto::Event {
                involved: Some(ObjectRef {
                    api_version: involved.api_version.clone().unwrap_or_default(),
                    kind,
                    namespace: ns.clone(),
                    name: involved.name.clone().unwrap_or_default(),
                }),
                origin_uid: String::new(),
                event_json: serde_json::to_vec(&event).unwrap_or_default(),
            })),
        };
        if !registry.send_to(&tenant, message) {
            // A tenant not reading its stream misses this event, not everyone else theirs;
            // a later count of the same event is sent again.
            if let Some((_, keys)) = sent.locked().get_mut(&tenant) {
                keys.remove(&key);
            }
        }
    }
}
