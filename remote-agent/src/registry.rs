//! What the remote agent knows about its tenants: connection state, the objects each has sent
//! and their last outcome, and a tap of each tenant's live messages. Read by Inspect.

pub(crate) mod in_flight;
mod kubelet_sessions;
mod redact;
mod tap;
pub mod tap_queue;

pub use kubelet_sessions::{KubeletSessionGuard, TooManySessions};
pub use tap::{local_kind, remote_kind, TapMessage};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{self, ObjectRef, ObjectStatus, Outcome, RemoteMessage};
use tokio_util::sync::CancellationToken;

use in_flight::InFlight;

/// Outcome records kept per tenant; requests about further objects are answered but not
/// recorded, so a tenant naming ever new objects cannot grow the agent's memory.
pub const MAX_RECORDS: usize = 100_000;

/// The tenants, shared between the Sync streams and Inspect.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<BTreeMap<ClusterId, TenantState>>>,
}

struct TenantState {
    connected: bool,
    agent_version: String,
    peer: Option<SocketAddr>,
    session_id: String,
    connected_since: String,
    disconnected_at: String,
    cert_not_after: String,
    connections: u64,
    objects: BTreeMap<(String, String, String), Record>,
    tap: tap_queue::TapReaders,
    outbound: Option<Outbound>,
    /// Cancelled when the current stream is replaced by a newer one of the same tenant.
    current: Option<CancellationToken>,
    /// Kubelet calls open now, by a number of their own.
    kubelet_sessions: BTreeMap<u64, proto::KubeletSession>,
    /// Requests being applied, across the tenant's streams.
    in_flight: InFlight,
}

/// The last request about one object (kind, namespace and name are its key), as Inspect
/// shows it. One is written for every request and read only when an operator asks, so it is
/// kept compact and its time is formatted when read.
struct Record {
    api_version: Box<str>,
    revision: Box<str>,
    outcome: Outcome,
    message: Box<str>,
    at: time::OffsetDateTime,
}

/// The sending half of a tenant's open stream.
pub type Outbound = tokio::sync::mpsc::Sender<Result<RemoteMessage, tonic::Status>>;

impl TenantState {
    fn new() -> Self {
        Self {
            connected: false,
            agent_version: String::new(),
            peer: None,
            session_id: String::new(),
            connected_since: String::new(),
            disconnected_at: String::new(),
            cert_not_after: String::new(),
            connections: 0,
            objects: BTreeMap::new(),
            tap: tap_queue::TapReaders::default(),
            outbound: None,
            current: None,
            kubelet_sessions: BTreeMap::new(),
            in_flight: InFlight::default(),
        }
    }
}

/// A connection's details, recorded when its Hello is accepted.
pub struct Session {
    /// The local agent's version.
    pub agent_version: String,
    /// Where the connection comes from.
    pub peer: Option<SocketAddr>,
    /// The stream's id.
    pub session_id: String,
    /// The client certificate's expiry.
    pub cert_not_after: time::OffsetDateTime,
}

/// Marks the tenant disconnected when the stream's task ends, however it ends.
pub struct ConnectedGuard {
    registry: Registry,
    tenant: ClusterId,
    session_id: String,
    /// Cancelled when a newer stream of the same tenant replaces this one.
    pub replaced: CancellationToken,
}

impl Drop for ConnectedGuard {
    fn drop(&mut self) {
        let mut tenants = self.registry.inner.locked();
        if let Some(t) = tenants.get_mut(&self.tenant) {
            // A newer stream of the same tenant may have replaced this one already.
            if t.session_id == self.session_id {
                t.connected = false;
                t.disconnected_at = now();
                t.outbound = None;
                t.current = None;
            }
        }
    }
}

fn now() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// `at` in RFC 3339, as Inspect shows times.
pub fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn object_key(o: &ObjectRef) -> (String, String, String) {
    (o.kind.clone(), o.namespace.clone(), o.name.clone())
}

