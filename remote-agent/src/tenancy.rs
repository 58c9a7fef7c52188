//! Which replica serves which tenant, and which one runs the work that spans tenants.
//!
//! Every replica accepts any tenant's connection. One replica at a time serves a tenant: the
//! holder of Lease `refract-tenant-<id>` in the agent's namespace. A stream that reaches a
//! replica not holding it claims it: the holder is asked to hand it over and does so at its
//! next renewal, ending its stream of the tenant and dropping the tenant's desired state, so
//! that it never restores the tenant's objects from an older view than the new holder's. A
//! holder that is gone lets the Lease lapse after the lease duration, unless its pod's
//! container is restarted first: the new process releases the Leases naming its pod
//! ([`Tenancy::release_predecessors`]). A replica keeps a
//! tenant's Lease after the stream ends, and keeps restoring the tenant's objects while the
//! origin is away, until another replica claims it or this one stops (then it releases it).
//!
//! The work that spans tenants (the ShadowPod controller, the expiry collector, the fences of
//! every twin namespace) runs on one replica, the holder of Lease `refract-remote-agent`
//! ([`spawn_controller_election`]): it reads and writes the API only, so any replica may do
//! it, and one doing it keeps two from creating the same pod or racing on the same fence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use refract_core::lock::Locked;
use refract_shared::leader::{released, Candidacy, Elector, Leadership};
use refract_shared::tls::ClusterId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::apply::desired::DesiredStore;
use crate::registry::Registry;

/// The Lease of the work that spans tenants.
pub const CONTROLLER_LEASE: &str = "refract-remote-agent";
/// Tenant Leases are named this and the tenant's cluster id.
pub const TENANT_LEASE_PREFIX: &str = "refract-tenant-";
/// How long a stream waits to be served here before it is refused: a local agent waits 10 s
/// for Welcome, and a resuming stream may spend 3 s more draining the previous one's writes.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a claim looks at the Lease again.
const CLAIM_POLL: Duration = Duration::from_millis(250);
/// How long a starting replica spends releasing the Leases its pod's previous container held.
const PREDECESSOR_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica handing a tenant over waits for the tenant's writes under way here.
const HANDOVER_DRAIN: Duration = Duration::from_secs(3);

/// The tenants this replica serves.
#[derive(Clone)]
pub struct Tenancy {
    /// `None` with `--leader-elect=false`: exactly one replica runs and serves every tenant.
    inner: Option<Arc<Inner>>,
}

struct Inner {
    client: kube::Client,
    candidacy: Candidacy,
    registry: Registry,
    desired: DesiredStore,
    shutdown: CancellationToken,
    /// One slot a tenant ever claimed here; its lock orders a claim after a handover under way.
    slots: Mutex<BTreeMap<ClusterId, Arc<tokio::sync::Mutex<Slot>>>>,
    /// The tenants served here until their Lease is released (changed only under the
    /// tenant's slot lock).
    served: Mutex<BTreeSet<ClusterId>>,
}

/// One tenant on this replica.
#[derive(Default)]
struct Slot {
    /// While this replica does not serve the tenant: the elector of its last claim, which keeps what it saw of the
    /// Lease, so that a holder gone silent lapses over several claims (each is shorter than
    /// the lease duration).
    elector: Option<Elector>,
}

/// Why a stream is not served here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotServedHere {
    /// Who holds the tenant's Lease, or why it could not be taken.
    pub reason: String,
}

impl std::fmt::Display for NotServedHere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this remote agent replica could not take the tenant's Lease within {CLAIM_TIMEOUT:?} ({}); connect again",
            self.reason
        )
    }
}

impl Tenancy {
    /// Every tenant served here, with no Lease: `--leader-elect=false`.
    pub fn alone() -> Self {
        Self { inner: None }
    }

