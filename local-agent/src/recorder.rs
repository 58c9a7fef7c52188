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

/// The reason of the events saying someone on the provider changed or deleted an object's
/// copy, and the remote agent restored it.
pub const DRIFTED_REASON: &str = "ReflectionDrifted";

/// The reason of the events saying someone on the provider keeps rewriting an object's
/// copy, and the remote agent stopped restoring it.
pub const QUARANTINED_REASON: &str = "ReflectionQuarantined";

/// The event that tells the owner of an origin object what the provider `remote` said of its
/// copy unasked: restored after someone there changed it (the provider says so at a fight's
/// first restore, then at most once per window), or quarantined.
pub fn drift_event(
    remote: &str,
    outcome: refract_wire::proto::Outcome,
    message: &str,
) -> Option<(EventType, &'static str, String)> {
    use refract_wire::proto::Outcome;
    let reason = match outcome {
        Outcome::Drifted => DRIFTED_REASON,
        Outcome::Quarantined => QUARANTINED_REASON,
        _ => return None,
    };
    Some((
        EventType::Warning,
        reason,
        format!("Copy on cluster {remote:?}: {message}"),
    ))
}

/// Records on `reference` (when the object is still there) the event [`drift_event`] makes of
/// what the provider `remote` said unasked, without waiting for it; the event's reason, or
/// `None` when the notice is nothing to report.
pub(crate) fn publish_drift(
    recorder: &Recorder,
    remote: &str,
    reference: Option<ObjectReference>,
    outcome: refract_wire::proto::Outcome,
    message: &str,
) -> Option<&'static str> {
    let (type_, reason, note) = drift_event(remote, outcome, message)?;
    if let Some(reference) = reference {
        let recorder = recorder.clone();
        tokio::spawn(async move { publish_event(&recorder, reference, type_, reason, note).await });
    }
    Some(reason)
}

#[cfg(test)]
mod tests {
    use refract_wire::proto::Outcome;

    use super::*;

    #[test]
    fn drift_and_quarantine_notices_are_warnings_and_nothing_else_is() {
        assert!(drift_event("p", Outcome::Resend, "again").is_none());
        assert!(drift_event("p", Outcome::Applied, "").is_none());
        let (type_, reason, note) = drift_event("p", Outcome::Drifted, "restored").unwrap();
        assert_eq!((type_, reason), (EventType::Warning, DRIFTED_REASON));
        assert_eq!(note, r#"Copy on cluster "p": restored"#);
        let (_, reason, _) = drift_event("p", Outcome::Quarantined, "no longer").unwrap();
        assert_eq!(reason, QUARANTINED_REASON);
    }
}