impl Registry {
    /// The tenant's count of requests being applied, shared by all its streams.
    pub fn in_flight(&self, tenant: &ClusterId) -> InFlight {
        let mut tenants = self.inner.locked();
        let t = tenants
            .entry(tenant.clone())
            .or_insert_with(TenantState::new);
        t.in_flight.clone()
    }

    /// Ends the tenant's current stream, if any, before a new one takes over: its requests not
    /// yet started are dropped.
    pub fn end_current(&self, tenant: &ClusterId) {
        if let Some(current) = self
            .inner
            .locked()
            .get(tenant)
            .and_then(|t| t.current.as_ref())
        {
            current.cancel();
        }
    }

    /// Records a new stream of `tenant` sending on `outbound`; the returned guard marks it
    /// closed when dropped. A tenant has one current stream: an older one still open is told
    /// it was replaced (its guard's `replaced` is cancelled) in the same step, so no write of
    /// the old stream starts after the new stream is accepted.
    pub fn connect(
        &self,
        tenant: &ClusterId,
        session: Session,
        outbound: Outbound,
    ) -> ConnectedGuard {
        let mut tenants = self.inner.locked();
        let t = tenants
            .entry(tenant.clone())
            .or_insert_with(TenantState::new);
        t.connected = true;
        t.agent_version = session.agent_version;
        t.peer = session.peer;
        t.session_id = session.session_id.clone();
        t.connected_since = now();
        t.disconnected_at.clear();
        t.cert_not_after = session
            .cert_not_after
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        t.connections += 1;
        t.outbound = Some(outbound);
        let replaced = CancellationToken::new();
        if let Some(previous) = t.current.replace(replaced.clone()) {
            previous.cancel();
        }
        ConnectedGuard {
            registry: self.clone(),
            tenant: tenant.clone(),
            session_id: session.session_id,
            replaced,
        }
    }

    /// Records the outcome of a request about one object.
    pub fn record(
        &self,
        tenant: &ClusterId,
        object: &ObjectRef,
        revision: &str,
        outcome: Outcome,
        message: &str,
    ) {
        let mut tenants = self.inner.locked();
        // The tenant is there while its stream is: its id is cloned only the first time.
        let t = match tenants.get_mut(tenant) {
            Some(t) => t,
            None => tenants
                .entry(tenant.clone())
                .or_insert_with(TenantState::new),
        };
        let key = object_key(object);
        if t.objects.len() >= MAX_RECORDS && !t.objects.contains_key(&key) {
            return;
        }
        t.objects.insert(
            key,
            Record {
                api_version: object.api_version.as_str().into(),
                revision: revision.into(),
                outcome,
                message: message.into(),
                at: time::OffsetDateTime::now_utc(),
            },
        );
    }

    /// Queues a message on `tenant`'s open stream; false when the tenant is not connected or
    /// its stream's buffer is full. Never waits: the event stream and the restorer serve every
    /// tenant from one loop, so a tenant that stops reading must not hold up the others. Each
    /// decides what a message not queued costs: an event is missed (a later count of it is
    /// sent), a restore asks again. State (pod status, volumes, capacity) goes through the
    /// provider's outbox instead, which waits for room on the tenant's own stream.
    pub fn send_to(&self, tenant: &ClusterId, message: RemoteMessage) -> bool {
        let outbound = self
            .inner
            .locked()
            .get(tenant)
            .and_then(|t| t.outbound.clone());
        let Some(outbound) = outbound else {
            return false;
        };
        let reserved = outbound.try_reserve();
        match reserved {
            Ok(slot) => {
                self.tap(tenant, TapMessage::FromRemote(&message));
                slot.send(Ok(message));
                true
            }
            Err(tokio::sync::mpsc::error::TrySendError::Full(())) => {
                tracing::debug!(%tenant, kind = remote_kind(&message), "tenant's stream is full; sending later");
                false
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(())) => false,
        }
    }

    /// The session id of `tenant`'s open stream.
    pub fn session_of(&self, tenant: &ClusterId) -> Option<String> {
        self.inner
            .locked()
            .get(tenant)
            .filter(|t| t.connected)
            .map(|t| t.session_id.clone())
    }

