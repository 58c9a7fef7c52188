//! `refract.v1.Reflection`: accepting a tenant's stream and running its session.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_wire::proto::reflection_server::Reflection;
use refract_wire::proto::{
    local_message, remote_message, Ack, InventoryRequest, LocalMessage, ObjectRef, Outcome,
    RemoteMessage, SnapshotComplete, UnpeerRequest, UnpeerResponse, Welcome,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

pub(crate) mod coalesce;
mod dispatch;
mod hello;
mod listing;
pub mod share;
#[cfg(test)]
mod tests;

use crate::apply::{answer, Applier, ObjectKey};
use crate::inventory::{Bucket, Inventory};
use crate::kinds::Allowed;
use crate::metrics::{label, Metrics, StreamRefusal, TenantCounters};
use crate::objects::Meta;
use crate::outbox::Outbox;
use crate::peer::Peer;
use crate::registry::in_flight::InFlight;
use crate::registry::{local_kind, Registry, Session, TapMessage};
use listing::Listing;

/// Names a stream may upsert before its snapshots stop counting: past it, the stream's orphan
/// collections are skipped (its view is too large to keep), never run on a partial view.
const MAX_SEEN: usize = 200_000;
/// How long a new stream may take to send Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Outbound messages buffered per stream before the session waits for the peer to read.
const OUTBOUND_BUFFER: usize = 256;
/// How long a resuming stream waits for the replaced stream's writes to land before it takes
/// stock of the tenant's objects; past it, the tenant is told to send everything.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long after the agent starts a resuming stream may wait for the watch of tenant objects
/// to list; later, a watch that has not listed (an API server out of reach) is not waited for.
/// With DRAIN_TIMEOUT, well within the 10 s a local agent gives Welcome.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);
/// The Reflection service.
#[derive(Clone)]
pub struct ReflectionService {
    /// This provider's cluster id, sent in Welcome.
    pub cluster_id: ClusterId,
    /// Tenant bookkeeping.
    pub registry: Registry,
    /// What each tenant is told besides answers (pod status, volumes, capacity).
    pub outbox: Outbox,
    /// Kubernetes writer.
    pub applier: Applier,
    /// Metrics.
    pub metrics: Metrics,
    /// Cancelled when the agent shuts down; open sessions end with UNAVAILABLE.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The provider's writes shared among the tenants writing at once (`--apply-concurrency`
    /// per tenant, `--apply-concurrency-total` among them; each object's own requests stay in
    /// order).
    pub write_share: share::WriteShare,
    /// When the agent started: only in its first [`LIST_TIMEOUT`] does a resuming stream wait
    /// for the watch of tenant objects to list.
    pub started: std::time::Instant,
    /// The provider's API, for Unpeer and the last-seen stamps.
    pub client: kube::Client,
    /// `--tenant-expiry`: when set, a tenant's namespaces are stamped when its stream ends.
    pub tenant_expiry: Option<Duration>,
    /// Which tenants this replica serves.
    pub tenancy: crate::tenancy::Tenancy,
    /// How long an ack of a settled write waits for company (`--ack-linger`).
    pub ack_linger: Duration,
}

#[tonic::async_trait]
impl Reflection for ReflectionService {
    type SyncStream = coalesce::Outbound;

    async fn sync(
        &self,
        request: Request<Streaming<LocalMessage>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        let peer = Peer::tenant_from_request(&request)?;
        let mut inbound = request.into_inner();
        let first = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Err(_) => {
                return Err(self.refuse(hello::Refusal {
                    reason: StreamRefusal::HelloTimeout,
                    status: Status::deadline_exceeded("no Hello within 10s"),
                }))
            }
            Ok(Err(status)) => return Err(status),
            Ok(Ok(None)) => return Err(Status::cancelled("stream closed before Hello")),
            Ok(Ok(Some(first))) => first,
        };
        let hello = hello::accept(&peer.cluster_id, first).map_err(|r| self.refuse(r))?;
        self.tenancy
            .claim(&peer.cluster_id)
            .await
            .map_err(|elsewhere| {
                self.refuse(hello::Refusal {
                    reason: StreamRefusal::ServedElsewhere,
                    status: Status::unavailable(elsewhere.to_string()),
                })
            })?;

        let session_id = format!("{:016x}", fastrand::u64(..));
        let advertised = if hello.resume {
            self.take_inventory(&peer.cluster_id).await
        } else {
            None
        };
        let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
        let welcome = RemoteMessage {
            kind: Some(remote_message::Kind::Welcome(Welcome {
                cluster_id: self.cluster_id.to_string(),
                agent_version: refract_core::AGENT_VERSION.to_string(),
                protocol_version: refract_wire::proto::PROTOCOL_VERSION,
                session_id: session_id.clone(),
                resume: advertised.is_some(),
                buckets: advertised
                    .as_ref()
                    .map(Inventory::digests)
                    .unwrap_or_default(),
            })),
        };
        // Welcome goes first, before anything provider-side watchers may send once the tenant
        // is registered as connected.
        let _ = tx.send(Ok(welcome.clone())).await;
        let guard = self.registry.connect(
            &peer.cluster_id,
            Session {
                agent_version: hello.agent_version.clone(),
                peer: peer.addr,
                session_id: session_id.clone(),
                cert_not_after: peer.not_after,
            },
            tx.clone(),
        );
        // The sender of pod status, volumes and capacity lives as long as the session's task.
        let session_done = tokio_util::sync::CancellationToken::new();
        self.outbox.spawn_sender(
            peer.cluster_id.clone(),
            session_id.clone(),
            tx.clone(),
            self.registry.clone(),
            session_done.clone(),
        );
        let session = std::sync::Arc::new(TenantSession {
            service: self.clone(),
            tenant: peer.cluster_id.clone(),
            tx,
            listing: std::sync::Mutex::new(Listing::new(MAX_SEEN)),
            replaced: guard.replaced.clone(),
            in_flight: self.registry.in_flight(&peer.cluster_id),
            advertised,
            inventories_sent: std::sync::Mutex::default(),
            counters: TenantCounters::new(&self.metrics, &peer.cluster_id),
        });
        self.registry
            .tap(&peer.cluster_id, TapMessage::FromRemote(&welcome));
        let span = tracing::info_span!("session", tenant = %peer.cluster_id, session = %session_id);
        span.in_scope(|| {
            tracing::info!(peer = ?peer.addr, version = %hello.agent_version, cert_not_after = %peer.not_after, "tenant connected")
        });
        let metrics = self.metrics.clone();
        let stamp = self
            .tenant_expiry
            .map(|_| (self.client.clone(), peer.cluster_id.clone()));
        tokio::spawn(
            async move {
                metrics.streams.inc();
                let _sender = session_done.drop_guard();
                let guard = guard;
                match session.run(&mut inbound).await {
                    Ok(()) => tracing::info!("tenant closed the stream"),
                    Err(status) => tracing::info!(code = ?status.code(), message = status.message(), "stream ended"),
                }
                drop(guard);
                metrics.streams.dec();
                if let Some((client, tenant)) = stamp {
                    crate::tenants::expiry::mark_last_seen(client, tenant).await;
                }
            }
            .instrument(span),
        );
        Ok(Response::new(coalesce::Outbound::new(rx, self.ack_linger)))
    }

    async fn unpeer(
        &self,
        request: Request<UnpeerRequest>,
    ) -> Result<Response<UnpeerResponse>, Status> {
        let peer = Peer::tenant_from_request(&request)?;
        // Its stream, if one is still open, applies nothing more.
        self.registry.end_current(&peer.cluster_id);
        self.applier.desired.forget_tenant(&peer.cluster_id);
        let identities = self.applier.identities();
        let removed = crate::tenants::remove(
            &self.client,
            &peer.cluster_id,
            identities.accounts_namespace(),
            "the origin unpeered",
            false,
        )
        .await
        .map_err(|e| Status::unavailable(format!("failed to remove the tenant: {e}")))?;
        identities.forget_tenant(&peer.cluster_id);
        Ok(Response::new(UnpeerResponse {
            removed_namespaces: removed,
        }))
    }
}

