//! The `metrics-api` source: `metrics.k8s.io/v1beta1` PodMetrics of each of the tenant's
//! namespaces, read with the tenant's own client.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::PodStatus;
use refract_core::quantity::{parse_milli, parse_nano};
use refract_wire::proto::{ContainerStats, CpuUsage, MemoryUsage, PodRef, PodStats};
use serde::Deserialize;

use super::cpu_counter::CpuCounters;
use super::{rfc3339_nanos, unix_nanos, TenantPod};

/// One pod's metrics with the pod they were asked for.
pub struct Sample<'a> {
    pod: &'a TenantPod,
    metrics: PodMetrics,
}

/// Lists the PodMetrics of each namespace and keeps the listed pods. A namespace whose list
/// fails is skipped; only the first failure is a warning (`warned`), as a provider without a
/// metrics API would otherwise log one for every scrape at the origin.
pub async fn collect<'a>(
    client: &kube::Client,
    by_namespace: &BTreeMap<&str, Vec<&'a TenantPod>>,
    warned: &AtomicBool,
) -> Vec<Sample<'a>> {
    let mut out = Vec::new();
    for (namespace, pods) in by_namespace {
        let path = format!("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods");
        let Ok(request) = http::Request::get(path).body(Vec::new()) else {
            continue;
        };
        let list: PodMetricsList = match client.request(request).await {
            Ok(list) => list,
            Err(error) => {
                if warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%namespace, %error, "could not list pod metrics");
                } else {
                    tracing::warn!(
                        %namespace, %error,
                        "could not list pod metrics (is metrics.k8s.io served on this provider? \
                         further failures are logged at debug level)"
                    );
                }
                continue;
            }
        };
        for metrics in list.items {
            if let Some(pod) = pods.iter().find(|p| p.name == metrics.metadata.name) {
                out.push(Sample { pod, metrics });
            }
        }
    }
    out
}

/// Turns samples into the figures the origin gets, advancing the tenant's CPU counters and
/// forgetting those of containers no longer reported.
pub fn into_stats(
    samples: Vec<Sample<'_>>,
    tenant: &str,
    counters: &mut CpuCounters,
) -> Vec<PodStats> {
    let mut seen = HashSet::new();
    let stats = samples
        .into_iter()
        .map(|Sample { pod, metrics }| {
            let at = rfc3339_nanos(&metrics.timestamp);
            let window = metrics
                .window
                .as_deref()
                .and_then(go_duration_nanos)
                .unwrap_or(0);
            let containers: Vec<ContainerStats> = metrics
                .containers
                .into_iter()
                .map(|c| {
                    let key = (
                        tenant.to_string(),
                        pod.namespace.clone(),
                        pod.name.clone(),
                        c.name.clone(),
                    );
                    let nano_cores = nano_cores(&c.usage.cpu);
                    let total = counters.advance(key.clone(), at, window, nano_cores);
                    seen.insert(key);
                    ContainerStats {
                        start_time_unix_nanos: container_start(pod.status.as_ref(), &c.name),
                        cpu: Some(CpuUsage {
                            time_unix_nanos: at,
                            usage_nano_cores: nano_cores,
                            usage_core_nano_seconds: total,
                        }),
                        memory: Some(MemoryUsage {
                            time_unix_nanos: at,
                            working_set_bytes: bytes(&c.usage.memory),
                            usage_bytes: 0,
                            rss_bytes: 0,
                        }),
                        name: c.name,
                    }
                })
                .collect();
            let sum = |f: fn(&ContainerStats) -> u64| {
                containers.iter().map(f).fold(0_u64, u64::saturating_add)
            };
            let cpu = CpuUsage {
                time_unix_nanos: at,
                usage_nano_cores: sum(|c| c.cpu.as_ref().map_or(0, |c| c.usage_nano_cores)),
                usage_core_nano_seconds: sum(|c| {
                    c.cpu.as_ref().map_or(0, |c| c.usage_core_nano_seconds)
                }),
            };
            let memory = MemoryUsage {
                time_unix_nanos: at,
                working_set_bytes: sum(|c| c.memory.as_ref().map_or(0, |m| m.working_set_bytes)),
                usage_bytes: 0,
                rss_bytes: 0,
            };
            PodStats {
                pod: Some(PodRef {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                }),
                start_time_unix_nanos: pod_start(pod.status.as_ref()),
                cpu: Some(cpu),
                memory: Some(memory),
                containers,
            }
        })
        .collect();
    counters.keep_only(tenant, &seen);
    stats
}

