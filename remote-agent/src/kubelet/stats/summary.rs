//! The `kubelet-summary` source: each node's `/stats/summary` through `nodes/proxy`.

use std::collections::{BTreeMap, BTreeSet};

use refract_wire::proto::{ContainerStats, CpuUsage, MemoryUsage, PodRef, PodStats};
use serde::Deserialize;
use tonic::Status;

use super::{rfc3339_nanos, TenantPod};

/// Reads each node's summary and keeps the listed pods. A node that does not answer is
/// skipped (its pods have no figures this time) rather than failing the whole answer.
pub async fn collect(
    client: &kube::Client,
    by_node: &BTreeMap<&str, Vec<&TenantPod>>,
) -> Result<Vec<PodStats>, Status> {
    let mut out = Vec::new();
    for (node, pods) in by_node {
        let wanted: BTreeSet<(&str, &str)> = pods
            .iter()
            .map(|p| (p.namespace.as_str(), p.name.as_str()))
            .collect();
        let request = http::Request::get(format!("/api/v1/nodes/{node}/proxy/stats/summary"))
            .body(Vec::new())
            .map_err(|e| Status::internal(e.to_string()))?;
        let summary: Summary = match client.request(request).await {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(%node, %error, "could not read the node's stats summary");
                continue;
            }
        };
        for pod in summary.pods {
            let key = (pod.pod_ref.namespace.as_str(), pod.pod_ref.name.as_str());
            if wanted.contains(&key) {
                out.push(pod.into_proto());
            }
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct Summary {
    #[serde(default)]
    pods: Vec<SummaryPod>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryPod {
    pod_ref: SummaryPodRef,
    start_time: Option<String>,
    cpu: Option<SummaryCpu>,
    memory: Option<SummaryMemory>,
    #[serde(default)]
    containers: Vec<SummaryContainer>,
}

#[derive(Deserialize)]
struct SummaryPodRef {
    namespace: String,
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryContainer {
    name: String,
    start_time: Option<String>,
    cpu: Option<SummaryCpu>,
    memory: Option<SummaryMemory>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryCpu {
    time: Option<String>,
    usage_nano_cores: Option<u64>,
    usage_core_nano_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryMemory {
    time: Option<String>,
    working_set_bytes: Option<u64>,
    usage_bytes: Option<u64>,
    rss_bytes: Option<u64>,
}

impl SummaryCpu {
    fn into_proto(self) -> CpuUsage {
        CpuUsage {
            time_unix_nanos: rfc3339_nanos(&self.time),
            usage_nano_cores: self.usage_nano_cores.unwrap_or_default(),
            usage_core_nano_seconds: self.usage_core_nano_seconds.unwrap_or_default(),
        }
    }
}

impl SummaryMemory {
    fn into_proto(self) -> MemoryUsage {
        MemoryUsage {
            time_unix_nanos: rfc3339_nanos(&self.time),
            working_set_bytes: self.working_set_bytes.unwrap_or_default(),
            usage_bytes: self.usage_bytes.unwrap_or_default(),
            rss_bytes: self.rss_bytes.unwrap_or_default(),
        }
    }
}

impl SummaryPod {
    fn into_proto(self) -> PodStats {
        PodStats {
            pod: Some(PodRef {
                namespace: self.pod_ref.namespace,
                name: self.pod_ref.name,
            }),
            start_time_unix_nanos: rfc3339_nanos(&self.start_time),
            cpu: self.cpu.map(SummaryCpu::into_proto),
            memory: self.memory.map(SummaryMemory::into_proto),
            containers: self
                .containers
                .into_iter()
                .map(|c| ContainerStats {
                    start_time_unix_nanos: rfc3339_nanos(&c.start_time),
                    name: c.name,
                    cpu: c.cpu.map(SummaryCpu::into_proto),
                    memory: c.memory.map(SummaryMemory::into_proto),
                })
                .collect(),
        }
    }
}