    /// Tenants served by Lease, as `candidacy`'s replica (its `lease` is replaced per tenant).
    pub fn elected(
        client: kube::Client,
        candidacy: Candidacy,
        registry: Registry,
        desired: DesiredStore,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            inner: Some(Arc::new(Inner {
                client,
                candidacy: candidacy.yielding(),
                registry,
                desired,
                shutdown,
                slots: Mutex::default(),
                served: Mutex::default(),
            })),
        }
    }

    /// Makes this replica the one serving `tenant`, asking the replica that serves it now to
    /// hand it over; refused when that takes longer than [`CLAIM_TIMEOUT`].
    pub async fn claim(&self, tenant: &ClusterId) -> Result<(), NotServedHere> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let slot = Arc::clone(inner.slots.locked().entry(tenant.clone()).or_default());
        let mut slot_now = slot.lock().await;
        if inner.served.locked().contains(tenant) {
            return Ok(());
        }
        let elector = slot_now.elector.take().unwrap_or_else(|| {
            Elector::new(
                inner.client.clone(),
                inner.candidacy.for_lease(tenant_lease(tenant)),
            )
        });
        match elector.claim(CLAIM_TIMEOUT, CLAIM_POLL).await {
            Ok(leadership) => {
                inner.served.locked().insert(tenant.clone());
                tracing::info!(%tenant, "this replica serves the tenant now");
                tokio::spawn(Arc::clone(inner).hold(tenant.clone(), leadership, Arc::clone(&slot)));
                Ok(())
            }
            Err(still) => {
                slot_now.elector = Some(still.elector);
                Err(NotServedHere { reason: still.by })
            }
        }
    }

    /// Whether this replica serves `tenant` (always, without election).
    pub fn serves_here(&self, tenant: &ClusterId) -> bool {
        match &self.inner {
            None => true,
            Some(inner) => inner.served.locked().contains(tenant),
        }
    }

    /// Waits, at most `within`, until every tenant served here was handed back after the
    /// agent's shutdown token was cancelled.
    pub async fn released(&self, within: Duration) {
        let Some(inner) = &self.inner else {
            return;
        };
        let deadline = tokio::time::Instant::now() + within;
        while !inner.served.locked().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Releases every tenant Lease that names this replica as it starts: the identity is the
    /// pod's name, so such a Lease was held by this pod's previous container, killed without
    /// releasing it (a SIGKILL, an OOM kill). Left alone, it would keep the tenant from any
    /// other replica until it lapsed, and this process keeps nothing of what that one served.
    /// Each release is a compare-and-swap on the Lease read, so a replica that took the Lease
    /// meanwhile keeps it. A failure is logged: that Lease lapses as it would have. Bounded by
    /// [`PREDECESSOR_RELEASE_TIMEOUT`], so that an API server that hangs does not hold the
    /// agent's start.
    pub async fn release_predecessors(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        if tokio::time::timeout(PREDECESSOR_RELEASE_TIMEOUT, release_predecessors(inner))
            .await
            .is_err()
        {
            tracing::warn!(timeout = ?PREDECESSOR_RELEASE_TIMEOUT, "releasing the tenant Leases a previous container of this pod held took too long; the rest lapse after the lease duration");
        }
    }

    /// Tenants whose Lease another replica holds and renewed within twice the lease
    /// duration, by this machine's clock (the margin covers clock skew): served elsewhere.
    pub async fn served_elsewhere(&self) -> Result<BTreeSet<ClusterId>, kube::Error> {
        let Some(inner) = &self.inner else {
            return Ok(BTreeSet::new());
        };
        let leases: Api<Lease> = Api::namespaced(inner.client.clone(), &inner.candidacy.namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let margin = inner.candidacy.timing.lease_duration * 2;
        Ok(leases
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|lease| {
                let tenant = lease
                    .name_any()
                    .strip_prefix(TENANT_LEASE_PREFIX)?
                    .to_string();
                let spec = lease.spec.as_ref()?;
                let holder = spec.holder_identity.as_deref().unwrap_or_default();
                let renewed = spec.renew_time.as_ref()?.0;
                let live = now.duration_since(renewed).unsigned_abs() < margin;
                (live && !holder.is_empty() && holder != inner.candidacy.identity)
                    .then(|| ClusterId::parse(&tenant).ok())
                    .flatten()
            })
            .collect())
    }
}

