//! The pure part of the outbox: the record of what the current session was sent.
//!
//! No channels, no clock of its own (callers pass `now`), no Kubernetes client: every decision
//! about whether to send, what an ack answers and what a new session forgets is made here and
//! tested synchronously ([`super::tests`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[cfg(doc)]
use refract_core::hash::bytes_hash;
use refract_core::options::Kind;
use refract_wire::proto::{Ack, ObjectRef, Outcome, Upsert};

use crate::key::Key;

/// Who produces an origin object's desired state on the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Producer {
    /// A reflector of one kind (ConfigMaps, Services, ...).
    Objects(Kind),
    /// Pod offloading: origin pods as ShadowPods.
    Pods,
    /// ServiceAccount token reflection: an offloaded pod's tokens as a Secret.
    Tokens,
    /// Namespace extension: origin namespaces as twin namespaces.
    Namespaces,
}

impl Producer {
    /// The kind of the provider objects this producer sends.
    pub fn remote_kind(self) -> &'static str {
        match self {
            Producer::Objects(kind) => kind.kind(),
            Producer::Pods => "ShadowPod",
            Producer::Tokens => "Secret",
            Producer::Namespaces => "Namespace",
        }
    }
}

/// One origin object, as its producer knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// Who sends it.
    pub producer: Producer,
    /// Its namespace and name at the origin (for tokens, the pod's; for namespaces, the
    /// namespace's name in `name` and an empty `namespace`).
    pub key: Key,
}

impl Origin {
    /// `key` of `producer`.
    pub fn new(producer: Producer, key: Key) -> Self {
        Self { producer, key }
    }
}

/// What the provider has said about the latest Upsert of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckState {
    /// Sent, no answer yet.
    Pending,
    /// Written, or found already as sent.
    Applied,
    /// Refused for good (conflict, invalid, denied): not sent again until it changes.
    Refused,
}

/// What the current session was sent for one origin object.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The provider object it became.
    pub remote: ObjectRef,
    /// The hash of the JSON bytes sent (the provider's `refract.io/origin-hash`).
    pub hash: String,
    /// The origin resourceVersion it was sent at.
    pub revision: String,
    /// The origin object's UID.
    pub origin_uid: String,
    /// What the provider answered.
    pub state: AckState,
    /// When the change was queued, and when it was sent.
    pub times: Times,
    /// The change's journey (W3C traceparent) while its answer is awaited, when traced.
    pub journey: Option<Box<str>>,
}

/// When a change was first queued at the origin, and when the Upsert carrying it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    /// Queued (at most `sent`).
    pub noticed: Instant,
    /// Sent.
    pub sent: Instant,
}

impl Times {
    /// A change `noticed` then, sent now.
    pub fn sent_now(noticed: Instant) -> Self {
        let sent = Instant::now();
        Self {
            noticed: noticed.min(sent),
            sent,
        }
    }
}

/// A provider object, the way acks and events name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RemoteKey {
    kind: String,
    namespace: String,
    name: String,
}

impl RemoteKey {
    /// The key of `object`.
    pub fn of(object: &ObjectRef) -> Self {
        Self::new(&object.kind, &object.namespace, &object.name)
    }

    /// The key of a `kind` object `namespace/name`.
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// Whether an Upsert goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send it: the session has not had these bytes for this object.
    Send,
    /// The session sent exactly these bytes already.
    AlreadySent,
    /// It was produced for a session that has been replaced; the new one gets it on resync.
    Stale,
}

/// Which request an ack answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// An Upsert.
    Upsert,
    /// A Delete.
    Delete,
}

/// The provider's answer about one origin object, for its producer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The object.
    pub origin: Origin,
    /// Its UID at the origin, as sent.
    pub origin_uid: String,
    /// What was answered.
    pub request: Request,
    /// The outcome.
    pub outcome: Outcome,
    /// The provider's explanation.
    pub message: String,
    /// When the change the answered Upsert carries was queued and sent (none for a Delete).
    pub times: Option<Times>,
    /// How many times the provider restored the copy in its current fight, on a notice it
    /// wants reported (see `Ack.restores`).
    pub restores: u32,
    /// The journey of the change answered, when traced (once: the first answer takes it).
    pub journey: Option<Box<str>>,
}

