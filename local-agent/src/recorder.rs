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
/// copy unasked: restored after someone there changed it (the provider rate-limits these:
/// `restores` is 0 on a restore it does not want reported), or quarantined.
pub fn drift_event(
    remote: &str,
    outcome: refract_wire::proto::Outcome,
    restores: u32,
    message: &str,
) -> Option<(EventType, &'static str, String)> {
    use refract_wire::proto::Outcome;
    let times = match restores {
        1 => "once".to_string(),
        n => format!("{n} times"),
    };
    match outcome {
        Outcome::Resend if restores > 0 => Some((
            EventType::Warning,
            DRIFTED_REASON,
            format!(
                "The copy on cluster {remote:?} was changed or deleted there by someone else; sending it again to restore it (restored {times} in this fight)"
            ),
        )),
        Outcome::Drifted => Some((
            EventType::Warning,
            DRIFTED_REASON,
            format!("Copy on cluster {remote:?}: {message}"),
        )),
        Outcome::Quarantined => Some((
            EventType::Warning,
            QUARANTINED_REASON,
            format!("Copy on cluster {remote:?}: {message}"),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use refract_wire::proto::Outcome;

    use super::*;

    #[test]
    fn drift_is_reported_only_when_the_provider_asks() {
        assert!(drift_event("p", Outcome::Resend, 0, "again").is_none());
        assert!(drift_event("p", Outcome::Applied, 3, "").is_none());
        let (type_, reason, note) = drift_event("p", Outcome::Resend, 1, "x").unwrap();
        assert_eq!((type_, reason), (EventType::Warning, DRIFTED_REASON));
        assert!(note.contains("restored once in this fight"), "{note}");
        let (_, reason, note) =
            drift_event("p", Outcome::Quarantined, 6, "no longer restored").unwrap();
        assert_eq!(reason, QUARANTINED_REASON);
        assert_eq!(note, r#"Copy on cluster "p": no longer restored"#);
        let (_, reason, _) = drift_event("p", Outcome::Drifted, 2, "restored").unwrap();
        assert_eq!(reason, DRIFTED_REASON);
    }
}
