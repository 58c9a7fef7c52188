//! `idle-bench`: what the agents cost while nothing changes.
//!
//! Starts two control planes (a scheduler and controllers on the provider, fake-kubelet nodes
//! there), offloads a namespace, reflects `--objects` ConfigMaps and offloads `--pods` pods
//! into it, waits until every ConfigMap is on the provider and every origin pod shows
//! `Running` and the provider's events about them are written at the origin, lets it settle,
//! then reads both agents' CPU time and wake-ups (voluntary context
//! switches) over `--idle-seconds` in which nothing changes, and prints them per minute. Also
//! counts the watches the remote agent holds on the provider's API server, by kind: the API
//! server's `apiserver_registered_watchers` with the agent running, less without it.
//!
//! `REFRACT_BIN_DIR` runs other agents (say, an earlier commit's), for a before and after.
//! It starts and stops everything itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark harness: a panic is how it reports a failed step"
)]
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use refract_bench::fake_fleet::{offload_to_fake_nodes, sleeper_pod};
use refract_bench::kube_ops::{count, create_all};
use refract_bench::procfs::Usage;
use refract_e2e::{kubectl, metric, Peering};
use refract_testkit::Options;
use serde_json::json;

/// Measures both agents' CPU and wake-ups per idle minute with many objects and pods.
#[derive(Debug, Parser)]
#[command(name = "idle-bench", version)]
struct Args {
    /// ConfigMaps reflected.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Pods offloaded (run by fake kubelets on the provider).
    #[arg(long, default_value_t = 1_000)]
    pods: usize,
    /// The idle window measured, seconds.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// How long everything may take to settle before the window, seconds.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
    /// Writes the figures as JSON here too.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// The offloaded namespace, and its twin on the provider (the default naming).
const NS: &str = "idle";
const TWIN: &str = "idle-origin";
/// Provider events the local agent wrote at the origin.
const EVENTS_WRITTEN: &str = "refract_local_provider_events_written_total";

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let timeout = Duration::from_secs(args.timeout_seconds);
    let started = Instant::now();
    let say = |what: &str| {
        eprintln!(
            "[idle-bench {:>6.1}s] {what}",
            started.elapsed().as_secs_f64()
        )
    };

    say("starting the control planes and both agents");
    // No controllers at the origin: pods are bound to the virtual node by name, and nothing
    // there evicts them. The provider schedules the offloaded pods on its fake nodes.
    let mut p = Peering::start_on(
        Options::named("origin"),
        Options::named("provider").with_controllers(),
        &[],
        &[],
    )
    .await?;
    let _stop_nodes = offload_to_fake_nodes(&p, NS, args.pods).await?;
    let origin = p.origin.client().await?;
    let provider = p.provider.client().await?;

    say(&format!(
        "creating {} ConfigMaps and {} pods",
        args.objects, args.pods
    ));
    let configmaps: Api<ConfigMap> = Api::namespaced(origin.clone(), NS);
    create_all(
        &configmaps,
        args.objects,
        32,
        |i| json!({"metadata": {"name": format!("cm-{i:05}")}, "data": {"value": format!("{i}")}}),
    )
    .await
    .context("failed to create the ConfigMaps")?;
    let pods: Api<Pod> = Api::namespaced(origin.clone(), NS);
    create_all(&pods, args.pods, 16, |i| {
        sleeper_pod(&format!("pod-{i:05}"))
    })
    .await
    .context("failed to create the pods")?;

