//! The pure part of the provider's outbox: per tenant, the latest state of everything the
//! provider streams back on its own (pod status, volumes, capacity, events, notices about an
//! object), and what the tenant's current session already has of it.
//!
//! No channels, no clock, no Kubernetes client: what to send, what a new session needs and
//! what a producer's change means are decided here and tested synchronously
//! ([`super::tests`]). The shell ([`super::Outbox`]) holds it under a lock and runs one sender
//! per session.

use std::collections::{BTreeSet, HashMap};

use refract_shared::tls::ClusterId;
use refract_wire::proto::RemoteMessage;

/// What a message is the state of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// The provider's free capacity for the tenant's virtual node (one per tenant). First, so
    /// a new session learns its node's size before the statuses of its pods.
    Capacity,
    /// The status of one offloaded pod.
    PodStatus,
    /// A volume the provider bound to one of the tenant's claims.
    Volume,
    /// The status of one copy of a custom kind.
    CustomStatus,
    /// An unsolicited answer about one of the tenant's objects: send it again, to restore a
    /// copy changed on the provider ([`crate::restore`]), or it is refused now, after a policy
    /// change ([`crate::policy_file`]). Sent once: delivered, it is forgotten, and a session's
    /// end forgets it too (the next session's inventory leaves a changed copy out, so the
    /// tenant sends it anyway).
    Notice,
    /// An event about one of the tenant's objects: its state is its count. Last, after the
    /// objects it is about. At most [`MAX_EVENTS`] are kept per tenant.
    Event,
}

/// Events kept per tenant: the provider's API server keeps events for an hour, and a tenant
/// whose pods fail in a loop must not grow the agent's memory past this. Events beyond it are
/// not recorded until others expire.
pub const MAX_EVENTS: usize = 10_000;

/// What recording a state did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The tenant's current session lacks it: its sender has something to do.
    Due,
    /// Recorded, nothing to send now (unchanged, or the tenant is not connected).
    Held,
    /// Not recorded: the tenant holds [`MAX_EVENTS`] events already.
    Refused {
        /// The first refusal since the tenant was last under the limit.
        first: bool,
    },
}

/// One thing a tenant is told the state of.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subject {
    /// What kind of state.
    pub topic: Topic,
    /// Which object: `namespace/name` of a provider pod, a volume's name, empty for capacity.
    pub name: String,
}

impl Subject {
    /// The tenant's capacity.
    pub fn capacity() -> Self {
        Self {
            topic: Topic::Capacity,
            name: String::new(),
        }
    }

    /// The status of the provider pod `namespace/name`.
    pub fn pod(namespace: &str, name: &str) -> Self {
        Self {
            topic: Topic::PodStatus,
            name: format!("{namespace}/{name}"),
        }
    }

    /// The volume `name`.
    pub fn volume(name: &str) -> Self {
        Self {
            topic: Topic::Volume,
            name: name.to_string(),
        }
    }

    /// The status of the copy of custom kind `resource` (`<plural>.<group>`) `namespace/name`.
    pub fn custom_status(resource: &str, namespace: &str, name: &str) -> Self {
        Self {
            topic: Topic::CustomStatus,
            name: format!("{resource}/{namespace}/{name}"),
        }
    }

    /// An unsolicited answer about object `kind` `namespace/name`.
    pub fn notice(kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            topic: Topic::Notice,
            name: format!("{kind}/{namespace}/{name}"),
        }
    }

    /// The provider event `namespace/name`.
    pub fn event(namespace: &str, name: &str) -> Self {
        Self {
            topic: Topic::Event,
            name: format!("{namespace}/{name}"),
        }
    }

    /// Whether this is an event of namespace `namespace`.
    fn is_event_of(&self, namespace: &str) -> bool {
        self.topic == Topic::Event
            && self
                .name
                .strip_prefix(namespace)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// A message a session lacks.
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    /// What it is the state of.
    pub subject: Subject,
    /// The state's hash, recorded as delivered once sent.
    pub hash: String,
    /// The message.
    pub message: RemoteMessage,
}

/// The latest state of one subject.
#[derive(Debug, Clone)]
struct Latest {
    hash: Box<str>,
    message: RemoteMessage,
    /// What the tenant's current session has of the subject.
    session_has: SessionHas,
}

/// What a session has of one subject. Kept with the subject's latest state rather than in a
/// map of its own: two maps of every subject cost a key and a slot each twice over.
#[derive(Debug, Clone, Default, PartialEq)]
enum SessionHas {
    /// Nothing yet.
    #[default]
    Nothing,
    /// The latest state.
    Latest,
    /// An earlier state, with this hash (the subject changed since it was sent).
    Earlier(Box<str>),
}

/// One tenant's record.
#[derive(Debug, Default)]
struct Tenant {
    /// The latest state of each subject, kept while the tenant is away so that its next
    /// session gets it without the producers being asked. Boxed: a map keeps a third to a half
    /// of its slots empty, and a message is some 200 bytes (two subjects a pod, a pod's status
    /// and its event).
    latest: HashMap<Subject, Box<Latest>>,
    /// The current session's id.
    session: Option<String>,
    /// Subjects the current session may lack, in the order they are sent.
    due: BTreeSet<Subject>,
    /// How many of `latest` are events.
    events: usize,
    /// Whether an event was refused since the tenant was last under [`MAX_EVENTS`].
    events_refused: bool,
}

