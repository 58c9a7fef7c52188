//! Pods bound to the virtual node in a namespace that is not extended to it (a DaemonSet that
//! tolerates every taint, or a pod whose namespace stopped being offloaded): what their origin
//! status says, as Liqo's fallback reflector has it. Pure, so the rule is tested alone.

use k8s_openapi::api::core::v1::PodStatus;

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
}
