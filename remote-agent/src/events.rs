//! Streams events about tenants' objects back to their origin.
//!
//! An event in a tenant namespace whose involved object is one of the reflected kinds (or a
//! ShadowPod) is sent once per session; the origin records it on the matching local object.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef as StoreRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::keys::TENANT_NAMESPACE_LABEL;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{self, remote_message, ObjectRef, RemoteMessage};
use tokio_util::sync::CancellationToken;

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

/// Starts the event stream.
pub fn spawn(client: kube::Client, registry: Registry, shutdown: CancellationToken) {
    let (namespaces, ns_writer) = reflector::store::<Namespace>();
    let watch_namespaces = watcher(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(TENANT_NAMESPACE_LABEL),
    )
    .default_backoff()
    .reflect(ns_writer)
    .for_each(|_| futures::future::ready(()));
    let stream = async move {
        // tenant → (session, event keys sent on it)
        let mut sent: HashMap<ClusterId, (String, HashSet<String>)> = HashMap::new();
        let mut events = watcher(Api::<Event>::all(client), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let Some(ns) = event.namespace() else {
                continue;
            };
            let tenant = namespaces
                .get(&StoreRef::new(&ns))
                .and_then(|n| n.labels().get(TENANT_NAMESPACE_LABEL).cloned())
                .and_then(|t| ClusterId::parse(&t).ok());
            let Some(tenant) = tenant else { continue };
            let involved = &event.involved_object;
            let kind = involved.kind.clone().unwrap_or_default();
            if !EVENT_KINDS.contains(&kind.as_str()) {
                continue;
            }
            let Some(session) = registry.session_of(&tenant) else {
                continue;
            };
            let key = format!("{}/{}/{}", ns, event.name_any(), event.count.unwrap_or(1));
            let entry = sent
                .entry(tenant.clone())
                .or_insert_with(|| (session.clone(), HashSet::new()));
            if entry.0 != session {
                *entry = (session.clone(), HashSet::new());
            }
            if !entry.1.insert(key.clone()) {
                continue;
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
                if let Some((_, keys)) = sent.get_mut(&tenant) {
                    keys.remove(&key);
                }
            }
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = watch_namespaces => {}
            _ = stream => {}
        }
    });
}