    /// Every connected tenant.
    pub fn connected(&self) -> Vec<ClusterId> {
        self.inner
            .locked()
            .iter()
            .filter(|(_, t)| t.connected)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Forgets an object the tenant deleted.
    pub fn forget(&self, tenant: &ClusterId, object: &ObjectRef) {
        if let Some(t) = self.inner.locked().get_mut(tenant) {
            t.objects.remove(&object_key(object));
        }
    }

    /// Every tenant that has connected, or only `only` when given.
    pub fn tenants(&self, only: Option<&ClusterId>) -> Vec<proto::Tenant> {
        self.inner
            .locked()
            .iter()
            .filter(|(id, t)| only.is_none_or(|o| o == *id) && t.connections > 0)
            .map(|(id, t)| proto::Tenant {
                cluster_id: id.to_string(),
                connected: t.connected,
                agent_version: t.agent_version.clone(),
                peer_address: t.peer.map(|p| p.to_string()).unwrap_or_default(),
                session_id: t.session_id.clone(),
                connected_since: t.connected_since.clone(),
                disconnected_at: t.disconnected_at.clone(),
                certificate_not_after: t.cert_not_after.clone(),
                connections: t.connections,
                objects: t.objects.len() as u64,
                kubelet_sessions: t.kubelet_sessions.values().cloned().collect(),
                // Filled by Inspect, which reads the quotas.
                quota: Vec::new(),
            })
            .collect()
    }

    /// A tenant's objects, filtered by kind and namespace when those are non-empty.
    pub fn objects(&self, tenant: &ClusterId, kind: &str, namespace: &str) -> Vec<ObjectStatus> {
        let tenants = self.inner.locked();
        let Some(t) = tenants.get(tenant) else {
            return Vec::new();
        };
        t.objects
            .iter()
            .filter(|((k, ns, _), _)| {
                (kind.is_empty() || k == kind) && (namespace.is_empty() || ns == namespace)
            })
            .map(|((kind, namespace, name), r)| ObjectStatus {
                object: Some(ObjectRef {
                    api_version: r.api_version.to_string(),
                    kind: kind.clone(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                }),
                revision: r.revision.to_string(),
                outcome: r.outcome as i32,
                message: r.message.to_string(),
                updated_at: rfc3339(r.at),
                // Filled in by Inspect from the restorer's ledger.
                restores: 0,
                quarantined_since: String::new(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn inspect_sees_each_objects_last_outcome_filtered_by_kind_and_namespace() {
        let registry = Registry::default();
        let tenant = ClusterId::parse("origin").unwrap();
        let a = object("ConfigMap", "apps", "a");
        registry.record(
            &tenant,
            &a,
            "1",
            Outcome::Transient,
            "the API server is busy",
        );
        registry.record(&tenant, &a, "2", Outcome::Applied, "");
        registry.record(
            &tenant,
            &object("Secret", "apps", "s"),
            "3",
            Outcome::Denied,
            "no",
        );
        registry.record(
            &tenant,
            &object("ConfigMap", "web", "w"),
            "4",
            Outcome::Applied,
            "",
        );

        let all = registry.objects(&tenant, "", "");
        assert_eq!(all.len(), 3, "one record an object: the last");
        let configmaps = registry.objects(&tenant, "ConfigMap", "apps");
        assert_eq!(configmaps.len(), 1);
        let last = &configmaps[0];
        assert_eq!(last.object.as_ref(), Some(&a));
        assert_eq!(
            (last.revision.as_str(), last.outcome),
            ("2", Outcome::Applied as i32)
        );
        assert!(last.message.is_empty());
        let at = time::OffsetDateTime::parse(
            &last.updated_at,
            &time::format_description::well_known::Rfc3339,
        );
        assert!(at.is_ok(), "RFC 3339: {:?}", last.updated_at);
        assert_eq!(registry.objects(&tenant, "Secret", "")[0].message, "no");
        let other = ClusterId::parse("other").unwrap();
        assert!(registry.objects(&other, "", "").is_empty());
    }
}