impl Tenant {
    /// Forgets `subject` entirely.
    fn forget(&mut self, subject: &Subject) {
        if self.latest.remove(subject).is_some() && subject.topic == Topic::Event {
            self.events -= 1;
            self.events_refused = false;
        }
        self.due.remove(subject);
    }

    fn lacks(&self, subject: &Subject) -> bool {
        self.latest
            .get(subject)
            .is_some_and(|l| l.session_has != SessionHas::Latest)
    }

    /// A new session, or none: it has nothing yet.
    fn forget_delivered(&mut self) {
        for latest in self.latest.values_mut() {
            latest.session_has = SessionHas::Nothing;
        }
    }
}

/// Every tenant's record.
#[derive(Debug, Default)]
pub struct Ledger {
    tenants: HashMap<ClusterId, Tenant>,
}

impl Ledger {
    /// Records the latest state of `subject` for `tenant` (see [`Put`]).
    pub fn put(
        &mut self,
        tenant: &ClusterId,
        subject: Subject,
        hash: String,
        message: RemoteMessage,
    ) -> Put {
        let t = self.tenants.entry(tenant.clone()).or_default();
        match t.latest.get_mut(&subject) {
            Some(latest) if *latest.hash == *hash => return Put::Held,
            Some(latest) => {
                let session_has = match std::mem::take(&mut latest.session_has) {
                    SessionHas::Latest => SessionHas::Earlier(std::mem::take(&mut latest.hash)),
                    SessionHas::Earlier(had) if *had == *hash => SessionHas::Latest,
                    other => other,
                };
                **latest = Latest {
                    hash: hash.into_boxed_str(),
                    message,
                    session_has,
                };
            }
            None => {
                if subject.topic == Topic::Event {
                    if t.events >= MAX_EVENTS {
                        let first = !std::mem::replace(&mut t.events_refused, true);
                        return Put::Refused { first };
                    }
                    t.events += 1;
                }
                let latest = Latest {
                    hash: hash.into_boxed_str(),
                    message,
                    session_has: SessionHas::Nothing,
                };
                t.latest.insert(subject.clone(), Box::new(latest));
            }
        }
        if t.session.is_none() || !t.lacks(&subject) {
            return Put::Held;
        }
        t.due.insert(subject);
        Put::Due
    }

    /// Forgets `subject` wherever it is (its object is gone): nothing more is sent about it.
    pub fn remove(&mut self, subject: &Subject) {
        for t in self.tenants.values_mut() {
            t.forget(subject);
        }
    }

    /// Forgets every event of `tenant`'s namespace `namespace` (no longer watched).
    pub fn remove_events_of(&mut self, tenant: &ClusterId, namespace: &str) {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return;
        };
        let gone: Vec<Subject> = t
            .latest
            .keys()
            .filter(|s| s.is_event_of(namespace))
            .cloned()
            .collect();
        for subject in &gone {
            t.forget(subject);
        }
    }

    /// Starts session `session` of `tenant`, replacing any other: it has nothing yet, so every
    /// latest state is due. True when something is.
    pub fn open(&mut self, tenant: &ClusterId, session: &str) -> bool {
        let t = self.tenants.entry(tenant.clone()).or_default();
        t.session = Some(session.to_string());
        t.forget_delivered();
        t.due = t.latest.keys().cloned().collect();
        !t.due.is_empty()
    }

    /// Ends session `session` of `tenant`, unless a newer one replaced it already. Its
    /// capacity goes with it: capacity is computed for connected tenants only, so one kept
    /// would be stale by the time the tenant is back. So do its notices (see
    /// [`Topic::Notice`]).
    pub fn close(&mut self, tenant: &ClusterId, session: &str) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            if t.session.as_deref() == Some(session) {
                t.session = None;
                t.forget_delivered();
                t.due.clear();
                t.latest
                    .retain(|s, _| !matches!(s.topic, Topic::Capacity | Topic::Notice));
            }
        }
    }

    /// The next message session `session` of `tenant` lacks; `None` when it has everything
    /// (or is no longer the tenant's current session).
    pub fn next(&mut self, tenant: &ClusterId, session: &str) -> Option<Due> {
        let t = self.tenants.get_mut(tenant)?;
        if t.session.as_deref() != Some(session) {
            return None;
        }
        while let Some(subject) = t.due.pop_first() {
            if !t.lacks(&subject) {
                continue;
            }
            let latest = t.latest.get(&subject)?;
            return Some(Due {
                hash: latest.hash.to_string(),
                message: latest.message.clone(),
                subject,
            });
        }
        None
    }

    /// Session `session` of `tenant` was sent `subject` at `hash`.
    pub fn delivered(&mut self, tenant: &ClusterId, session: &str, subject: Subject, hash: String) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            if t.session.as_deref() != Some(session) {
                return;
            }
            let Some(latest) = t.latest.get_mut(&subject) else {
                return;
            };
            if subject.topic == Topic::Notice {
                // Said once; saying it again is a new notice.
                t.latest.remove(&subject);
            } else if *latest.hash == *hash {
                latest.session_has = SessionHas::Latest;
            } else {
                // The state changed while this one was on its way: the latest is due.
                latest.session_has = SessionHas::Earlier(hash.into_boxed_str());
            }
        }
    }

    /// How many subjects `tenant` has of `topic`.
    #[cfg(test)]
    pub fn count(&self, tenant: &ClusterId, topic: Topic) -> usize {
        self.tenants
            .get(tenant)
            .map_or(0, |t| t.latest.keys().filter(|s| s.topic == topic).count())
    }
}
