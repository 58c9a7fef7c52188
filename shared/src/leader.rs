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
//! [`judge`] is the pure rule; [`Elector`] reads and writes the Lease with it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Leader election flags, shared by the agents.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// Elect one leader among this agent's replicas with a Lease. Turn off only when exactly
    /// one replica can ever run: two unelected replicas would both act.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,

    /// Namespace of the Lease: by default the agent's own (POD_NAMESPACE, set from the
    /// downward API in deploy/), else the namespace of the kubeconfig's context.
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

/// What one look at the Lease came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease now.
    Holding,
    /// Another replica holds it.
    Held { holder: String, lapses_in: Duration },
    /// Someone wrote the Lease between this replica's read and write: the next read tells who.
    Raced,
}

/// One replica's side of the election.
pub struct Elector {
    leases: Api<Lease>,
    candidacy: Candidacy,
    /// The Lease's spec as last read or written, and since when this replica has seen it so.
    seen: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    /// An elector for `candidacy`, on `client`'s cluster.
    pub fn new(client: kube::Client, candidacy: Candidacy) -> Self {
        Self {
            leases: Api::namespaced(client, &candidacy.namespace),
            candidacy,
            seen: None,
        }
    }

    /// Waits until this replica holds the Lease, then keeps renewing it until the returned
    /// [`Leadership`] is released or lost. Errors reading the Lease (a missing namespace, no
    /// access) are logged with the reason and retried.
    pub async fn acquire(mut self) -> Leadership {
        let retry = self.candidacy.timing.retry_period;
        let mut last_said: Option<String> = None;
        loop {
            let started = Instant::now();
            match self.attempt().await {
                Ok(Attempt::Holding) => {
                    tracing::info!(lease = %self.lease_ref(), identity = %self.candidacy.identity, "this replica leads");
                    return Leadership::spawn(self, started);
                }
                Ok(Attempt::Raced) => {}
                Ok(Attempt::Held { holder, lapses_in }) => {
                    if last_said.as_deref() != Some(holder.as_str()) {
                        tracing::info!(lease = %self.lease_ref(), %holder, identity = %self.candidacy.identity, lapses_in = ?lapses_in, "standing by: another replica leads");
                        last_said = Some(holder);
                    }
                }
                Err(error) => {
                    // Said once per distinct error, not at every retry.
                    let said = format!("error: {error}");
                    if last_said.as_deref() != Some(said.as_str()) {
                        tracing::warn!(lease = %self.lease_ref(), %error, "failed to read or write the leader election Lease; retrying (does the namespace exist, and may this agent get, create and update leases in it?)");
                        last_said = Some(said);
                    }
                }
            }
            tokio::time::sleep(retry).await;
        }
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.candidacy.namespace, self.candidacy.lease)
    }

    /// Reads the Lease and acts on [`judge`]'s verdict once.
    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let current = self.leases.get_opt(&self.candidacy.lease).await?;
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let now = Instant::now();
        let unchanged_for = match (&self.seen, &spec) {
            (Some((seen, since)), Some(spec)) if seen == spec => now - *since,
            _ => Duration::ZERO,
        };
        if let Some(spec) = &spec {
            if unchanged_for.is_zero() {
                self.seen = Some((spec.clone(), now));
            }
        }
        let me = self.candidacy.identity.clone();
        let duration = self.candidacy.timing.lease_duration;
        let wall = MicroTime(k8s_openapi::jiff::Timestamp::now());
        match (judge(spec.as_ref(), &me, unchanged_for), current) {
            (Verdict::Wait { holder, lapses_in }, _) => Ok(Attempt::Held { holder, lapses_in }),
            (Verdict::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.candidacy.lease.clone()),
                        namespace: Some(self.candidacy.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(held_by(None, &me, duration, wall)),
                };
                match self.leases.create(&PostParams::default(), &lease).await {
                    Ok(created) => self.wrote(created, now),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(self.raced()),
                    Err(e) => Err(e),
                }
            }
            (verdict, Some(mut lease)) => {
                if let Verdict::TakeOver { from } = &verdict {
                    tracing::info!(lease = %self.lease_ref(), from = from.as_deref().unwrap_or("nobody"), "taking the Lease over");
                }
                let previous = lease.spec.take();
                lease.spec = Some(held_by(previous.as_ref(), &me, duration, wall));
                // The read's resourceVersion makes this a compare-and-swap: of two replicas
                // taking over at once, one is answered 409.
                match self
                    .leases
                    .replace(&self.candidacy.lease, &PostParams::default(), &lease)
                    .await
                {
                    Ok(replaced) => self.wrote(replaced, now),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(self.raced()),
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn wrote(&mut self, lease: Lease, at: Instant) -> Result<Attempt, kube::Error> {
        self.seen = lease.spec.map(|s| (s, at));
        Ok(Attempt::Holding)
    }

    fn raced(&mut self) -> Attempt {
        // The duration starts again from the next read.
        self.seen = None;
        Attempt::Raced
    }

    /// Gives the Lease up if this replica still holds it.
    async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.leases.get_opt(&self.candidacy.lease).await else {
            return;
        };
        let Some(spec) = lease.spec.take() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.candidacy.identity.as_str()) {
            return;
        }
        lease.spec = Some(released(
            &spec,
            MicroTime(k8s_openapi::jiff::Timestamp::now()),
        ));
        match self
            .leases
            .replace(&self.candidacy.lease, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %self.lease_ref(), "released the Lease: a standby takes over at its next look")
            }
            Err(error) => {
                tracing::warn!(lease = %self.lease_ref(), %error, "failed to release the Lease; a standby takes over once it lapses")
            }
        }
    }
}

