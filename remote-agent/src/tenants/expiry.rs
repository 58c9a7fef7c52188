//! Collecting tenants whose origin has gone away: `--tenant-expiry` (default: never).
//!
//! When a tenant's stream ends, its namespaces are stamped with [`LAST_SEEN_ANNOTATION`]. The
//! collector removes a tenant that is not connected and was last seen longer ago than the
//! expiry. Nothing counts from before this agent started (a stamp may be missing or stale when
//! the agent died while the tenant was connected), so a restart only ever postpones a
//! collection. Of several replicas, each collects the tenants it serves (it alone knows
//! whether they are connected), and the one running the work that spans tenants collects those
//! no live replica serves.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use refract_core::keys::{LAST_SEEN_ANNOTATION, TENANT_NAMESPACE_LABEL};
use refract_shared::tls::ClusterId;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::apply::desired::DesiredStore;
use crate::identity::Identities;
use crate::registry::Registry;
use crate::tenancy::Tenancy;

/// Where the collector learns which tenants are connected, and which are its to collect.
pub struct Served {
    /// The tenants connected to this replica.
    pub here: Registry,
    /// Which tenants this replica and the others serve.
    pub tenancy: Tenancy,
    /// Whether this replica runs the work that spans tenants.
    pub leading: tokio::sync::watch::Receiver<bool>,
}

impl Served {
    /// The tenants this replica leaves alone: those connected here, those another replica
    /// serves, and unless it runs the work that spans tenants, those it does not serve.
    async fn not_mine(&self) -> Result<NotMine, kube::Error> {
        let mut skipped = self.tenancy.served_elsewhere().await?;
        skipped.extend(self.here.connected());
        Ok(NotMine {
            skipped,
            only_served_here: !*self.leading.borrow(),
        })
    }
}

/// What [`Served::not_mine`] found.
struct NotMine {
    skipped: std::collections::BTreeSet<ClusterId>,
    only_served_here: bool,
}

impl NotMine {
    fn contains(&self, tenant: &ClusterId, tenancy: &Tenancy) -> bool {
        self.skipped.contains(tenant) || (self.only_served_here && !tenancy.serves_here(tenant))
    }
}

/// Field manager of the last-seen stamp, apart from the applier's own fields.
const LAST_SEEN_FIELD_MANAGER: &str = "refract-remote-agent-tenant-expiry";

/// Stamps `tenant`'s namespaces as seen now; failures are logged, the next disconnect retries.
pub async fn mark_last_seen(client: kube::Client, tenant: ClusterId) {
    let now = rfc3339(OffsetDateTime::now_utc());
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = serde_json::json!({"metadata": {"annotations": {LAST_SEEN_ANNOTATION: now}}});
    let params = PatchParams {
        field_manager: Some(LAST_SEEN_FIELD_MANAGER.into()),
        ..Default::default()
    };
    let namespaces = match refract_admin::tenant::namespaces_of(&client, &tenant).await {
        Ok(n) => n,
        Err(error) => {
            tracing::warn!(%tenant, %error, "failed to stamp when the tenant was last seen");
            return;
        }
    };
    for ns in namespaces {
        if let Err(error) = api
            .patch(&ns.name_any(), &params, &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%tenant, namespace = %ns.name_any(), %error, "failed to stamp when the tenant was last seen");
        }
    }
}

/// Removes, every so often, the tenants not connected for `expiry`.
pub fn spawn_collector(
    identities: Identities,
    served: Served,
    desired: DesiredStore,
    expiry: Duration,
    shutdown: CancellationToken,
) {
    let started = OffsetDateTime::now_utc();
    // Often enough that a collection comes at most a quarter of the expiry late.
    let period = (expiry / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tracing::info!(expiry = %shown(expiry), "tenants whose origin does not connect for the expiry will be removed");
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(error) = collect(&identities, &served, &desired, expiry, started).await {
                tracing::warn!(%error, "failed to look for expired tenants; trying again later");
            }
        }
    });
}

