//! `PodStats`: the CPU and memory of a tenant's offloaded pods, the tenant's pods only, from
//! the source the provider chose (`--pod-stats`):
//!
//! - `metrics-api` (the default): `metrics.k8s.io` PodMetrics, read as the tenant, so the API
//!   server itself keeps each tenant to its own namespaces. It needs a metrics API on the
//!   provider (metrics-server or an adapter) and no right on nodes.
//! - `kubelet-summary`: each node's `/stats/summary` through `nodes/proxy`, read as this agent.
//!   Richer (cumulative CPU, container start times) but `nodes/proxy` reaches every kubelet API
//!   of every node, exec included: the provider grants it only by applying
//!   `deploy/remote-agent/rbac-kubelet-stats.yaml`.
//! - `off`: no figures; the origin is told so.

mod cpu_counter;
mod metrics_api;
mod summary;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::PodStatus;
use refract_core::keys::ORIGIN_LABEL;
use refract_shared::tls::ClusterId;
use refract_wire::proto::PodStats;
use tonic::Status;

use crate::shadowpod_controller::Stores;

/// Nanoseconds since the Unix epoch, clamped to what the wire's `int64` holds (0 before 1970).
fn unix_nanos(t: k8s_openapi::jiff::Timestamp) -> i64 {
    t.as_nanosecond().clamp(0, i64::MAX as i128) as i64
}

/// An RFC 3339 time as [`unix_nanos`]; 0 when it is missing or not a time.
fn rfc3339_nanos(t: &Option<String>) -> i64 {
    t.as_deref()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(unix_nanos)
        .unwrap_or_default()
}

/// Where pod statistics come from (`--pod-stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsSource {
    /// `metrics.k8s.io` PodMetrics, read as the tenant.
    MetricsApi,
    /// The kubelets' `/stats/summary` through `nodes/proxy`, read as this agent.
    KubeletSummary,
    /// None.
    Off,
}

/// One of the tenant's running offloaded pods.
#[derive(Debug, Clone)]
pub struct TenantPod {
    /// Provider namespace.
    pub namespace: String,
    /// Provider name.
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// The pod's status as last seen, for start times.
    pub status: Option<PodStatus>,
}

/// The tenant's offloaded pods that are bound to a node.
pub fn tenant_pods(stores: &Stores, tenant: &ClusterId) -> Vec<TenantPod> {
    let tenant_shadows: std::collections::BTreeSet<String> = stores
        .shadows
        .state()
        .iter()
        .filter(|s| s.meta().label(ORIGIN_LABEL) == Some(tenant.as_str()))
        .filter_map(|s| s.meta().uid().map(Into::into))
        .collect();
    stores
        .pods
        .state()
        .into_iter()
        .filter(|pod| {
            pod.meta()
                .controller_uid()
                .is_some_and(|uid| tenant_shadows.contains(uid))
        })
        .filter_map(|pod| {
            Some(TenantPod {
                namespace: pod.meta().namespace().into(),
                name: pod.meta().name().into(),
                node: pod.node_name.clone()?,
                status: pod.status(),
            })
        })
        .collect()
}

/// Reads pod statistics from the chosen source.
#[derive(Clone)]
pub struct StatsReader {
    source: StatsSource,
    /// Cumulative CPU for the metrics API, which reports rates only.
    counters: Arc<Mutex<cpu_counter::CpuCounters>>,
    /// Whether a failed metrics API read was logged as a warning already.
    warned: Arc<AtomicBool>,
}

impl StatsReader {
    /// A reader of `source`.
    pub fn new(source: StatsSource) -> Self {
        Self {
            source,
            counters: Arc::default(),
            warned: Arc::default(),
        }
    }

    /// The figures of `pods`. `own` is this agent's client (for node summaries), `tenant` the
    /// tenant's (for the metrics API). A node or namespace that does not answer is skipped:
    /// its pods have no figures this time, the others still do.
    pub async fn read(
        &self,
        own: &kube::Client,
        tenant_client: &kube::Client,
        tenant: &ClusterId,
        pods: &[TenantPod],
    ) -> Result<Vec<PodStats>, Status> {
        match self.source {
            StatsSource::Off => Err(Status::unavailable(
                "this provider shares no pod statistics (its remote agent runs with --pod-stats=off)",
            )),
            StatsSource::KubeletSummary => {
                let mut by_node: BTreeMap<&str, Vec<&TenantPod>> = BTreeMap::new();
                for p in pods {
                    by_node.entry(p.node.as_str()).or_default().push(p);
                }
                summary::collect(own, &by_node).await
            }
            StatsSource::MetricsApi => {
                let mut by_namespace: BTreeMap<&str, Vec<&TenantPod>> = BTreeMap::new();
                for p in pods {
                    by_namespace.entry(p.namespace.as_str()).or_default().push(p);
                }
                let samples = metrics_api::collect(tenant_client, &by_namespace, &self.warned).await;
                let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
                Ok(metrics_api::into_stats(samples, tenant.as_str(), &mut counters))
            }
        }
    }
}
