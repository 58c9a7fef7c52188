//! The origin's one outbox: every producer sends through it, and it alone remembers what the
//! current session was sent.
//!
//! The producers (the reflectors, pod offloading, token reflection, namespace extension)
//! compute desired state; the outbox owns, per session, what went out for each origin object
//! (the provider object it became, the hash of the bytes sent, the origin revision and UID,
//! and what the provider answered) in a [`Ledger`]. A producer asks it to send an Upsert or a
//! Delete and it decides whether the session has it already; the provider's acks come back
//! here, and each producer is told the answers about its own objects ([`Recipient`]). A new
//! session (a higher generation) forgets everything in one place.
//!
//! Everything an outbox sends passes the link's pump ([`crate::resume`]) on the way out.

pub mod ledger;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use refract_core::hash::bytes_hash;
use refract_core::lock::Locked;
use refract_wire::proto::{
    local_message, Ack, Delete, LocalMessage, ObjectRef, Outcome, SnapshotComplete, Upsert,
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use ledger::{
    AckState, Admit, Answer, Ledger, Origin, Producer, RemoteKey, Request, Sent, Times,
};

use crate::key::Key;
use crate::link::SessionTx;

/// How often the unacknowledged gauges are refreshed.
const GAUGE_PERIOD: Duration = Duration::from_secs(2);

/// Told the provider's answers about one producer's objects.
pub trait Recipient: Send + Sync {
    /// One answer; never waits.
    fn on_answer(&self, answer: Answer);
}

/// The outbox of one link; clones share it.
#[derive(Clone, Default)]
pub struct Outbox {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    ledger: Mutex<Ledger>,
    recipients: Mutex<HashMap<Producer, Arc<dyn Recipient>>>,
    /// Requests whose answer someone awaits (twin namespaces), by provider object.
    waiters: Mutex<HashMap<RemoteKey, oneshot::Sender<Ack>>>,
    /// Where the times from a change queued, and from its Upsert sent, to the answer are
    /// observed, once set.
    answer_latency: std::sync::OnceLock<crate::metrics::AnswerLatency>,
}

impl Outbox {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.inner.ledger.locked()
    }

    /// Answers about `producer`'s objects go to `recipient`.
    pub fn register(&self, producer: Producer, recipient: Arc<dyn Recipient>) {
        self.inner.recipients.locked().insert(producer, recipient);
    }

    /// Sends `upsert` for `origin` unless `session` has had these bytes for it already;
    /// returns whether it went. `noticed` is when the change it carries was first queued at
    /// the origin, where its latency to the provider's answer starts.
    pub async fn upsert(
        &self,
        session: &SessionTx,
        origin: Origin,
        upsert: Upsert,
        noticed: Instant,
    ) -> bool {
        let producer = origin.producer;
        let hash = bytes_hash(&upsert.object_json);
        let admit = self.ledger().upsert(
            session.generation,
            origin,
            &upsert,
            hash,
            Times::sent_now(noticed),
        );
        if admit != Admit::Send {
            return false;
        }
        send(
            queue(session, producer),
            local_message::Kind::Upsert(upsert),
        )
        .await;
        true
    }

    /// Sends `upsert` for `origin` whatever was sent before, and returns where its answer
    /// arrives (instead of at the producer's recipient).
    pub async fn request(
        &self,
        session: &SessionTx,
        origin: Origin,
        mut upsert: Upsert,
    ) -> oneshot::Receiver<Ack> {
        // Answered at once, not held by the remote agent for company.
        upsert.awaited = true;
        let (answer_tx, answer_rx) = oneshot::channel();
        let remote = RemoteKey::of(&upsert.object.clone().unwrap_or_default());
        let hash = bytes_hash(&upsert.object_json);
        {
            let mut ledger = self.ledger();
            ledger.forget(&origin);
            let now = Instant::now();
            ledger.upsert(
                session.generation,
                origin,
                &upsert,
                hash,
                Times::sent_now(now),
            );
        }
        self.inner.waiters.locked().insert(remote, answer_tx);
        send(&session.tx, local_message::Kind::Upsert(upsert)).await;
        answer_rx
    }

    /// Sends a Delete of what `session` was sent for `origin`, if anything; returns whether
    /// one went. Its confirmation is answered to the producer.
    pub async fn delete(&self, session: &SessionTx, origin: &Origin, grace: Option<i64>) -> bool {
        let remote = self.ledger().delete(session.generation, origin);
        let Some(remote) = remote else { return false };
        self.send_delete(session, origin.producer, remote, grace)
            .await;
        true
    }

    /// Sends a Delete of `remote` for `origin` (UID `origin_uid`) whether or not this session
    /// sent it: the provider may hold it from an earlier one. Its confirmation is answered to
    /// the producer.
    pub async fn delete_remote(
        &self,
        session: &SessionTx,
        origin: Origin,
        remote: ObjectRef,
        origin_uid: String,
        grace: Option<i64>,
    ) {
        let producer = origin.producer;
        {
            let mut ledger = self.ledger();
            if !ledger.enter(session.generation) {
                return;
            }
            ledger.forget(&origin);
            ledger.deleting(origin, &remote, origin_uid);
        }
        self.send_delete(session, producer, remote, grace).await;
    }

    async fn send_delete(
        &self,
        session: &SessionTx,
        producer: Producer,
        remote: ObjectRef,
        grace: Option<i64>,
    ) {
        let delete = Delete {
            object: Some(remote),
            revision: String::new(),
            grace_period_seconds: grace,
        };
        send(
            queue(session, producer),
            local_message::Kind::Delete(delete),
        )
        .await;
    }

    /// Tells the provider that everything `producer` wants in provider namespace `namespace`
    /// has been sent on `session`.
    pub async fn snapshot_complete(
        &self,
        session: &SessionTx,
        producer: Producer,
        api_version: &str,
        namespace: &str,
    ) {
        let snapshot = SnapshotComplete {
            api_version: api_version.into(),
            kind: producer.remote_kind().into(),
            namespace: namespace.into(),
            resumed: false,
        };
        send(&session.tx, local_message::Kind::SnapshotComplete(snapshot)).await;
    }

    /// Forgets what was sent for `origin`: it is sent again on its next reconcile.
    pub fn forget(&self, origin: &Origin) {
        self.ledger().forget(origin);
    }

    /// Forgets everything `producer` sent for origin namespace `namespace`.
    pub fn forget_namespace(&self, producer: Producer, namespace: &str) {
        self.ledger().forget_namespace(producer, namespace);
    }

    /// The origin objects of `producer` the current session was sent.
    pub fn keys(&self, producer: Producer) -> Vec<Key> {
        self.ledger().keys(producer)
    }

    /// What the current session was sent for `origin`.
    pub fn sent(&self, origin: &Origin) -> Option<Sent> {
        self.ledger().get(origin).cloned()
    }

    /// The object of `producer` with origin UID `uid` the current session was sent, and what
    /// was sent for it.
    pub fn by_uid(&self, producer: Producer, uid: &str) -> Option<(Key, Sent)> {
        let ledger = self.ledger();
        let (origin, sent) = ledger.by_uid(producer, uid)?;
        Some((origin.key.clone(), sent.clone()))
    }

    /// The origin object (and its UID) of `producer` that provider object
    /// `remote_namespace/remote_name` stands for, when the current session was sent it.
    pub fn origin_of(
        &self,
        producer: Producer,
        remote_namespace: &str,
        remote_name: &str,
    ) -> Option<(Key, String)> {
        let remote = RemoteKey::new(producer.remote_kind(), remote_namespace, remote_name);
        let ledger = self.ledger();
        let (origin, sent) = ledger.by_remote(&remote)?;
        (origin.producer == producer).then(|| (origin.key.clone(), sent.origin_uid.clone()))
    }

    /// Observes the times from each change queued, and from its Upsert sent, to the
    /// provider's answer in `latency`.
    pub fn observe_answers(&self, latency: crate::metrics::AnswerLatency) {
        let _ = self.inner.answer_latency.set(latency);
    }

    /// Takes one ack from the provider: to whoever awaits it, else recorded and told to the
    /// producer of the object it answers.
    pub fn dispatch(&self, ack: Ack) {
        let answer = self.ledger().answer(&ack);
        if let Some(answer) = &answer {
            trace_answer(answer);
        }
        if let (Some(answer), Some(latency)) = (&answer, self.inner.answer_latency.get()) {
            if let Some(times) = answer.times {
                latency.observe(
                    answer.origin.producer.remote_kind(),
                    answer.outcome,
                    times.noticed,
                    times.sent,
                );
            }
        }
        let answers_a_request = !Outcome::try_from(ack.outcome).is_ok_and(Outcome::is_notice);
        if let Some(object) = ack.object.as_ref().filter(|_| answers_a_request) {
            let waiter = self.inner.waiters.locked().remove(&RemoteKey::of(object));
            if let Some(waiter) = waiter {
                let _ = waiter.send(ack);
                return;
            }
        }
        let Some(answer) = answer else { return };
        let recipient = self
            .inner
            .recipients
            .locked()
            .get(&answer.origin.producer)
            .cloned();
        if let Some(recipient) = recipient {
            recipient.on_answer(answer);
        }
    }

    /// How many Upserts of the current session wait for an answer, and the oldest's age.
    pub fn unacked(&self) -> (usize, Duration) {
        self.ledger().unacked(Instant::now())
    }

    /// Keeps the unacknowledged gauges current until `shutdown`.
    pub fn spawn_gauges(&self, metrics: crate::metrics::OutboxGauges, shutdown: CancellationToken) {
        let outbox = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(GAUGE_PERIOD);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let (count, oldest) = outbox.unacked();
                metrics
                    .unacked
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
                metrics.oldest_unacked_seconds.set(oldest.as_secs_f64());
            }
        });
    }
}