impl ReflectionService {
    /// Ends the tenant's previous stream, waits for its writes to land, and takes stock of the
    /// tenant's objects ([`Inventory`]); `None` when that cannot be done soundly, and the
    /// tenant then sends everything.
    async fn take_inventory(&self, tenant: &ClusterId) -> Option<Inventory> {
        self.registry.end_current(tenant);
        if !self.registry.in_flight(tenant).drained(DRAIN_TIMEOUT).await {
            tracing::info!(%tenant, "the previous stream's requests are still under way; the tenant sends everything");
            return None;
        }
        let wait = LIST_TIMEOUT.saturating_sub(self.started.elapsed());
        let Some(objects) = self.applier.objects().snapshot_of(tenant, wait).await else {
            tracing::info!(%tenant, "tenant objects not listed in time; the tenant sends everything");
            return None;
        };
        // A copy changed on the provider while the tenant was away is left out, so the tenant
        // sends it and it is restored (see `crate::restore`).
        let desired = &self.applier.desired;
        let restored = |kind: Allowed, meta: &Meta| {
            !desired.drifted(&ObjectKey {
                tenant: tenant.clone(),
                kind,
                namespace: meta.namespace().unwrap_or_default(),
                name: meta.name_any(),
            })
        };
        let inventory = Inventory::of_tenant(
            tenant,
            &self.cluster_id,
            objects
                .iter()
                .filter(|(kind, meta)| restored(*kind, meta))
                .map(|(kind, meta)| (*kind, meta)),
        );
        tracing::info!(%tenant, objects = inventory.objects(), "resuming: the tenant is told what the provider holds");
        Some(inventory)
    }

