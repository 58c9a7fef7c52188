//! `/stats/summary` and `/metrics/resource` of the virtual node, built from the provider's
//! figures for the pods this agent offloaded. Provider pods that do not map back to one of
//! those are dropped; the node's figures are the sums of its pods'.

use refract_wire::proto::{ContainerStats, CpuUsage, MemoryUsage, PodStats};
use serde_json::{json, Value};

/// An offloaded pod's figures, named as at the origin.
pub struct OriginPodStats {
    /// Origin namespace.
    pub namespace: String,
    /// Origin name.
    pub name: String,
    /// Origin UID.
    pub uid: String,
    /// The provider's figures.
    pub stats: PodStats,
}

fn rfc3339(nanos: i64) -> Value {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .map(|t| Value::String(t.to_string()))
        .unwrap_or(Value::Null)
}

fn cpu(c: &Option<CpuUsage>) -> Value {
    match c {
        Some(c) => json!({
            "time": rfc3339(c.time_unix_nanos),
            "usageNanoCores": c.usage_nano_cores,
            "usageCoreNanoSeconds": c.usage_core_nano_seconds,
        }),
        None => Value::Null,
    }
}

fn memory(m: &Option<MemoryUsage>) -> Value {
    match m {
        Some(m) => json!({
            "time": rfc3339(m.time_unix_nanos),
            "workingSetBytes": m.working_set_bytes,
            "usageBytes": m.usage_bytes,
            "rssBytes": m.rss_bytes,
        }),
        None => Value::Null,
    }
}

fn container(c: &ContainerStats) -> Value {
    json!({
        "name": c.name,
        "startTime": rfc3339(c.start_time_unix_nanos),
        "cpu": cpu(&c.cpu),
        "memory": memory(&c.memory),
    })
}

/// Node totals: sums of the pods', timed at the latest pod measurement.
fn totals(pods: &[OriginPodStats]) -> (CpuUsage, MemoryUsage) {
    let mut cpu = CpuUsage::default();
    let mut memory = MemoryUsage::default();
    for p in pods {
        if let Some(c) = &p.stats.cpu {
            cpu.time_unix_nanos = cpu.time_unix_nanos.max(c.time_unix_nanos);
            cpu.usage_nano_cores = cpu.usage_nano_cores.saturating_add(c.usage_nano_cores);
            cpu.usage_core_nano_seconds = cpu
                .usage_core_nano_seconds
                .saturating_add(c.usage_core_nano_seconds);
        }
        if let Some(m) = &p.stats.memory {
            memory.time_unix_nanos = memory.time_unix_nanos.max(m.time_unix_nanos);
            memory.working_set_bytes = memory.working_set_bytes.saturating_add(m.working_set_bytes);
            memory.usage_bytes = memory.usage_bytes.saturating_add(m.usage_bytes);
            memory.rss_bytes = memory.rss_bytes.saturating_add(m.rss_bytes);
        }
    }
    (cpu, memory)
}

/// The kubelet's `Summary` for the virtual node.
pub fn summary(node: &str, started_unix_nanos: i64, pods: &[OriginPodStats]) -> Value {
    let (node_cpu, node_memory) = totals(pods);
    json!({
        "node": {
            "nodeName": node,
            "startTime": rfc3339(started_unix_nanos),
            "cpu": cpu(&Some(node_cpu)),
            "memory": memory(&Some(node_memory)),
        },
        "pods": pods.iter().map(|p| json!({
            "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
            "startTime": rfc3339(p.stats.start_time_unix_nanos),
            "containers": p.stats.containers.iter().map(container).collect::<Vec<_>>(),
            "cpu": cpu(&p.stats.cpu),
            "memory": memory(&p.stats.memory),
        })).collect::<Vec<_>>(),
    })
}