    say("waiting until every ConfigMap is on the provider and every pod Running at the origin");
    let twin_configmaps: Api<ConfigMap> = Api::namespaced(provider.clone(), TWIN);
    let deadline = Instant::now() + timeout;
    loop {
        let reflected = count(&twin_configmaps, "").await?;
        let running = count(&pods, "status.phase=Running").await?;
        // The twin holds the origin's root CA ConfigMap too, when the origin has one.
        if reflected >= args.objects && running >= args.pods {
            say(&format!(
                "{reflected} ConfigMaps reflected, {running} pods Running"
            ));
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not settled after {timeout:?}: {reflected}/{} ConfigMaps, {running}/{} pods Running",
            args.objects,
            args.pods
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The provider's events about the new pods (the scheduler's) reach the origin paced by
    // the local agent's event rate: the window starts once they are all written.
    say("settling: until the provider's events are written at the origin and 20 s more");
    let mut written = -1.0;
    loop {
        let now = metric(&p.local_admin, EVENTS_WRITTEN).await;
        if now == written {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "events still being written after {timeout:?}"
        );
        written = now;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    say(&format!("{written} provider events written at the origin"));
    tokio::time::sleep(Duration::from_secs(20)).await;

    let pids = [
        (
            "local-agent",
            p.local
                .as_ref()
                .and_then(|a| a.pid())
                .context("local agent gone")?,
        ),
        (
            "remote-agent",
            p.remote
                .as_ref()
                .and_then(|a| a.pid())
                .context("remote agent gone")?,
        ),
    ];
    say(&format!(
        "measuring {} s with nothing changing",
        args.idle_seconds
    ));
    // What crosses the link in the window: the origin's stream bytes, and the statuses and
    // events it writes. All stay 0 when nothing changes.
    let traffic = [
        "refract_local_stream_sent_bytes_total",
        "refract_local_pod_status_seconds_count",
        EVENTS_WRITTEN,
    ];
    let mut traffic_before = Vec::new();
    for series in traffic {
        traffic_before.push(metric(&p.local_admin, series).await);
    }
    let before: Vec<Usage> = pids.iter().map(|(_, pid)| Usage::of(*pid)).collect();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let per_minute = 60.0 / args.idle_seconds as f64;
    let mut figures = serde_json::Map::new();
    println!();
    println!(
        "idle, {} ConfigMaps and {} pods: per minute",
        args.objects, args.pods
    );
    println!("{:<14} {:>12} {:>10}", "agent", "CPU ms", "wake-ups");
    for ((name, pid), before) in pids.iter().zip(before) {
        let used = Usage::of(*pid).since(before);
        let cpu_ms = used.cpu_seconds * 1000.0 * per_minute;
        let wakeups = used.wakeups as f64 * per_minute;
        println!("{name:<14} {cpu_ms:>12.1} {wakeups:>10.0}");
        figures.insert(
            name.to_string(),
            json!({"cpu_ms_per_minute": cpu_ms, "wakeups_per_minute": wakeups}),
        );
    }

    let mut crossed = serde_json::Map::new();
    for (series, before) in traffic.iter().zip(traffic_before) {
        let during = metric(&p.local_admin, series).await - before;
        println!("{series} in the window: {during}");
        crossed.insert(series.to_string(), json!(during));
    }

    say("counting the remote agent's watches on the provider (with it, then without)");
    let with_agent = registered_watchers(&p);
    p.remote.take().context("remote agent gone")?.stop().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let without = registered_watchers(&p);
    println!();
    println!("provider watches the remote agent holds, by kind");
    let mut watches = serde_json::Map::new();
    for (kind, n) in &with_agent {
        let own = n - without.get(kind).copied().unwrap_or(0);
        if own != 0 {
            println!("{kind:<40} {own:>4}");
            watches.insert(kind.clone(), json!(own));
        }
    }
    if let Some(path) = &args.json {
        let out = json!({
            "objects": args.objects,
            "pods": args.pods,
            "idle_seconds": args.idle_seconds,
            "per_minute": figures,
            "in_the_window": crossed,
            "remote_agent_watches": watches,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
        say(&format!("wrote {}", path.display()));
    }
    Ok(())
}

/// The provider API server's registered watchers, by `group/version/kind`.
fn registered_watchers(p: &Peering) -> BTreeMap<String, i64> {
    let metrics = kubectl(&p.provider, &["get", "--raw", "/metrics"]);
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_registered_watchers{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let kind = format!("{}/{}/{}", label("group"), label("version"), label("kind"));
        out.insert(kind, value.trim().parse::<f64>().unwrap_or(0.0) as i64);
    }
    out
}