    fn refuse(&self, refusal: hello::Refusal) -> Status {
        let hello::Refusal { reason, status } = refusal;
        tracing::warn!(
            reason = reason.as_str(),
            message = status.message(),
            "refused stream"
        );
        self.metrics
            .streams_refused
            .get_or_create(&label("reason", reason.as_str()))
            .inc();
        status
    }
}

/// One open stream of one tenant.
struct TenantSession {
    service: ReflectionService,
    tenant: ClusterId,
    tx: mpsc::Sender<Result<RemoteMessage, Status>>,
    /// Names upserted on this stream: what a SnapshotComplete keeps.
    listing: std::sync::Mutex<Listing>,
    /// Cancelled when a newer stream of the tenant took over: this one's requests not yet
    /// started are dropped, and it ends.
    replaced: tokio_util::sync::CancellationToken,
    /// The tenant's requests under way, across its streams.
    in_flight: InFlight,
    /// What Welcome described, when the tenant resumes.
    advertised: Option<Inventory>,
    /// Buckets whose inventory was sent: each is sent once per stream.
    inventories_sent: std::sync::Mutex<BTreeSet<Bucket>>,
    /// The tenant's series of the per-message counters.
    counters: TenantCounters,
}

impl TenantSession {
    async fn send(&self, message: RemoteMessage) {
        self.service
            .registry
            .tap(&self.tenant, TapMessage::FromRemote(&message));
        // A closed receiver means the stream is gone; the read loop notices and ends.
        let _ = self.tx.send(Ok(message)).await;
    }

