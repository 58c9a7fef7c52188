//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas of an agent
//! exactly one acts.
//!
//! The Lease names its holder and how long a holder that stops renewing keeps it. A candidate
//! takes the Lease over only when the record has not changed, by the candidate's own clock,
//! for that long: clocks of different machines are never compared. A holder renews every
//! retry period and gives up leading once it has not renewed for the renew deadline, which is
//! shorter than the lease duration: it has stopped acting before any candidate may start.
//! A holder that stops on purpose releases the Lease (no holder), so a standby takes over at
//! its next retry instead of waiting out the duration.
//!
//! [`rule`] is the pure rule ([`judge`]); [`Elector`] reads and writes the Lease with it. This
//! file holds the flags and the timing they must keep.

mod elector;
pub mod rule;

use std::time::Duration;

pub use elector::{Elector, Leadership, StillHeld};
pub use rule::{handover_asked, held_by, judge, released, Verdict, HANDOVER_ANNOTATION};

/// Leader election flags, shared by the agents.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// Elect one leader among this agent's replicas with a Lease. Turn off only when exactly
    /// one replica can ever run: two unelected replicas would both act.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,

    /// Namespace of the Leases: by default the agent's own (POD_NAMESPACE, set from the
    /// downward API in deploy/); without it, the local agent's kubeconfig context's namespace,
    /// and the remote agent's --own-namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// This replica's name in the Lease: its pod's name (POD_NAME) in a cluster, so that a
    /// restarted container takes its Lease back at once; otherwise the host name with a random
    /// suffix, so that two processes on one host never share it.
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,

    /// How long a leader that stopped renewing keeps the Lease: a standby takes over this long
    /// after the last renewal it saw.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long a leader keeps acting without a successful renewal before it stops (must be
    /// shorter than the lease duration).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How often the leader renews and a standby looks at the Lease (must be shorter than the
    /// renew deadline).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    refract_core::duration::parse(s)
}

/// The timing of an election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// See [`LeaderElectionArgs::leader_election_lease_duration`].
    pub lease_duration: Duration,
    /// See [`LeaderElectionArgs::leader_election_renew_deadline`].
    pub renew_deadline: Duration,
    /// See [`LeaderElectionArgs::leader_election_retry_period`].
    pub retry_period: Duration,
}

impl Timing {
    /// Checks that a leader always stops before a standby may start.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, String> {
        if lease_duration.as_secs() < 1 {
            return Err("--leader-election-lease-duration must be at least 1s (a Lease counts whole seconds)".into());
        }
        if renew_deadline >= lease_duration {
            return Err(format!(
                "--leader-election-renew-deadline ({renew_deadline:?}) must be shorter than --leader-election-lease-duration ({lease_duration:?}): a leader must stop acting before a standby may take over"
            ));
        }
        if retry_period.is_zero()
            || retry_period >= renew_deadline
            || renew_deadline + retry_period >= lease_duration
        {
            return Err(format!(
                "--leader-election-retry-period ({retry_period:?}) must be above zero, shorter than --leader-election-renew-deadline ({renew_deadline:?}), and with it shorter than --leader-election-lease-duration ({lease_duration:?}): a leader's last look may take a retry period past the deadline"
            ));
        }
        Ok(Self {
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }
}

/// Where and as whom one replica runs for leader.
#[derive(Debug, Clone)]
pub struct Candidacy {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This replica's name in the Lease.
    pub identity: String,
    /// Durations.
    pub timing: Timing,
    /// Whether this replica gives the Lease up when another asks for it
    /// ([`rule::HANDOVER_ANNOTATION`]): for work that follows a client's connection, where
    /// the replica the client reached last should serve it.
    pub yields: bool,
}

impl Candidacy {
    /// The same replica, running for Lease `lease` instead.
    pub fn for_lease(&self, lease: String) -> Self {
        Self {
            lease,
            ..self.clone()
        }
    }

    /// The same, giving the Lease up when asked.
    pub fn yielding(self) -> Self {
        Self {
            yields: true,
            ..self
        }
    }
}

impl LeaderElectionArgs {
    /// The candidacy these flags describe for Lease `lease`, or `None` when election is off.
    /// `default_namespace` is used when no namespace is given (the kubeconfig context's).
    pub fn candidacy(
        &self,
        lease: String,
        default_namespace: &str,
    ) -> Result<Option<Candidacy>, String> {
        if !self.leader_elect {
            return Ok(None);
        }
        let timing = Timing::new(
            self.leader_election_lease_duration,
            self.leader_election_renew_deadline,
            self.leader_election_retry_period,
        )?;
        let identity = match &self.leader_election_identity {
            Some(id) if !id.trim().is_empty() => id.trim().to_string(),
            _ => default_identity(),
        };
        let namespace = self
            .leader_election_namespace
            .clone()
            .filter(|ns| !ns.trim().is_empty())
            .unwrap_or_else(|| default_namespace.to_string());
        Ok(Some(Candidacy {
            namespace,
            lease,
            identity,
            timing,
            yields: false,
        }))
    }
}

/// The host name and a random suffix: unique per process.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "refract".into()
    } else {
        host
    };
    let suffix: u32 = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() as u32
    };
    format!("{host}_{suffix:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_always_stops_before_a_standby_may_start() {
        let s = Duration::from_secs;
        assert!(Timing::new(s(15), s(10), s(2)).is_ok());
        assert!(Timing::new(s(15), s(15), s(2))
            .unwrap_err()
            .contains("renew-deadline"));
        assert!(Timing::new(s(15), s(10), s(5))
            .unwrap_err()
            .contains("retry-period"));
        assert!(Timing::new(
            Duration::from_millis(500),
            Duration::from_millis(200),
            Duration::from_millis(100)
        )
        .is_err());
    }

    #[test]
    fn identities_differ_between_processes_unless_given() {
        let args = LeaderElectionArgs {
            leader_elect: true,
            leader_election_namespace: None,
            leader_election_identity: None,
            leader_election_lease_duration: Duration::from_secs(15),
            leader_election_renew_deadline: Duration::from_secs(10),
            leader_election_retry_period: Duration::from_secs(2),
        };
        let c = args.candidacy("l".into(), "ns").unwrap().unwrap();
        assert_eq!(c.namespace, "ns");
        assert!(c.identity.contains('_'), "{}", c.identity);
        let given = LeaderElectionArgs {
            leader_election_identity: Some("pod-0".into()),
            leader_election_namespace: Some("refract-system".into()),
            ..args.clone()
        };
        let c = given.candidacy("l".into(), "ns").unwrap().unwrap();
        assert_eq!(
            (c.identity.as_str(), c.namespace.as_str()),
            ("pod-0", "refract-system")
        );
        let off = LeaderElectionArgs {
            leader_elect: false,
            ..args
        };
        assert!(off.candidacy("l".into(), "ns").unwrap().is_none());
    }
}