/// A Delete sent and not yet confirmed.
#[derive(Debug, Clone)]
struct Deleting {
    origin: Origin,
    origin_uid: String,
}

/// What the current session was sent, by origin object, with the indexes answers need.
#[derive(Debug, Default)]
pub struct Ledger {
    generation: u64,
    sent: HashMap<Origin, Sent>,
    by_remote: HashMap<RemoteKey, Origin>,
    /// By producer and origin UID: a pod and its token Secret share the pod's UID.
    by_uid: HashMap<(Producer, String), Origin>,
    deleting: HashMap<RemoteKey, Deleting>,
}

impl Ledger {
    /// Moves to session `generation`, forgetting everything of an older one. Returns false
    /// when `generation` is older than the current one: the caller's session is gone.
    pub fn enter(&mut self, generation: u64) -> bool {
        if generation < self.generation {
            return false;
        }
        if generation > self.generation {
            *self = Ledger {
                generation,
                ..Default::default()
            };
        }
        true
    }

    /// Records an Upsert of `origin` on session `generation` unless that session sent the
    /// same bytes for it already; `hash` is [`bytes_hash`] of its JSON, computed by the caller
    /// before taking the ledger's lock.
    pub fn upsert(
        &mut self,
        generation: u64,
        origin: Origin,
        upsert: &Upsert,
        hash: String,
        times: Times,
    ) -> Admit {
        if !self.enter(generation) {
            return Admit::Stale;
        }
        if self.sent.get(&origin).is_some_and(|s| s.hash == hash) {
            return Admit::AlreadySent;
        }
        let remote = upsert.object.clone().unwrap_or_default();
        let sent = Sent {
            remote,
            hash,
            revision: upsert.revision.clone(),
            origin_uid: upsert.origin_uid.clone(),
            state: AckState::Pending,
            times,
            journey: (!upsert.trace_parent.is_empty()).then(|| upsert.trace_parent.as_str().into()),
        };
        self.by_remote
            .insert(RemoteKey::of(&sent.remote), origin.clone());
        if !sent.origin_uid.is_empty() {
            self.by_uid
                .insert((origin.producer, sent.origin_uid.clone()), origin.clone());
        }
        if let Some(old) = self.sent.insert(origin.clone(), sent) {
            self.drop_indexes(&origin, &old);
        }
        Admit::Send
    }

    /// Forgets what session `generation` sent for `origin` and returns the provider object
    /// to delete, marked as awaiting its confirmation; `None` when nothing was sent for it.
    pub fn delete(&mut self, generation: u64, origin: &Origin) -> Option<ObjectRef> {
        if !self.enter(generation) {
            return None;
        }
        let sent = self.forget(origin)?;
        self.deleting(origin.clone(), &sent.remote, sent.origin_uid);
        Some(sent.remote)
    }

    /// Marks `remote` as being deleted for `origin` (UID `origin_uid`), whether or not this
    /// session sent it: its confirmation is answered to the producer.
    pub fn deleting(&mut self, origin: Origin, remote: &ObjectRef, origin_uid: String) {
        self.deleting
            .insert(RemoteKey::of(remote), Deleting { origin, origin_uid });
    }

    /// Forgets what was sent for `origin` (to be sent again, or no longer the session's
    /// concern); returns it.
    pub fn forget(&mut self, origin: &Origin) -> Option<Sent> {
        let sent = self.sent.remove(origin)?;
        self.drop_indexes(origin, &sent);
        Some(sent)
    }

    /// Forgets everything `producer` sent for origin namespace `namespace` (its twin went
    /// with everything in it).
    pub fn forget_namespace(&mut self, producer: Producer, namespace: &str) {
        let gone: Vec<Origin> = self
            .sent
            .keys()
            .filter(|o| o.producer == producer && o.key.namespace == namespace)
            .cloned()
            .collect();
        for origin in gone {
            self.forget(&origin);
        }
    }

