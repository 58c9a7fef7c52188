//! Offloaded pods' readiness while their provider is unreachable.
//!
//! When the virtual node turns NotReady the origin can no longer tell whether its pods serve:
//! their Ready and ContainersReady conditions turn False (reason [`UNREACHABLE_REASON`]), so
//! their Services' endpoints stop sending traffic to them. The node lifecycle controller does
//! this only for nodes whose kubelet stops posting status; this agent posts NotReady itself.
//! When the node is Ready again, the provider's last status of each pod is written once more.

use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The reason on conditions turned False because the provider is unreachable.
pub const UNREACHABLE_REASON: &str = "ProviderUnreachable";

/// The conditions of a pod whose provider is unreachable: Ready and ContainersReady False since
/// `now` (unchanged when already False), the others as they are. `None` when nothing changes.
pub fn unreachable_conditions(
    conditions: &[PodCondition],
    node: &str,
    now: Time,
) -> Option<Vec<PodCondition>> {
    let mut changed = false;
    let out = conditions
        .iter()
        .map(|c| {
            let affected = c.type_ == "Ready" || c.type_ == "ContainersReady";
            if !affected || c.status == "False" {
                return c.clone();
            }
            changed = true;
            PodCondition {
                status: "False".into(),
                reason: Some(UNREACHABLE_REASON.into()),
                message: Some(format!(
                    "the provider behind virtual node {node} is unreachable; whether the pod serves is unknown"
                )),
                last_transition_time: Some(now.clone()),
                ..c.clone()
            }
        })
        .collect();
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str) -> PodCondition {
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            ..Default::default()
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
    }

    #[test]
    fn ready_and_containers_ready_turn_false_and_the_rest_stay() {
        let before = [
            cond("Initialized", "True"),
            cond("Ready", "True"),
            cond("ContainersReady", "True"),
            cond("PodScheduled", "True"),
        ];
        let after = unreachable_conditions(&before, "refract-p", now()).unwrap();
        let statuses: Vec<(&str, &str)> = after
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            statuses,
            [
                ("Initialized", "True"),
                ("Ready", "False"),
                ("ContainersReady", "False"),
                ("PodScheduled", "True")
            ]
        );
        assert_eq!(after[1].reason.as_deref(), Some(UNREACHABLE_REASON));
        assert_eq!(after[1].last_transition_time, Some(now()));
        assert_eq!(after[0], before[0]);
    }

    #[test]
    fn a_pod_not_ready_already_is_left_alone() {
        let before = [cond("Ready", "False"), cond("ContainersReady", "False")];
        assert_eq!(unreachable_conditions(&before, "refract-p", now()), None);
        assert_eq!(unreachable_conditions(&[], "refract-p", now()), None);
    }
}