/// The kubelet's `/metrics/resource` in the Prometheus text format.
pub fn resource_metrics(pods: &[OriginPodStats]) -> String {
    use std::fmt::Write;
    let (node_cpu, node_memory) = totals(pods);
    let ms = |nanos: i64| nanos / 1_000_000;
    let seconds = |core_nanos: u64| core_nanos as f64 / 1e9;
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(
        "node_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the node in core-seconds",
        "counter",
    );
    family(
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        "gauge",
    );
    family(
        "pod_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    );
    family(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        "gauge",
    );
    family(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
    );
    family(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        "gauge",
    );
    family(
        "scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    );
    let _ = writeln!(
        out,
        "node_cpu_usage_seconds_total {} {}",
        seconds(node_cpu.usage_core_nano_seconds),
        ms(node_cpu.time_unix_nanos)
    );
    let _ = writeln!(
        out,
        "node_memory_working_set_bytes {} {}",
        node_memory.working_set_bytes,
        ms(node_memory.time_unix_nanos)
    );
    for p in pods {
        let labels = format!(
            "namespace=\"{}\",pod=\"{}\"",
            escape(&p.namespace),
            escape(&p.name)
        );
        if let Some(c) = &p.stats.cpu {
            let _ = writeln!(
                out,
                "pod_cpu_usage_seconds_total{{{labels}}} {} {}",
                seconds(c.usage_core_nano_seconds),
                ms(c.time_unix_nanos)
            );
        }
        if let Some(m) = &p.stats.memory {
            let _ = writeln!(
                out,
                "pod_memory_working_set_bytes{{{labels}}} {} {}",
                m.working_set_bytes,
                ms(m.time_unix_nanos)
            );
        }
        for c in &p.stats.containers {
            let labels = format!("container=\"{}\",{labels}", escape(&c.name));
            if let Some(cpu) = &c.cpu {
                let _ = writeln!(
                    out,
                    "container_cpu_usage_seconds_total{{{labels}}} {} {}",
                    seconds(cpu.usage_core_nano_seconds),
                    ms(cpu.time_unix_nanos)
                );
            }
            if let Some(m) = &c.memory {
                let _ = writeln!(
                    out,
                    "container_memory_working_set_bytes{{{labels}}} {} {}",
                    m.working_set_bytes,
                    ms(m.time_unix_nanos)
                );
            }
        }
    }
    let _ = writeln!(out, "scrape_error 0");
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_wire::proto::PodRef;

    fn pod(name: &str, cores: u64, bytes: u64) -> OriginPodStats {
        OriginPodStats {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            stats: PodStats {
                pod: Some(PodRef {
                    namespace: "ns-remote".into(),
                    name: name.into(),
                }),
                start_time_unix_nanos: 1_700_000_000_000_000_000,
                cpu: Some(CpuUsage {
                    time_unix_nanos: 1_700_000_100_000_000_000,
                    usage_nano_cores: cores,
                    usage_core_nano_seconds: cores * 10,
                }),
                memory: Some(MemoryUsage {
                    time_unix_nanos: 1_700_000_100_000_000_000,
                    working_set_bytes: bytes,
                    usage_bytes: bytes,
                    rss_bytes: bytes,
                }),
                containers: vec![ContainerStats {
                    name: "c".into(),
                    start_time_unix_nanos: 1_700_000_000_000_000_000,
                    cpu: None,
                    memory: None,
                }],
            },
        }
    }

    #[test]
    fn the_summary_names_origin_pods_and_sums_the_node() {
        let s = summary("vk", 0, &[pod("a", 5, 100), pod("b", 7, 200)]);
        assert_eq!(s["node"]["nodeName"], "vk");
        assert_eq!(s["node"]["cpu"]["usageNanoCores"], 12);
        assert_eq!(s["node"]["memory"]["workingSetBytes"], 300);
        assert_eq!(s["pods"][0]["podRef"]["namespace"], "ns");
        assert_eq!(s["pods"][1]["podRef"]["uid"], "uid-b");
        assert_eq!(s["pods"][0]["containers"][0]["name"], "c");
    }

    #[test]
    fn the_metrics_have_one_series_per_pod() {
        let text = resource_metrics(&[pod("a", 5, 100)]);
        assert!(text.contains(
            "pod_memory_working_set_bytes{namespace=\"ns\",pod=\"a\"} 100 1700000100000"
        ));
        assert!(text.contains("node_memory_working_set_bytes 100"));
        assert!(text.contains("scrape_error 0"));
    }
}