/// A CPU quantity in nanocores, 0 when it is missing, negative or not a quantity.
fn nano_cores(q: &Option<String>) -> u64 {
    q.as_deref()
        .and_then(parse_nano)
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}

/// A memory quantity in bytes, 0 when it is missing, negative or not a quantity.
fn bytes(q: &Option<String>) -> u64 {
    q.as_deref()
        .and_then(parse_milli)
        .and_then(|n| u64::try_from(n / 1000).ok())
        .unwrap_or(0)
}

fn time_nanos(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    unix_nanos(t.0)
}

fn pod_start(status: Option<&PodStatus>) -> i64 {
    status
        .and_then(|s| s.start_time.as_ref())
        .map(time_nanos)
        .unwrap_or_default()
}

fn container_start(status: Option<&PodStatus>, container: &str) -> i64 {
    status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|s| s.name == container))
        .and_then(|s| s.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(time_nanos)
        .unwrap_or_default()
}

/// A Go duration as the metrics API writes its window (`30s`, `10.5s`, `1m0s`, `500ms`), in
/// nanoseconds; `None` for anything else.
fn go_duration_nanos(text: &str) -> Option<i64> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(number_end);
        let value: f64 = number.parse().ok()?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let nanos_per_unit = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * nanos_per_unit;
        rest = tail;
    }
    (total.is_finite() && total < i64::MAX as f64).then_some(total as i64)
}

#[derive(Deserialize)]
struct PodMetricsList {
    #[serde(default)]
    items: Vec<PodMetrics>,
}

#[derive(Deserialize)]
struct PodMetrics {
    metadata: Metadata,
    timestamp: Option<String>,
    window: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerMetrics>,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

#[derive(Deserialize)]
struct ContainerMetrics {
    name: String,
    #[serde(default)]
    usage: Usage,
}

#[derive(Deserialize, Default)]
struct Usage {
    cpu: Option<String>,
    memory: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_go_durations() {
        assert_eq!(go_duration_nanos("30s"), Some(30_000_000_000));
        assert_eq!(go_duration_nanos("10.5s"), Some(10_500_000_000));
        assert_eq!(go_duration_nanos("1m0s"), Some(60_000_000_000));
        assert_eq!(go_duration_nanos("500ms"), Some(500_000_000));
        assert_eq!(go_duration_nanos(""), None);
        assert_eq!(go_duration_nanos("5x"), None);
        assert_eq!(go_duration_nanos("s"), None);
    }

    fn tenant_pod(namespace: &str, name: &str) -> TenantPod {
        TenantPod {
            namespace: namespace.into(),
            name: name.into(),
            node: "n".into(),
            status: None,
        }
    }

    #[test]
    fn metrics_become_figures_with_a_growing_cpu_counter() {
        let pod = tenant_pod("t-ns", "web");
        let sample = |at: &str, cpu: &str| Sample {
            pod: &pod,
            metrics: serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "t-ns"},
                "timestamp": at,
                "window": "10s",
                "containers": [
                    {"name": "app", "usage": {"cpu": cpu, "memory": "64Mi"}},
                    {"name": "side", "usage": {"cpu": "0", "memory": "1Mi"}},
                ],
            }))
            .unwrap(),
        };
        let mut counters = CpuCounters::default();
        let first = into_stats(
            vec![sample("2026-11-28T10:00:00Z", "250m")],
            "tenant",
            &mut counters,
        );
        let second = into_stats(
            vec![sample("2026-11-28T10:00:20Z", "250m")],
            "tenant",
            &mut counters,
        );
        let cpu = |s: &[PodStats]| s[0].cpu.unwrap();
        assert_eq!(cpu(&first).usage_nano_cores, 250_000_000);
        assert_eq!(cpu(&first).usage_core_nano_seconds, 2_500_000_000);
        assert_eq!(cpu(&second).usage_core_nano_seconds, 7_500_000_000);
        let memory = second[0].memory.unwrap();
        assert_eq!(memory.working_set_bytes, 65 * 1024 * 1024);
        assert_eq!(second[0].containers.len(), 2);
        // The pod is gone from the next answer: its counters go too.
        into_stats(Vec::new(), "tenant", &mut counters);
        assert_eq!(counters.len(), 0);
    }
}
