//! The rule of the election, pure: what a replica does about the Lease as it read it, and
//! the Lease it writes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// Set on a Lease another replica holds, naming the replica that asks for it. A holder that
/// yields ([`crate::leader::Candidacy::yields`]) stops acting and releases the Lease at its
/// next renewal; the one that asked takes it at its next look.
pub const HANDOVER_ANNOTATION: &str = "refract.io/handover-to";

/// Who asks `me`, holding the Lease, to hand it over: the replica named by
/// [`HANDOVER_ANNOTATION`], unless that is `me` (a request of mine left from taking it over).
pub fn handover_asked(annotations: Option<&BTreeMap<String, String>>, me: &str) -> Option<String> {
    annotations
        .and_then(|a| a.get(HANDOVER_ANNOTATION))
        .map(|by| by.trim())
        .filter(|by| !by.is_empty() && *by != me)
        .map(str::to_string)
}

/// What a replica does about the Lease as it last read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No Lease yet: create it, holding it.
    Create,
    /// This replica holds it: renew.
    Renew,
    /// Nobody holds it, or its holder let it lapse: take it over.
    TakeOver {
        /// The holder it lapsed from, if any.
        from: Option<String>,
    },
    /// Another replica holds it.
    Wait {
        /// The holder.
        holder: String,
        /// How long until it lapses unless renewed.
        lapses_in: Duration,
    },
}

/// The rule: `spec` is the Lease as read (`None`: there is none), `unchanged_for` how long this
/// replica has seen it without a change.
pub fn judge(spec: Option<&LeaseSpec>, me: &str, unchanged_for: Duration) -> Verdict {
    let Some(spec) = spec else {
        return Verdict::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder == me {
        return Verdict::Renew;
    }
    if holder.is_empty() {
        return Verdict::TakeOver { from: None };
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    if unchanged_for >= duration {
        return Verdict::TakeOver {
            from: Some(holder.to_string()),
        };
    }
    Verdict::Wait {
        holder: holder.to_string(),
        lapses_in: duration - unchanged_for,
    }
}

/// The Lease's spec once `me` holds it, from what it was (acquisitions are counted).
pub fn held_by(
    previous: Option<&LeaseSpec>,
    me: &str,
    lease_duration: Duration,
    now: MicroTime,
) -> LeaseSpec {
    let kept = previous.filter(|p| p.holder_identity.as_deref() == Some(me));
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(lease_duration.as_secs().min(i32::MAX as u64) as i32),
        acquire_time: Some(
            kept.and_then(|p| p.acquire_time.clone())
                .unwrap_or_else(|| now.clone()),
        ),
        renew_time: Some(now),
        lease_transitions: Some(if kept.is_some() || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..Default::default()
    }
}

/// The Lease's spec once released: no holder, so the next candidate takes it at once.
pub fn released(previous: &LeaseSpec, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: previous.acquire_time.clone(),
        renew_time: Some(now),
        lease_transitions: previous.lease_transitions,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn held(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_lease_is_created_and_ones_own_renewed_at_once() {
        assert_eq!(judge(None, "a", Duration::ZERO), Verdict::Create);
        assert_eq!(
            judge(Some(&held("a", 15)), "a", Duration::ZERO),
            Verdict::Renew,
            "a restarted container with the same identity leads again without waiting"
        );
    }

    #[test]
    fn another_holder_is_waited_for_until_its_lease_lapses_by_our_clock() {
        let spec = held("b", 15);
        assert_eq!(
            judge(Some(&spec), "a", Duration::from_secs(4)),
            Verdict::Wait {
                holder: "b".into(),
                lapses_in: Duration::from_secs(11)
            }
        );
        assert_eq!(
            judge(Some(&spec), "a", Duration::from_secs(15)),
            Verdict::TakeOver {
                from: Some("b".into())
            }
        );
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let spec = released(&held("b", 15), at(100));
        assert_eq!(
            judge(Some(&spec), "a", Duration::ZERO),
            Verdict::TakeOver { from: None }
        );
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() {
        let first = held_by(None, "a", Duration::from_secs(15), at(10));
        assert_eq!(first.lease_transitions, Some(0));
        assert_eq!(first.acquire_time, Some(at(10)));
        let renewed = held_by(Some(&first), "a", Duration::from_secs(15), at(12));
        assert_eq!(renewed.acquire_time, Some(at(10)));
        assert_eq!(renewed.renew_time, Some(at(12)));
        assert_eq!(renewed.lease_transitions, Some(0));
        let taken = held_by(Some(&renewed), "b", Duration::from_secs(15), at(40));
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.acquire_time, Some(at(40)));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.lease_duration_seconds, Some(15));
    }

    #[test]
    fn a_handover_is_asked_by_another_replica_only() {
        let asked = |v: &str| Some([(HANDOVER_ANNOTATION.to_string(), v.to_string())].into());
        assert_eq!(handover_asked(asked("b").as_ref(), "a"), Some("b".into()));
        assert_eq!(
            handover_asked(asked("a").as_ref(), "a"),
            None,
            "my own request, left on the Lease I took"
        );
        assert_eq!(handover_asked(asked(" ").as_ref(), "a"), None);
        assert_eq!(handover_asked(None, "a"), None);
    }
}