    /// Reads the tenant's messages and applies them concurrently, each object's in order
    /// ([`dispatch`]).
    async fn run(
        self: &std::sync::Arc<Self>,
        inbound: &mut Streaming<LocalMessage>,
    ) -> Result<(), Status> {
        let dispatcher = dispatch::Dispatcher::new(self.service.write_share.session());
        loop {
            let message = tokio::select! {
                _ = self.service.shutdown.cancelled() => {
                    let _ = self.tx.send(Err(Status::unavailable("remote agent is shutting down"))).await;
                    return Ok(());
                }
                _ = self.replaced.cancelled() => {
                    let status = Status::aborted("replaced by a newer stream of the same tenant");
                    let _ = self.tx.send(Err(status.clone())).await;
                    return Err(status);
                }
                message = inbound.message() => match message? {
                    Some(m) => m,
                    None => return Ok(()),
                },
            };
            self.service
                .registry
                .tap(&self.tenant, TapMessage::FromLocal(&message));
            self.counters.received(local_kind(&message));
            // What a SnapshotComplete keeps is what was received before it, applied or not.
            match &message.kind {
                Some(local_message::Kind::Upsert(u)) => {
                    if let Some(o) = &u.object {
                        tracing::debug!(target: "refract::trace", name = %o.name, "recv");
                    }
                    self.see(u.object.as_ref(), true)
                }
                Some(local_message::Kind::Delete(d)) => self.see(d.object.as_ref(), false),
                _ => {}
            }
            let key = dispatch::object_of(&message);
            let session = self.clone();
            match key {
                Some(key) => {
                    dispatcher
                        .dispatch(key, message, move |m| {
                            let session = session.clone();
                            async move { session.handle(m).await }
                        })
                        .await
                }
                // SnapshotComplete and the rest: off the reader, so a long orphan collection
                // does not hold the stream up.
                None => {
                    tokio::spawn(async move { session.handle(message).await }.in_current_span());
                }
            }
        }
    }

    async fn handle(&self, message: LocalMessage) {
        use local_message::Kind;
        // Writes are counted before the check, so a newer stream that replaced this one waits
        // for them. Not an orphan collection: once replaced, it deletes nothing more (and it
        // may be waiting out the deletion grace period).
        let _started = matches!(message.kind, Some(Kind::Upsert(_) | Kind::Delete(_)))
            .then(|| self.in_flight.start());
        if self.replaced.is_cancelled() {
            // The newer stream re-sends what it wants; nothing of this one starts any more.
            return;
        }
        match message.kind {
            Some(Kind::Upsert(upsert)) => {
                let object = upsert.object.clone().unwrap_or_default();
                let awaited = upsert.awaited;
                tracing::debug!(target: "refract::trace", name = %object.name, "start");
                // The change's journey on the provider, joined to the origin's trace when the
                // tenant sent one (see `refract_shared::journey`).
                let journey = tracing::trace_span!(
                    target: refract_shared::journey::TARGET,
                    parent: None,
                    "apply",
                    tenant = %self.tenant,
                    kind = %object.kind,
                    namespace = %object.namespace,
                    name = %object.name,
                    outcome = tracing::field::Empty,
                );
                refract_shared::journey::continue_from(&journey, &upsert.trace_parent);
                let result = self
                    .service
                    .applier
                    .apply(&self.tenant, &upsert)
                    .instrument(journey.clone())
                    .await;
                let (outcome, msg) = answer(&result);
                journey.record("outcome", outcome.as_str_name());
                tracing::debug!(target: "refract::trace", name = %object.name, "applied");
                self.service.registry.record(
                    &self.tenant,
                    &object,
                    &upsert.revision,
                    outcome,
                    &msg,
                );
                self.ack(object, upsert.revision, outcome, msg, awaited)
                    .await;
            }
            Some(Kind::Delete(delete)) => {
                let object = delete.object.clone().unwrap_or_default();
                let result = self.service.applier.delete(&self.tenant, &delete).await;
                let (outcome, msg) = answer(&result);
                if matches!(outcome, Outcome::Applied | Outcome::Unchanged) {
                    self.service.registry.forget(&self.tenant, &object);
                }
                self.ack(object, delete.revision, outcome, msg, false).await;
            }
            Some(Kind::SnapshotComplete(done)) => self.collect_orphans(done).await,
            Some(Kind::StatusAck(_)) => {}
            Some(Kind::InventoryRequest(request)) => self.send_inventory(request).await,
            Some(Kind::Hello(_)) => tracing::warn!("ignoring a second Hello on an open stream"),
            None => tracing::debug!("ignoring a message of a kind this version does not know"),
        }
    }

