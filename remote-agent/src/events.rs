//! Streams events about tenants' objects back to their origin.
//!
//! Events are watched in the tenants' namespaces only: one watch per live tenant namespace,
//! started and stopped as the tenant objects' store of namespaces changes, so the provider's
//! own events are never read. An event whose involved object is one of the reflected kinds
//! (or a ShadowPod) goes to the tenant's record in the provider's outbox ([`crate::outbox`]),
//! its count as its state: each session gets each count once, a tenant away gets the events
//! still there when it is back, and an event the API server expired is forgotten. The origin
//! records it on the matching local object, folding repeats of one event by name, so an event
//! sent again to a new session is counted once there.

use std::collections::{BTreeMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use kube::api::Api;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{self, remote_message, ObjectRef, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::identity::Identities;
use crate::kinds::Allowed;
use crate::objects::TenantObjects;
use crate::outbox::{Outbox, Subject};

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

/// How long a namespace's event watch waits after its tenant's binding could not be written.
const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Starts the event stream: follows the tenant namespaces in `objects`.
pub fn spawn(
    identities: Identities,
    outbox: Outbox,
    objects: TenantObjects,
    shutdown: CancellationToken,
) {
    let Some(mut namespaces_changed) = objects.follow(Allowed::Namespace) else {
        return;
    };
    tokio::spawn(async move {
        // namespace → (its tenant, the token that stops its watch)
        let mut watched: BTreeMap<String, (ClusterId, CancellationToken)> = BTreeMap::new();
        loop {
            let now = objects.tenant_namespaces();
            watched.retain(|ns, (tenant, stop)| {
                let keep = now.get(ns) == Some(tenant);
                if !keep {
                    stop.cancel();
                    // Gone or no longer the tenant's: a namespace of that name later needs
                    // its binding written again.
                    identities.forget(ns);
                }
                keep
            });
            for (ns, tenant) in now {
                if watched.contains_key(&ns) {
                    continue;
                }
                let stop = shutdown.child_token();
                watched.insert(ns.clone(), (tenant.clone(), stop.clone()));
                let watch = watch_namespace(
                    identities.clone(),
                    outbox.clone(),
                    ns.clone(),
                    tenant.clone(),
                );
                let outbox = outbox.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = watch => {}
                    }
                    // The namespace is gone, or no longer the tenant's: so are its events.
                    outbox.remove_events_of(&tenant, &ns);
                });
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = namespaces_changed.changed() => if changed.is_err() { return },
            }
        }
    });
}

/// Records `tenant`'s events of its namespace `ns` in the outbox as they come and go, read as
/// the tenant, once its binding there is in force.
async fn watch_namespace(identities: Identities, outbox: Outbox, ns: String, tenant: ClusterId) {
    // The namespace is the tenant's by its label, as the write path checks it; the binding is
    // written once per namespace in this process, by whichever needs it first.
    while let Err(error) = identities.bind(&tenant, &ns).await {
        tracing::warn!(%tenant, namespace = %ns, %error, "cannot bind the tenant in its namespace yet; its events wait");
        tokio::time::sleep(BIND_RETRY).await;
    }
    let client = match identities.client(&tenant) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%tenant, namespace = %ns, %error, "no client for the tenant; its events are not streamed");
            return;
        }
    };
    let mut events = watcher(
        Api::<Event>::namespaced(client, &ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    // The names of the events recorded, and while the watch lists again those the list had:
    // an event that expired while the watch was away is reported by no Delete.
    let mut recorded: HashSet<String> = HashSet::new();
    let mut listing: Option<HashSet<String>> = None;
    while let Some(change) = events.next().await {
        let Ok(change) = change else { continue };
        match change {
            watcher::Event::Init => listing = Some(HashSet::new()),
            watcher::Event::InitApply(event) | watcher::Event::Apply(event) => {
                let name = event.name_any();
                if let Some(listing) = listing.as_mut() {
                    listing.insert(name.clone());
                }
                if record(&outbox, &tenant, &ns, event) {
                    recorded.insert(name);
                }
            }
            watcher::Event::InitDone => {
                let listed = listing.take().unwrap_or_default();
                for gone in recorded.difference(&listed) {
                    outbox.remove(&Subject::event(&ns, gone));
                }
                recorded.retain(|name| listed.contains(name));
            }
            watcher::Event::Delete(event) => {
                let name = event.name_any();
                recorded.remove(&name);
                outbox.remove(&Subject::event(&ns, &name));
            }
        }
    }
}

/// Records `event` for `tenant` if it is about a kind whose events go back; true if it was.
fn record(outbox: &Outbox, tenant: &ClusterId, ns: &str, event: Event) -> bool {
    let involved = &event.involved_object;
    let kind = involved.kind.clone().unwrap_or_default();
    if !EVENT_KINDS.contains(&kind.as_str()) {
        return false;
    }
    let subject = Subject::event(ns, &event.name_any());
    // The count is the event's state: a new count is sent, anything else about it is not.
    let count = event.count.unwrap_or(1).to_string();
    let message = RemoteMessage {
        kind: Some(remote_message::Kind::Event(proto::Event {
            involved: Some(ObjectRef {
                api_version: involved.api_version.clone().unwrap_or_default(),
                kind,
                namespace: ns.to_string(),
                name: involved.name.clone().unwrap_or_default(),
            }),
            origin_uid: String::new(),
            event_json: serde_json::to_vec(&as_sent(event)).unwrap_or_default(),
        })),
    };
    outbox.put(tenant, subject, count, message);
    true
}

/// The part of a provider event the origin reads: its name (repeats of one event fold by
/// name), annotations (a skip-reflection annotation), what it is about, what it says, its
/// count, timestamps and reporter. The rest stays on the provider: managed fields, UIDs and
/// resource versions mean nothing at the origin, and `source.host` and `reportingInstance`
/// name the provider's nodes (a message may still name one: the scheduler's says where it put
/// the pod, and it is the tenant's own pod's). The outbox keeps each tenant's events
/// until they expire, one per provider pod at least (the scheduler's), so what is not sent is
/// not held either.
fn as_sent(event: Event) -> Event {
    // Field by field, so a field a later Kubernetes adds to events stays here until it is
    // named.
    let (meta, involved) = (event.metadata, event.involved_object);
    Event {
        metadata: kube::api::ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            annotations: meta.annotations,
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: involved.api_version,
            kind: involved.kind,
            name: involved.name,
            namespace: involved.namespace,
            field_path: involved.field_path,
            ..Default::default()
        },
        reason: event.reason,
        message: event.message,
        type_: event.type_,
        count: event.count,
        first_timestamp: event.first_timestamp,
        last_timestamp: event.last_timestamp,
        event_time: event.event_time,
        source: event.source.map(|s| EventSource {
            component: s.component,
            host: None,
        }),
        action: event.action,
        reporting_component: event.reporting_component,
        series: event.series,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
