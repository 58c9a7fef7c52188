//! Provider events decoded with bounds, and written as origin events.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL};

use super::aggregate::Pending;
use super::EventWriter;
use crate::key::Key;

/// The largest provider event, in bytes of JSON, decoded.
const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Longest reason and action kept (the API server's own limit for reasons).
const MAX_REASON: usize = 128;
/// Longest message kept.
const MAX_MESSAGE: usize = 1024;

/// The origin object an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its kind at the origin.
    pub kind: &'static str,
    /// Its namespace and name at the origin.
    pub key: Key,
    /// Its UID at the origin.
    pub uid: String,
}

/// The origin kind of a provider kind: a ShadowPod's events are its pod's.
pub fn local_kind(provider_kind: &str) -> &'static str {
    match provider_kind {
        "Pod" | "ShadowPod" => "Pod",
        "Service" => "Service",
        "ConfigMap" => "ConfigMap",
        "Secret" => "Secret",
        "PersistentVolumeClaim" => "PersistentVolumeClaim",
        "EndpointSlice" => "EndpointSlice",
        "Ingress" => "Ingress",
        _ => "Unknown",
    }
}

fn api_version(kind: &str) -> &'static str {
    match kind {
        "EndpointSlice" => "discovery.k8s.io/v1",
        "Ingress" => "networking.k8s.io/v1",
        _ => "v1",
    }
}

/// Decodes a provider event, refusing what the origin would not store and cutting long text.
pub fn decode(json: &[u8]) -> Result<Event, String> {
    if json.len() > MAX_EVENT_BYTES {
        return Err(format!(
            "the event is {} bytes, over the limit of {MAX_EVENT_BYTES}",
            json.len()
        ));
    }
    let mut event: Event =
        serde_json::from_slice(json).map_err(|e| format!("malformed event: {e}"))?;
    match event.type_.as_deref() {
        Some("Normal" | "Warning") => {}
        other => {
            return Err(format!(
                "event type {:?} is neither Normal nor Warning",
                other.map(refract_core::inbound::excerpt)
            ))
        }
    }
    let cut = |text: &mut Option<String>, max: usize| {
        if let Some((at, _)) = text.as_deref().and_then(|t| t.char_indices().nth(max)) {
            if let Some(t) = text.as_mut() {
                t.truncate(at);
            }
        }
    };
    cut(&mut event.reason, MAX_REASON);
    cut(&mut event.action, MAX_REASON);
    cut(&mut event.message, MAX_MESSAGE);
    Ok(event)
}

/// The origin event for an aggregate.
pub fn origin_event(pending: &Pending, local_id: &str, remote_id: &str) -> Event {
    let remote = &pending.latest;
    let target = &pending.target;
    let source = remote.source.clone().unwrap_or_default();
    // Events of the newer API carry only an event time: shown as the core/v1 timestamps.
    let at = remote.event_time.as_ref().map(|t| Time(t.0));
    let last = remote.last_timestamp.clone().or_else(|| at.clone());
    let component = source
        .component
        .map(|c| refract_core::inbound::excerpt(&c))
        .unwrap_or_default();
    Event {
        metadata: kube::api::ObjectMeta {
            name: Some(pending.origin_name.clone()),
            namespace: Some(target.key.namespace.clone()),
            labels: Some(
                [
                    (ORIGIN_LABEL.to_string(), local_id.to_string()),
                    (DESTINATION_LABEL.to_string(), remote_id.to_string()),
                ]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(api_version(target.kind).into()),
            kind: Some(target.kind.into()),
            name: Some(target.key.name.clone()),
            namespace: Some(target.key.namespace.clone()),
            uid: Some(target.uid.clone()),
            field_path: remote
                .involved_object
                .field_path
                .as_deref()
                .map(refract_core::inbound::excerpt),
            resource_version: None,
        },
        reason: remote.reason.clone(),
        message: remote.message.clone(),
        type_: remote.type_.clone(),
        count: Some(pending.count),
        first_timestamp: remote.first_timestamp.clone().or(at),
        last_timestamp: last,
        // Written as a core/v1 event (count and timestamps); the provider's event time and
        // reporting fields would make the API server ask for a series instead.
        event_time: None,
        action: None,
        reporting_component: None,
        reporting_instance: None,
        source: Some(EventSource {
            component: Some(format!("{component} (remote)")),
            host: None,
        }),
        related: None,
        series: None,
    }
}

/// Writes events to the origin's API server.
pub struct KubeEventWriter {
    /// The origin cluster.
    pub client: kube::Client,
    /// This origin's cluster id.
    pub local_id: String,
    /// The provider's cluster id.
    pub remote_id: String,
}

impl EventWriter for KubeEventWriter {
    async fn write(&self, pending: Pending) {
        let event = origin_event(&pending, &self.local_id, &self.remote_id);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &pending.target.key.namespace);
        let update = || async {
            let patch = serde_json::json!({
                "count": event.count,
                "message": event.message,
                "lastTimestamp": event.last_timestamp,
            });
            api.patch(
                &pending.origin_name,
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map(|_| ())
        };
        let result = if pending.first {
            match api.create(&PostParams::default(), &event).await {
                Err(kube::Error::Api(s)) if s.code == 409 => update().await,
                other => other.map(|_| ()),
            }
        } else {
            match update().await {
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    api.create(&PostParams::default(), &event).await.map(|_| ())
                }
                other => other,
            }
        };
        if let Err(error) = result {
            tracing::warn!(namespace = %pending.target.key.namespace, object = %pending.target.key.name, %error, "failed to record provider event");
        }
    }
}
