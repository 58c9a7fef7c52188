//! One replica's side of the election: reading and writing the Lease by [`super::rule`], and
//! renewing it while leading.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rule::{handover_asked, held_by, judge, released, Verdict, HANDOVER_ANNOTATION};
use super::{Candidacy, Timing};

/// What one look at the Lease came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease now.
    Holding,
    /// Another replica holds it.
    Held { holder: String, lapses_in: Duration },
    /// Someone wrote the Lease between this replica's read and write: the next read tells who.
    Raced,
    /// This replica holds it, yields, and another replica asks for it: not renewed.
    Asked { by: String },
}

/// Why [`Elector::claim`] gave up, and the elector for the next claim: it keeps what it saw
/// of the Lease, so that a holder gone silent lapses across claims.
pub struct StillHeld {
    /// Why, for a person: who holds the Lease, or why it could not be read or written.
    pub by: String,
    /// The next claim's elector.
    pub elector: Elector,
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
            match self.attempt(false).await {
                Ok(Attempt::Holding) => {
                    tracing::info!(lease = %self.lease_ref(), identity = %self.candidacy.identity, "this replica leads");
                    return Leadership::spawn(self, started);
                }
                // Asked: only a yielding holder is, and it stops at its next renewal.
                Ok(Attempt::Raced | Attempt::Asked { .. }) => {}
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

    /// Takes the Lease within `within`, asking its holder to hand it over
    /// ([`super::rule::HANDOVER_ANNOTATION`]) when another replica holds it; looks again every
    /// `poll`. A holder that yields releases it at its next renewal; one that is gone lets it
    /// lapse after the lease duration.
    pub async fn claim(
        mut self,
        within: Duration,
        poll: Duration,
    ) -> Result<Leadership, StillHeld> {
        let deadline = Instant::now() + within;
        let mut asked = false;
        loop {
            let started = Instant::now();
            // An API server that does not answer must not hold the claim past its deadline.
            let left = deadline.saturating_duration_since(started).max(poll);
            let looked = match tokio::time::timeout(left, self.attempt(true)).await {
                Ok(looked) => looked,
                Err(_) => {
                    return Err(StillHeld {
                        by: format!("the API server did not answer within {within:?}"),
                        elector: self,
                    })
                }
            };
            let by = match looked {
                Ok(Attempt::Holding) => {
                    tracing::info!(lease = %self.lease_ref(), identity = %self.candidacy.identity, "took the Lease");
                    return Ok(Leadership::spawn(self, started));
                }
                Ok(Attempt::Raced) => {
                    String::from("another replica wrote the Lease at the same time")
                }
                Ok(Attempt::Held { holder, .. }) => {
                    if !asked {
                        match tokio::time::timeout(poll, self.ask_handover()).await {
                            Ok(Ok(())) => asked = true,
                            Ok(Err(error)) => {
                                tracing::debug!(lease = %self.lease_ref(), %error, "asking for the Lease failed; asking again")
                            }
                            Err(_) => {
                                tracing::debug!(lease = %self.lease_ref(), "asking for the Lease took too long; asking again")
                            }
                        }
                    }
                    format!("replica {holder} holds it and has not handed it over")
                }
                Ok(Attempt::Asked { by }) => format!("replica {by} asks for it"),
                Err(error) => {
                    format!("the Lease could not be read or written: {error}")
                }
            };
            if Instant::now() + poll > deadline {
                return Err(StillHeld { by, elector: self });
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Names this replica on the Lease as the one asking for it.
    async fn ask_handover(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.leases.get_opt(&self.candidacy.lease).await? else {
            return Ok(());
        };
        let me = &self.candidacy.identity;
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        if annotations.get(HANDOVER_ANNOTATION) == Some(me) {
            return Ok(());
        }
        annotations.insert(HANDOVER_ANNOTATION.to_string(), me.clone());
        // A compare-and-swap like every write here: a 409 means the holder renewed meanwhile,
        // and the caller asks again.
        self.leases
            .replace(&self.candidacy.lease, &PostParams::default(), &lease)
            .await?;
        tracing::info!(lease = %self.lease_ref(), identity = %me, "asked the holder to hand the Lease over");
        Ok(())
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.candidacy.namespace, self.candidacy.lease)
    }

    /// Reads the Lease and acts on [`judge`]'s verdict once. `claiming`: a client reached this
    /// replica just now, so a holder's pending request for the Lease is overruled, and cleared
    /// as this replica writes it.
    async fn attempt(&mut self, claiming: bool) -> Result<Attempt, kube::Error> {
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
        let verdict = judge(spec.as_ref(), &me, unchanged_for);
        let yields = self.candidacy.yields && !claiming;
        if let (Verdict::Renew, true, Some(lease)) = (&verdict, yields, &current) {
            if let Some(by) = handover_asked(lease.metadata.annotations.as_ref(), &me) {
                return Ok(Attempt::Asked { by });
            }
        }
        match (verdict, current) {
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
                // This replica's own request is granted by taking the Lease; a claim overrules
                // any other.
                if let Some(annotations) = lease.metadata.annotations.as_mut() {
                    if claiming || annotations.get(HANDOVER_ANNOTATION) == Some(&me) {
                        annotations.remove(HANDOVER_ANNOTATION);
                    }
                }
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
    /// Set when a yielding holder was asked for the Lease: by whom.
    asked_by: std::sync::Arc<std::sync::OnceLock<String>>,
    renewing: tokio::task::JoinHandle<Elector>,
}

impl Leadership {
    fn spawn(elector: Elector, renewed_at: Instant) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let asked_by = std::sync::Arc::default();
        let renewing = tokio::spawn(renew(
            elector,
            renewed_at,
            Ends {
                lost: lost.clone(),
                stop: stop.clone(),
                asked_by: std::sync::Arc::clone(&asked_by),
            },
        ));
        Self {
            lost,
            stop,
            asked_by,
            renewing,
        }
    }

    /// Resolves when leadership is lost: the Lease could not be renewed within the renew
    /// deadline, another replica holds it, or (yielding) another asked for it. Everything
    /// leader-only must stop then.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// The replica that asked for the Lease, when that is how it was lost: it waits for
    /// [`Leadership::release`].
    pub fn asked_by(&self) -> Option<&str> {
        self.asked_by.get().map(String::as_str)
    }

    /// Stops renewing and gives the Lease up, after the caller has stopped acting: unless it
    /// was lost to another holder or to the renew deadline (then it is not this replica's to
    /// give).
    pub async fn release(self) {
        self.stop.cancel();
        if let Ok(mut elector) = self.renewing.await {
            if !self.lost.is_cancelled() || self.asked_by.get().is_some() {
                elector.release().await;
            }
        }
    }
}

/// How long the last look before stepping down waits between tries.
const LAST_LOOK_RETRY: Duration = Duration::from_millis(200);

/// One renewal attempt; `last` (past the renew deadline, the look that decides whether to step
/// down): tried again within its window while it fails or races, since a resumed process's
/// first request often meets a connection the API server closed while it was paused, which
/// says nothing about who holds the Lease.
async fn look(elector: &mut Elector, last: bool) -> Result<Attempt, kube::Error> {
    loop {
        match elector.attempt(false).await {
            Err(error) if last => {
                tracing::warn!(lease = %elector.lease_ref(), %error, "failed to renew the Lease past the renew deadline; trying again before stepping down");
            }
            Ok(Attempt::Raced) if last => {}
            decided => return decided,
        }
        tokio::time::sleep(LAST_LOOK_RETRY).await;
    }
}

/// How a renewal loop ends, and tells.
struct Ends {
    lost: CancellationToken,
    stop: CancellationToken,
    asked_by: std::sync::Arc<std::sync::OnceLock<String>>,
}

async fn renew(mut elector: Elector, mut renewed_at: Instant, ends: Ends) -> Elector {
    let Ends {
        lost,
        stop,
        asked_by,
    } = ends;
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
        let past_deadline = started - renewed_at >= renew_deadline;
        let left = renew_deadline
            .saturating_sub(started - renewed_at)
            .max(retry_period);
        match tokio::time::timeout(left, look(&mut elector, past_deadline)).await {
            Ok(Ok(Attempt::Holding)) => renewed_at = started,
            // A write between our read and ours (another replica's takeover shows at the next
            // read): not renewed, so the deadline keeps counting.
            Ok(Ok(Attempt::Raced)) => {}
            Ok(Ok(Attempt::Held { holder, .. })) => {
                tracing::error!(lease = %elector.lease_ref(), %holder, "another replica holds the Lease: this replica stops leading");
                lost.cancel();
                return elector;
            }
            Ok(Ok(Attempt::Asked { by })) => {
                tracing::info!(lease = %elector.lease_ref(), %by, "another replica asks for the Lease: handing it over");
                let _ = asked_by.set(by);
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
