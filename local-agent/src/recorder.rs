//! Recording events on origin objects, for every part of the local agent that tells a user
//! something about an object of theirs (reflection, offloading, tokens, the scheduling gate).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// Records an event on an origin object; failures are logged, never fatal.
pub(crate) async fn publish_event(
    recorder: &Recorder,
    reference: ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reflect".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &reference).await {
        tracing::warn!(%error, "failed to record event");
    }
}

/// The reason of the events (and of a pod's Pending status) saying the provider has no room
/// for an object in this cluster's quota there.
pub const QUOTA_REASON: &str = "ProviderQuotaExceeded";