impl Inner {
    /// Serves `tenant` until its Lease is lost, asked for, or the agent stops; then stops
    /// serving it here and, unless another replica took it already, releases it.
    async fn hold(
        self: Arc<Self>,
        tenant: ClusterId,
        leadership: Leadership,
        slot: Arc<tokio::sync::Mutex<Slot>>,
    ) {
        tokio::select! {
            _ = leadership.lost() => {}
            _ = self.shutdown.cancelled() => {}
        }
        // A claim of the tenant here waits until this is done.
        let _ordered = slot.lock().await;
        self.registry.end_current(&tenant);
        if !self
            .registry
            .in_flight(&tenant)
            .drained(HANDOVER_DRAIN)
            .await
        {
            tracing::warn!(%tenant, "the tenant's writes here were still under way when it was handed over");
        }
        // What this replica kept of the tenant would restore its objects from this replica's
        // view, older than the next holder's.
        self.desired.forget_tenant(&tenant);
        match leadership.asked_by() {
            Some(by) => tracing::info!(%tenant, to = %by, "handed the tenant over"),
            None if self.shutdown.is_cancelled() => {
                tracing::info!(%tenant, "stopping: released the tenant")
            }
            None => tracing::warn!(%tenant, "lost the tenant's Lease; stopped serving it here"),
        }
        leadership.release().await;
        self.served.locked().remove(&tenant);
    }
}

/// Releases the tenant Leases held under this replica's identity ([`Tenancy::release_predecessors`]).
async fn release_predecessors(inner: &Inner) {
    let me = inner.candidacy.identity.as_str();
    let leases: Api<Lease> = Api::namespaced(inner.client.clone(), &inner.candidacy.namespace);
    let listed = match leases.list(&ListParams::default()).await {
        Ok(listed) => listed.items,
        Err(error) => {
            tracing::warn!(%error, "could not list the tenant Leases a previous container of this pod held; they lapse after the lease duration");
            return;
        }
    };
    for mut lease in listed {
        let name = lease.name_any();
        let Some(spec) = lease.spec.take() else {
            continue;
        };
        if !name.starts_with(TENANT_LEASE_PREFIX) || spec.holder_identity.as_deref() != Some(me) {
            continue;
        }
        lease.spec = Some(released(
            &spec,
            MicroTime(k8s_openapi::jiff::Timestamp::now()),
        ));
        match leases.replace(&name, &PostParams::default(), &lease).await {
            Ok(_) => {
                tracing::info!(lease = %name, identity = %me, "released a tenant Lease this pod's previous container held")
            }
            Err(error) => {
                tracing::warn!(lease = %name, %error, "could not release a tenant Lease this pod's previous container held; it lapses after the lease duration")
            }
        }
    }
}

/// The Lease of `tenant`.
pub fn tenant_lease(tenant: &ClusterId) -> String {
    format!("{TENANT_LEASE_PREFIX}{tenant}")
}

/// Runs for the Lease of the work that spans tenants until `shutdown`, again after each loss;
/// the receiver says whether this replica holds it. `None` (no election): always.
pub fn spawn_controller_election(
    client: kube::Client,
    candidacy: Option<Candidacy>,
    shutdown: CancellationToken,
) -> watch::Receiver<bool> {
    let Some(candidacy) = candidacy else {
        // Kept until shutdown, so that readers see it change only then.
        let (tx, rx) = watch::channel(true);
        tokio::spawn(async move {
            shutdown.cancelled().await;
            drop(tx);
        });
        return rx;
    };
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let leadership = tokio::select! {
                _ = shutdown.cancelled() => return,
                l = Elector::new(client.clone(), candidacy.for_lease(CONTROLLER_LEASE.into())).acquire() => l,
            };
            tx.send_replace(true);
            tokio::select! {
                _ = leadership.lost() => {
                    tx.send_replace(false);
                    tracing::warn!("lost the Lease of the work that spans tenants; running for it again");
                }
                _ = shutdown.cancelled() => {
                    tx.send_replace(false);
                    leadership.release().await;
                    return;
                }
            }
        }
    });
    rx
}