/// This replica's leadership: renewed in the background until released or lost.
pub struct Leadership {
    lost: CancellationToken,
    stop: CancellationToken,
    renewing: tokio::task::JoinHandle<Elector>,
}

impl Leadership {
    fn spawn(elector: Elector, renewed_at: Instant) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let renewing = tokio::spawn(renew(elector, renewed_at, lost.clone(), stop.clone()));
        Self {
            lost,
            stop,
            renewing,
        }
    }

    /// Resolves when leadership is lost: the Lease could not be renewed within the renew
    /// deadline, or another replica holds it. Everything leader-only must stop then.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Stops renewing and gives the Lease up, after the caller has stopped acting.
    pub async fn release(self) {
        self.stop.cancel();
        if let Ok(mut elector) = self.renewing.await {
            if !self.lost.is_cancelled() {
                elector.release().await;
            }
        }
    }
}

async fn renew(
    mut elector: Elector,
    mut renewed_at: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
) -> Elector {
    let Timing {
        renew_deadline,
        retry_period,
        ..
    } = elector.candidacy.timing;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return elector,
            _ = tokio::time::sleep(retry_period) => {}
        }
        let started = Instant::now();
        // Past the deadline (a process paused by SIGSTOP or the node, a slow API server) one
        // more look of at most a retry period decides: a renewal that succeeds is a
        // compare-and-swap on a Lease still naming this replica, so nobody took it meanwhile.
        let left = renew_deadline
            .saturating_sub(started - renewed_at)
            .max(retry_period);
        match tokio::time::timeout(left, elector.attempt()).await {
            Ok(Ok(Attempt::Holding)) => renewed_at = started,
            // A write between our read and ours (another replica's takeover shows at the next
            // read): not renewed, so the deadline keeps counting.
            Ok(Ok(Attempt::Raced)) => {}
            Ok(Ok(Attempt::Held { holder, .. })) => {
                tracing::error!(lease = %elector.lease_ref(), %holder, "another replica holds the Lease: this replica stops leading");
                lost.cancel();
                return elector;
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %elector.lease_ref(), %error, "failed to renew the Lease; retrying until the renew deadline")
            }
            Err(_) => {}
        }
        if renewed_at.elapsed() >= renew_deadline {
            tracing::error!(lease = %elector.lease_ref(), deadline = ?renew_deadline, "could not renew the Lease within the renew deadline: this replica stops leading");
            lost.cancel();
            return elector;
        }
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