/// Resolves the provider objects of one producer to the origin objects they stand for, for
/// the event intake.
pub struct Resolver {
    outbox: Outbox,
    producer: Producer,
}

impl Outbox {
    /// A resolver of `producer`'s provider objects.
    pub fn resolver(&self, producer: Producer) -> Arc<Resolver> {
        Arc::new(Resolver {
            outbox: self.clone(),
            producer,
        })
    }
}

impl crate::events::Reflected for Resolver {
    fn origin_of(&self, remote_namespace: &str, remote_name: &str) -> Option<(Key, String)> {
        self.outbox
            .origin_of(self.producer, remote_namespace, remote_name)
    }
}

/// Where `producer`'s messages go on `session`: token Secrets straight to the stream (they are
/// in no SnapshotComplete), everything else through the comparison of a resumed session.
fn queue(session: &SessionTx, producer: Producer) -> &tokio::sync::mpsc::Sender<LocalMessage> {
    if producer == Producer::Tokens {
        &session.direct
    } else {
        &session.tx
    }
}

/// Puts one message on a session's queue. A closed session is replaced by a new one, which
/// re-sends everything.
async fn send(tx: &tokio::sync::mpsc::Sender<LocalMessage>, kind: local_message::Kind) {
    let _ = tx.send(LocalMessage { kind: Some(kind) }).await;
}

#[cfg(test)]
mod tests;

/// Ends a traced change's journey with its answer: a span `ack` in the change's trace, with the
/// outcome and how long the answer took from the change queued and from its Upsert sent.
fn trace_answer(answer: &Answer) {
    let (Some(journey), Some(times)) = (&answer.journey, answer.times) else {
        return;
    };
    use refract_shared::journey::millis_since;
    let span = tracing::trace_span!(
        target: refract_shared::journey::TARGET,
        parent: None,
        "ack",
        outcome = answer.outcome.as_str_name(),
        since_sent_ms = millis_since(times.sent),
        since_noticed_ms = millis_since(times.noticed),
    );
    refract_shared::journey::continue_from(&span, journey);
}
