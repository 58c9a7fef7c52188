//! Pods bound to the virtual node in a namespace that is not extended to it (a DaemonSet that
//! tolerates every taint, or a pod whose namespace stopped being offloaded): what their origin
//! status says, as Liqo's fallback reflector has it. Pure, so the rule is tested alone.

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Reason of a stray pod that has not started: it waits for its namespace.
pub const BACKOFF_REASON: &str = "OffloadingBackOff";
/// Reason of a stray pod that had started: it is over, so that its controller makes another.
pub const ABORTED_REASON: &str = "OffloadingAborted";

/// What becomes of a stray pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stray {
    /// Nothing: it is finished, or already marked.
    Leave,
    /// Pending with [`BACKOFF_REASON`]: it never started, and may yet be offloaded once its
    /// namespace is extended.
    BackOff,
    /// Failed with [`ABORTED_REASON`]: it had started (it ran on the provider while its
    /// namespace was extended), nothing runs it any more, and a controller replaces a Failed
    /// pod; it is never offloaded again.
    Abort,
}

/// The rule, on the pod's origin status.
pub fn judge(status: Option<&PodStatus>) -> Stray {
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let reason = status.and_then(|s| s.reason.as_deref());
    let started = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|c| !c.is_empty());
    match phase {
        "Succeeded" | "Failed" => Stray::Leave,
        "Pending" if !started && reason == Some(BACKOFF_REASON) => Stray::Leave,
        "Pending" if !started => Stray::BackOff,
        _ => Stray::Abort,
    }
}

/// Whether the pod was aborted: it is never offloaded again, even once its namespace is
/// extended anew.
pub fn aborted(status: Option<&PodStatus>) -> bool {
    status.is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some(ABORTED_REASON)
    })
}

/// The conditions of an aborted pod: Ready and ContainersReady False since `now` with
/// [`ABORTED_REASON`] (added when missing), the others as they are.
pub fn aborted_conditions(
    conditions: &[PodCondition],
    message: &str,
    now: Time,
) -> Vec<PodCondition> {
    const NOT_READY: [&str; 2] = ["Ready", "ContainersReady"];
    let not_ready = |type_: &str| PodCondition {
        type_: type_.into(),
        status: "False".into(),
        reason: Some(ABORTED_REASON.into()),
        message: Some(message.into()),
        last_transition_time: Some(now.clone()),
        ..Default::default()
    };
    let mut out: Vec<PodCondition> = conditions
        .iter()
        .map(|c| {
            if NOT_READY.contains(&c.type_.as_str()) {
                not_ready(&c.type_)
            } else {
                c.clone()
            }
        })
        .collect();
    for type_ in NOT_READY {
        if !out.iter().any(|c| c.type_ == type_) {
            out.push(not_ready(type_));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerStatus;

    fn status(phase: &str, reason: Option<&str>, started: bool) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            reason: reason.map(str::to_string),
            container_statuses: started.then(|| vec![ContainerStatus::default()]),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_that_never_started_backs_off_once_and_one_that_did_is_aborted() {
        assert_eq!(judge(None), Stray::BackOff);
        assert_eq!(judge(Some(&status("Pending", None, false))), Stray::BackOff);
        assert_eq!(
            judge(Some(&status("Pending", Some(BACKOFF_REASON), false))),
            Stray::Leave
        );
        assert_eq!(judge(Some(&status("Running", None, true))), Stray::Abort);
        assert_eq!(judge(Some(&status("Unknown", None, false))), Stray::Abort);
        assert_eq!(judge(Some(&status("Pending", None, true))), Stray::Abort);
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(judge(Some(&status(phase, None, true))), Stray::Leave);
        }
    }

    #[test]
    fn only_a_failed_pod_of_that_reason_counts_as_aborted() {
        assert!(aborted(Some(&status("Failed", Some(ABORTED_REASON), true))));
        assert!(!aborted(Some(&status("Failed", Some("Error"), true))));
        assert!(!aborted(Some(&status(
            "Running",
            Some(ABORTED_REASON),
            true
        ))));
        assert!(!aborted(None));
    }

    #[test]
    fn an_aborted_pod_is_not_ready_and_keeps_its_other_conditions() {
        let at = |secs| Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap());
        let condition = |type_: &str, status: &str| PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(at(1)),
            ..Default::default()
        };
        let out = aborted_conditions(
            &[
                condition("PodScheduled", "True"),
                condition("Ready", "True"),
            ],
            "gone",
            at(2),
        );
        let seen: Vec<(&str, &str, Option<&str>)> = out
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("PodScheduled", "True", None),
                ("Ready", "False", Some(ABORTED_REASON)),
                ("ContainersReady", "False", Some(ABORTED_REASON)),
            ]
        );
        assert_eq!(out[1].last_transition_time, Some(at(2)));
        assert_eq!(out[0].last_transition_time, Some(at(1)));
    }
}