async fn collect(
    identities: &Identities,
    served: &Served,
    desired: &DesiredStore,
    expiry: Duration,
    started: OffsetDateTime,
) -> Result<(), kube::Error> {
    let client = identities.own();
    let api: Api<Namespace> = Api::all(client.clone());
    let mut namespaces = api
        .list(&ListParams::default().labels(TENANT_NAMESPACE_LABEL))
        .await?
        .items;
    // Those already being deleted are on their way; removing them again would only log it.
    namespaces.retain(|ns| ns.metadata.deletion_timestamp.is_none());
    let not_mine = served.not_mine().await?;
    let now = OffsetDateTime::now_utc();
    for (tenant, last_seen) in last_seen_by_tenant(&namespaces, started) {
        let Ok(id) = ClusterId::parse(&tenant) else {
            continue;
        };
        if not_mine.contains(&id, &served.tenancy) || !is_expired(last_seen, now, expiry) {
            continue;
        }
        // It may have connected while the namespaces were listed.
        if served.not_mine().await?.contains(&id, &served.tenancy) {
            continue;
        }
        let reason = format!(
            "its origin has not connected since {} (--tenant-expiry {})",
            rfc3339(last_seen),
            shown(expiry)
        );
        desired.forget_tenant(&id);
        let accounts = identities.accounts_namespace();
        refract_admin::tenant::remove(client, &id, accounts, &reason, false).await?;
        identities.forget_tenant(&id);
    }
    Ok(())
}

/// When each tenant was last seen: its latest stamp over its namespaces, never earlier than
/// `started`.
pub fn last_seen_by_tenant(
    namespaces: &[Namespace],
    started: OffsetDateTime,
) -> BTreeMap<String, OffsetDateTime> {
    let mut seen: BTreeMap<String, OffsetDateTime> = BTreeMap::new();
    for ns in namespaces {
        let Some(tenant) = ns.labels().get(TENANT_NAMESPACE_LABEL) else {
            continue;
        };
        // Nothing counts from before this agent started: it cannot know whether the tenant
        // was connected meanwhile, so after a restart every tenant gets a whole expiry again.
        let stamp = ns
            .annotations()
            .get(LAST_SEEN_ANNOTATION)
            .and_then(|s| {
                OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
            })
            .map_or(started, |t| t.max(started));
        let entry = seen.entry(tenant.clone()).or_insert(stamp);
        *entry = (*entry).max(stamp);
    }
    seen
}

/// Whether a tenant last seen at `last_seen` has been gone for `expiry` at `now`.
pub fn is_expired(last_seen: OffsetDateTime, now: OffsetDateTime, expiry: Duration) -> bool {
    now - last_seen >= expiry
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn shown(d: Duration) -> String {
    format!("{d:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ns(name: &str, tenant: &str, stamp: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(TENANT_NAMESPACE_LABEL.to_string(), tenant.to_string())].into()),
                annotations: stamp
                    .map(|s| [(LAST_SEEN_ANNOTATION.to_string(), s.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn at(s: &str) -> OffsetDateTime {
        OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    }

    #[test]
    fn a_tenant_counts_from_its_latest_stamp() {
        let started = at("2025-01-01T00:00:00Z");
        let seen = last_seen_by_tenant(
            &[
                ns("a-1", "a", Some("2026-01-02T00:00:00Z")),
                ns("a-2", "a", Some("2026-01-03T00:00:00Z")),
                ns("b-1", "b", Some("2025-12-01T00:00:00Z")),
            ],
            started,
        );
        assert_eq!(seen["a"], at("2026-01-03T00:00:00Z"));
        assert_eq!(seen["b"], at("2025-12-01T00:00:00Z"));
    }

    #[test]
    fn nothing_counts_from_before_the_agent_started() {
        let started = at("2026-01-01T00:00:00Z");
        let seen = last_seen_by_tenant(&[ns("a-1", "a", Some("2025-06-01T00:00:00Z"))], started);
        assert_eq!(seen["a"], started);
    }

    #[test]
    fn an_unstamped_or_unreadable_namespace_counts_from_the_agent_start() {
        let started = at("2026-01-01T00:00:00Z");
        let seen = last_seen_by_tenant(
            &[ns("a-2", "a", None), ns("b-1", "b", Some("yesterday"))],
            started,
        );
        assert_eq!(seen["a"], started);
        assert_eq!(seen["b"], started);
    }

    #[test]
    fn expiry_is_measured_from_last_seen() {
        let seen = at("2026-01-01T00:00:00Z");
        let hour = Duration::from_secs(3600);
        assert!(!is_expired(seen, at("2026-01-01T00:59:59Z"), hour));
        assert!(is_expired(seen, at("2026-01-01T01:00:00Z"), hour));
    }
}