    /// Drops the index entries of `gone` (just replaced or removed) unless they now belong to
    /// another object or to what replaced it.
    fn drop_indexes(&mut self, origin: &Origin, gone: &Sent) {
        let remote = RemoteKey::of(&gone.remote);
        let current = self.sent.get(origin);
        if self.by_remote.get(&remote) == Some(origin)
            && current.is_none_or(|s| RemoteKey::of(&s.remote) != remote)
        {
            self.by_remote.remove(&remote);
        }
        let uid = (origin.producer, gone.origin_uid.clone());
        if self.by_uid.get(&uid) == Some(origin)
            && current.is_none_or(|s| s.origin_uid != gone.origin_uid)
        {
            self.by_uid.remove(&uid);
        }
    }

    /// The origin objects of `producer` the session was sent.
    pub fn keys(&self, producer: Producer) -> Vec<Key> {
        self.sent
            .keys()
            .filter(|o| o.producer == producer)
            .map(|o| o.key.clone())
            .collect()
    }

    /// What the session sent for `origin`.
    pub fn get(&self, origin: &Origin) -> Option<&Sent> {
        self.sent.get(origin)
    }

    /// The object of `producer` with origin UID `uid` the session sent, and what it sent.
    pub fn by_uid(&self, producer: Producer, uid: &str) -> Option<(&Origin, &Sent)> {
        let origin = self.by_uid.get(&(producer, uid.to_string()))?;
        Some((origin, self.sent.get(origin)?))
    }

    /// The origin object that provider object `remote` stands for, and what was sent.
    pub fn by_remote(&self, remote: &RemoteKey) -> Option<(&Origin, &Sent)> {
        let origin = self.by_remote.get(remote)?;
        Some((origin, self.sent.get(origin)?))
    }

    /// Takes the provider's ack: records what it says and returns whom it concerns. An ack
    /// of an older revision than the latest sent changes nothing; a transient failure forgets
    /// the object so that it is sent again.
    pub fn answer(&mut self, ack: &Ack) -> Option<Answer> {
        let object = ack.object.as_ref()?;
        let remote = RemoteKey::of(object);
        let outcome = Outcome::try_from(ack.outcome).unwrap_or(Outcome::Unspecified);
        let confirmed = matches!(outcome, Outcome::Applied | Outcome::Unchanged);
        // Not an answer: the provider asks for an object it was sent, whose copy was changed
        // or deleted there, or says it restored or quarantined it. Of one being deleted,
        // nothing is sent again or said.
        let notice = outcome.is_notice();
        if notice && self.deleting.contains_key(&remote) {
            return None;
        }
        if let Some(deleting) = self.deleting.get(&remote).cloned() {
            if confirmed {
                self.deleting.remove(&remote);
            }
            return Some(Answer {
                origin: deleting.origin,
                origin_uid: deleting.origin_uid,
                request: Request::Delete,
                outcome,
                message: ack.message.clone(),
                times: None,
                restores: ack.restores,
                journey: None,
            });
        }
        let origin = self.by_remote.get(&remote)?.clone();
        let sent = self.sent.get_mut(&origin)?;
        if !ack.revision.is_empty() && !sent.revision.is_empty() && ack.revision != sent.revision {
            return None; // a newer Upsert is on its way; its ack decides
        }
        let origin_uid = sent.origin_uid.clone();
        let times = (!notice).then_some(sent.times);
        let journey = if notice { None } else { sent.journey.take() };
        match outcome {
            Outcome::Applied | Outcome::Unchanged | Outcome::Unspecified => {
                sent.state = AckState::Applied
            }
            Outcome::Conflict | Outcome::Invalid | Outcome::Denied => {
                sent.state = AckState::Refused
            }
            Outcome::Transient | Outcome::Resend | Outcome::QuotaExceeded => {
                self.forget(&origin);
            }
            // Said of the copy as it stands: what was sent and answered stays as it is.
            Outcome::Drifted | Outcome::Quarantined => {}
        }
        Some(Answer {
            origin,
            origin_uid,
            request: Request::Upsert,
            outcome,
            message: ack.message.clone(),
            times,
            restores: ack.restores,
            journey,
        })
    }

    /// How many Upserts wait for an answer, and how long the oldest has waited.
    pub fn unacked(&self, now: Instant) -> (usize, Duration) {
        self.sent
            .values()
            .filter(|s| s.state == AckState::Pending)
            .fold((0, Duration::ZERO), |(n, oldest), s| {
                (
                    n + 1,
                    oldest.max(now.saturating_duration_since(s.times.sent)),
                )
            })
    }
}