    /// Adds an Upsert's object to the stream's listing, or takes a Delete's out of it.
    fn see(&self, object: Option<&ObjectRef>, present: bool) {
        let Some(object) = object else { return };
        let Some(kind) = Allowed::lookup(&object.api_version, &object.kind) else {
            return;
        };
        let overflowed =
            self.listing
                .locked()
                .record(kind, &object.namespace, &object.name, present);
        if overflowed {
            tracing::warn!(limit = MAX_SEEN, "the tenant sent more objects than one stream keeps track of; its snapshots no longer collect orphans");
        }
    }

    /// Answers an InventoryRequest from what Welcome described, once per bucket.
    async fn send_inventory(&self, request: InventoryRequest) {
        let Some(kind) = Allowed::lookup(&request.api_version, &request.kind) else {
            tracing::debug!(kind = %request.kind, "InventoryRequest for a kind tenants may not write");
            return;
        };
        let Some(advertised) = &self.advertised else {
            tracing::debug!("InventoryRequest on a stream that did not resume");
            return;
        };
        let bucket = (kind, request.namespace);
        if !self.inventories_sent.locked().insert(bucket.clone()) {
            return;
        }
        for page in advertised.pages(&bucket) {
            self.send(RemoteMessage {
                kind: Some(remote_message::Kind::Inventory(page)),
            })
            .await;
        }
    }

    /// After the tenant listed everything of a kind in a namespace, removes what it no longer
    /// has. Never runs on a partial view: only this stream's own listing counts.
    async fn collect_orphans(&self, done: SnapshotComplete) {
        let Some(kind) = Allowed::lookup(&done.api_version, &done.kind) else {
            tracing::warn!(kind = %done.kind, "SnapshotComplete for a kind tenants may not write");
            return;
        };
        // What the tenant has sent so far, asked again for each object: Upserts keep arriving
        // while the collection runs.
        // A replaced stream deletes nothing more (its view is no longer the tenant's), nor one
        // whose view grew too large to keep.
        // A resumed listing did not send what the provider held already: what Welcome described
        // is kept too (the tenant deleted what it no longer wants).
        let bucket = (kind, done.namespace.clone());
        let described = |name: &str| {
            done.resumed
                && self
                    .advertised
                    .as_ref()
                    .is_some_and(|a| a.holds(&bucket, name))
        };
        let keep = |name: &str| {
            self.replaced.is_cancelled()
                || described(name)
                || self.listing.locked().holds(kind, &done.namespace, name)
        };
        match self
            .service
            .applier
            .delete_orphans(&self.tenant, kind, &done.namespace, keep)
            .await
        {
            Ok(deleted) if !deleted.is_empty() => {
                for name in &deleted {
                    self.service.registry.forget(
                        &self.tenant,
                        &ObjectRef {
                            api_version: done.api_version.clone(),
                            kind: done.kind.clone(),
                            namespace: done.namespace.clone(),
                            name: name.clone(),
                        },
                    );
                }
                tracing::info!(kind = %done.kind, namespace = %done.namespace, ?deleted, "deleted objects the tenant no longer has")
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(kind = %done.kind, namespace = %done.namespace, %error, "failed to collect orphans")
            }
        }
    }

    /// Answers a request; `awaited` (the origin waits on it) sends it without lingering.
    async fn ack(
        &self,
        object: ObjectRef,
        revision: String,
        outcome: Outcome,
        message: String,
        awaited: bool,
    ) {
        self.counters.ack(outcome);
        if !matches!(outcome, Outcome::Applied | Outcome::Unchanged) {
            tracing::info!(object = %object.display(), outcome = outcome.as_str_name(), %message, "request not applied");
        }
        self.send(RemoteMessage {
            kind: Some(remote_message::Kind::Ack(Ack {
                object: Some(object),
                revision,
                outcome: outcome as i32,
                message,
                awaited,
                restores: 0,
            })),
        })
        .await;
    }
}
