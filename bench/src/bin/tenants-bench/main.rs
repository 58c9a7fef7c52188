//! `tenants-bench`: one remote agent serving many origin tenants at once.
//!
//! A provider control plane and one remote agent in release builds; then, per tenant, an
//! origin control plane (etcd and kube-apiserver) and a local agent with a client certificate
//! of its own cluster id (`--shared-origin`: all local agents on one origin). Every tenant
//! extends a namespace of its own: its NamespaceOffloading selects that tenant's virtual node
//! only, so each local agent reflects one namespace. Then:
//!
//! - **Burst**: every tenant's ConfigMaps are created at once, interleaved across tenants, as
//!   fast as the origin takes them. Aggregate throughput (all objects / time until a watch on
//!   the provider has seen the last one), each tenant's completion time and latencies, and
//!   fairness: the slowest tenant's completion against the median tenant's.
//! - **Steady**: new ConfigMaps at a fixed rate, spread evenly over the tenants; each tenant's
//!   p50 and p99 from its create call to the provider watch's first sight, and fairness: the
//!   worst tenant p99 against the median tenant p99.
//! - The remote agent's resident memory (no tenant, every tenant connected with nothing
//!   reflected, every tenant's objects reflected) and CPU time, per tenant.
//! - **Churn** ([`churn`]): objects replaced one at a time while both agents' memory is
//!   sampled.
//!
//! It starts and stops everything itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use refract_bench::procfs::{cpu_seconds, rss_bytes};
use refract_bench::sightings::FirstSeen;
use refract_bench::stats::{ms, percentile};
use refract_e2e::{free_port, kubectl, kubectl_stdin, Agent, Peering};
use refract_testkit::{ControlPlane, Options};
use serde_json::json;

mod churn;

/// Measures one remote agent serving many origin tenants at once.
#[derive(Debug, Parser)]
#[command(name = "tenants-bench", version)]
struct Args {
    /// Origin tenants: local agents with distinct cluster ids, one namespace each.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=99))]
    tenants: u16,
    /// Run every tenant's local agent on one shared origin cluster instead of an origin
    /// control plane of its own. All the agents then peer with the same provider from the same
    /// origin, which no real deployment does: they fight over the one NamespaceOffloading
    /// status entry of that provider (BENCHMARKS.md, run 21), and the origin's API server spends
    /// its CPU on that.
    #[arg(long)]
    shared_origin: bool,
    /// ConfigMaps each tenant creates in the burst.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// ConfigMap payload, bytes.
    #[arg(long, default_value_t = 1024)]
    data_bytes: usize,
    /// Aggregate rate of the steady phase, objects per second over all tenants (default: half
    /// the burst's aggregate throughput).
    #[arg(long)]
    steady_rate: Option<f64>,
    /// Length of the steady phase, seconds.
    #[arg(long, default_value_t = 30)]
    steady_seconds: u64,
    /// Length of the churn phase, seconds: every tenant's objects replaced one at a time (the
    /// oldest deleted, a new one created) while the agents' memory is sampled (0 skips it).
    #[arg(long, default_value_t = 120)]
    churn_seconds: u64,
    /// Replacements per second over all tenants in the churn phase (default: the steady rate).
    #[arg(long)]
    churn_rate: Option<f64>,
    /// Longest wait for a phase's objects to reach the provider, seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// Where etcd keeps its data (a tmpfs by default, so disk stalls do not decide the tail).
    #[arg(long, default_value = "/dev/shm")]
    etcd_parent: PathBuf,
    /// Where the JSON of the run is written.
    #[arg(long, default_value = "target/bench/tenants.json")]
    json: PathBuf,
}

/// Origin requests in flight while loading.
const WRITERS: usize = 32;

fn say(message: &str) {
    eprintln!("\x1b[1m[tenants-bench]\x1b[0m {message}");
}

/// One origin tenant: its origin cluster, local agent, namespaces and the provider watch of its
/// twin.
struct Tenant {
    id: String,
    /// Its origin cluster's client.
    origin: kube::Client,
    /// Its own origin control plane; `None` on the shared origin (`--shared-origin`).
    cluster: Option<ControlPlane>,
    origin_ns: String,
    /// Its origin namespace's twin on the provider (the default mapping).
    twin_ns: String,
    agent: Agent,
    seen: FirstSeen,
}

impl Tenant {
    /// When the provider watch first saw `name`, a sent object.
    fn seen_at(&self, name: &str) -> Instant {
        self.seen.of(name).expect("every object was seen")
    }
}

/// The NamespaceOffloading CRD, installed in every origin.
const OFFLOADING_CRD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/local-agent/namespaceoffloading-crd.yaml"
);

/// Starts tenant `n`'s local agent on `cluster` (its own origin; the peering's when `None`) and
/// extends its namespace to its own virtual node only.
async fn start_tenant(
    peering: &Peering,
    provider: &kube::Client,
    n: u16,
    cluster: Option<ControlPlane>,
) -> anyhow::Result<Tenant> {
    let origin_cp = cluster.as_ref().unwrap_or(&peering.origin);
    if cluster.is_some() {
        kubectl(origin_cp, &["apply", "-f", OFFLOADING_CRD]);
    }
    let origin = origin_cp.client().await?;
    let id = format!("tenant-{n:02}");
    let origin_ns = format!("t{n:02}");
    let node = format!("refract-{id}");
    let certs = peering.certs.issue(&id, &id, "client", &[]);
    let args = vec![
        format!("--remote={}", peering.remote_addr),
        format!("--tls-cert={}", certs.join("tls.crt").display()),
        format!("--tls-key={}", certs.join("tls.key").display()),
        format!("--server-ca={}", certs.join("ca.crt").display()),
        format!("--cluster-id={id}"),
        "--remote-cluster-id=provider".into(),
        format!("--node-name={node}"),
        format!("--kubeconfig={}", origin_cp.kubeconfig.display()),
        format!("--admin-listen=127.0.0.1:{}", free_port()),
    ];
    let agent = Agent::spawn(
        "local-agent",
        &args,
        peering.dir.path().join(format!("local-agent-{id}.log")),
    );
    kubectl_stdin(
        origin_cp,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {origin_ns}}}\n---\n\
             apiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\n\
             metadata: {{name: offloading, namespace: {origin_ns}}}\n\
             spec: {{clusterSelector: {{nodeSelectorTerms: [{{matchExpressions: \
             [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]}}]}}}}\n"
        ),
    );
    let twin = format!("{origin_ns}-{id}");
    let namespaces: Api<Namespace> = Api::all(provider.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    while namespaces.get_opt(&twin).await?.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "tenant {id}: twin namespace {twin} not created within 120 s; its log: {}",
            agent.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = FirstSeen::watch(
        Api::<ConfigMap>::namespaced(provider.clone(), &twin),
        |_| true,
    )
    .await;
    Ok(Tenant {
        id,
        origin,
        cluster,
        origin_ns,
        twin_ns: twin,
        agent,
        seen,
    })
}

fn config_map(name: &str, bytes: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("payload".into(), "x".repeat(bytes))])),
        ..Default::default()
    }
}

/// One created object: its tenant's index, name, and when its create call started.
type Sent = (usize, String, Instant);

/// Creates `per_tenant` ConfigMaps `<prefix><j>` in every tenant's namespace, interleaved
/// across tenants, as fast as the origin takes them.
async fn burst(
    tenants: &[Tenant],
    prefix: &str,
    per_tenant: usize,
    bytes: usize,
) -> anyhow::Result<Vec<Sent>> {
    let n = tenants.len();
    stream::iter(0..n * per_tenant)
        .map(|k| {
            let (t, j) = (k % n, k / n);
            let api: Api<ConfigMap> =
                Api::namespaced(tenants[t].origin.clone(), &tenants[t].origin_ns);
            let name = format!("{prefix}{j}");
            async move {
                let sent = Instant::now();
                api.create(&PostParams::default(), &config_map(&name, bytes))
                    .await
                    .map(|_| (t, name, sent))
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect()
        .await
        .context("origin create failed")
}

/// Creates ConfigMaps `<prefix><i>` at `rate` per second over all tenants for `duration`,
/// object `i` in tenant `i % tenants`.
async fn steady(
    tenants: &[Tenant],
    prefix: &str,
    rate: f64,
    duration: Duration,
    bytes: usize,
) -> anyhow::Result<Vec<Sent>> {
    let count = (rate * duration.as_secs_f64()).ceil().max(1.0) as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let t = i % tenants.len();
        let api: Api<ConfigMap> = Api::namespaced(tenants[t].origin.clone(), &tenants[t].origin_ns);
        let name = format!("{prefix}{i}");
        tasks.spawn(async move {
            let sent = Instant::now();
            api.create(&PostParams::default(), &config_map(&name, bytes))
                .await
                .map(|_| (t, name, sent))
        });
    }
    let mut sent = Vec::with_capacity(count);
    while let Some(r) = tasks.join_next().await {
        sent.push(r?.context("origin create failed")?);
    }
    Ok(sent)
}

/// Waits until every sent object was seen on the provider.
async fn until_seen(tenants: &[Tenant], sent: &[Sent], timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let missing = sent
            .iter()
            .filter(|(t, name, _)| tenants[*t].seen.of(name).is_none())
            .count();
        if missing == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{missing} of {} objects not on the provider after {timeout:?}",
            sent.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One tenant's figures in a phase.
#[derive(Debug, Clone, serde::Serialize)]
struct TenantFigures {
    tenant: String,
    /// First create of the phase (any tenant) until this tenant's last object was seen, ms.
    done_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn figures(tenants: &[Tenant], sent: &[Sent], start: Instant) -> Vec<TenantFigures> {
    tenants
        .iter()
        .enumerate()
        .map(|(i, tenant)| {
            let mut latencies = Vec::new();
            let mut last = start;
            for (_, name, at) in sent.iter().filter(|(t, _, _)| *t == i) {
                let seen = tenant.seen_at(name);
                last = last.max(seen);
                latencies.push(seen.saturating_duration_since(*at));
            }
            latencies.sort();
            TenantFigures {
                tenant: tenant.id.clone(),
                done_ms: ms(last - start),
                p50_ms: ms(percentile(&latencies, 50.0)),
                p99_ms: ms(percentile(&latencies, 99.0)),
            }
        })
        .collect()
}

/// The median of `values` (the lower middle for an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

/// Every sent object's latency, sorted.
fn pooled(tenants: &[Tenant], sent: &[Sent]) -> Vec<Duration> {
    let mut all: Vec<Duration> = sent
        .iter()
        .map(|(t, name, at)| tenants[*t].seen_at(name).saturating_duration_since(*at))
        .collect();
    all.sort();
    all
}

/// CPU seconds so far of each group of processes the run watches: the remote agent, the local
/// agents, and each cluster's etcd and API server.
fn cpu_by_group(remote: u32, tenants: &[Tenant], peering: &Peering) -> BTreeMap<&'static str, f64> {
    let cluster = |cp: &ControlPlane| -> f64 {
        cp.processes()
            .into_iter()
            .map(|(_, pid)| cpu_seconds(pid))
            .sum()
    };
    BTreeMap::from([
        ("remote agent", cpu_seconds(remote)),
        (
            "local agents",
            tenants
                .iter()
                .filter_map(|t| t.agent.pid())
                .map(cpu_seconds)
                .sum(),
        ),
        (
            "origin etcd + kube-apiserver",
            cluster(&peering.origin)
                + tenants
                    .iter()
                    .filter_map(|t| t.cluster.as_ref())
                    .map(cluster)
                    .sum::<f64>(),
        ),
        ("provider etcd + kube-apiserver", cluster(&peering.provider)),
    ])
}

/// What each group spent between two [`cpu_by_group`] readings.
fn spent(
    before: &BTreeMap<&'static str, f64>,
    after: &BTreeMap<&'static str, f64>,
) -> BTreeMap<&'static str, f64> {
    after
        .iter()
        .map(|(group, cpu)| (*group, cpu - before.get(group).copied().unwrap_or(0.0)))
        .collect()
}

/// What the churn phase showed.
#[derive(Debug, serde::Serialize)]
struct Churn {
    rate: f64,
    /// Replacements each tenant made.
    replaced_per_tenant: usize,
    samples: Vec<churn::Sample>,
    /// Growth over the second half of the samples (the first half lets the allocator settle),
    /// bytes per 10,000 changes.
    remote_agent_growth_per_10k_changes: f64,
    local_agents_growth_per_10k_changes: f64,
    /// Each local agent's growth over the second half, bytes per 10,000 of its own changes
    /// (a tenant's agent sees one change in every `tenants`), in tenant order.
    local_agent_growth_each_per_10k_own_changes: Vec<f64>,
}

impl Churn {
    fn of(samples: Vec<churn::Sample>, rate: f64, replaced_per_tenant: usize) -> Self {
        let second_half = &samples[samples.len() / 2..];
        let growth = |value: &dyn Fn(&churn::Sample) -> u64| {
            churn::growth_per_change(second_half, value) * 10_000.0
        };
        let agents = samples[0].local_agent_each.len();
        let local_agent_growth_each_per_10k_own_changes = (0..agents)
            .map(|i| growth(&|s: &churn::Sample| s.local_agent_each[i]) * agents as f64)
            .collect();
        Self {
            rate,
            replaced_per_tenant,
            remote_agent_growth_per_10k_changes: growth(&|s| s.remote_agent),
            local_agents_growth_per_10k_changes: growth(&|s| s.local_agents),
            local_agent_growth_each_per_10k_own_changes,
            samples,
        }
    }

    fn print(&self, objects: usize) {
        let (first, last) = (&self.samples[0], &self.samples[self.samples.len() - 1]);
        println!(
            "| churn: {:.0} replacements/s, {} changes, each tenant's objects replaced {:.1} times | provider converged: every deleted object gone, every created one there |",
            self.rate,
            last.changes,
            self.replaced_per_tenant as f64 / objects as f64
        );
        println!(
            "| churn: remote agent memory first / last / growth per 10,000 changes (second half) | {:.1} / {:.1} MiB / {:.0} KiB |",
            mib(first.remote_agent),
            mib(last.remote_agent),
            self.remote_agent_growth_per_10k_changes / 1024.0
        );
        println!(
            "| churn: local agents' memory (all) first / last / growth per 10,000 changes (second half) | {:.1} / {:.1} MiB / {:.0} KiB |",
            mib(first.local_agents),
            mib(last.local_agents),
            self.local_agents_growth_per_10k_changes / 1024.0
        );
        let mut each = self.local_agent_growth_each_per_10k_own_changes.clone();
        each.sort_by(f64::total_cmp);
        if let (Some(least), Some(most)) = (each.first(), each.last()) {
            println!(
                "| churn: each local agent's growth per 10,000 of its own changes (second half), least / median / most | {:.0} / {:.0} / {:.0} KiB |",
                least / 1024.0,
                each[each.len() / 2] / 1024.0,
                most / 1024.0
            );
        }
    }
}

/// Resident memory in MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    refract_bench::set_up_run(&args.etcd_parent)?;
    let timeout = Duration::from_secs(args.timeout_seconds);

    say("starting two control planes (etcd + kube-apiserver 1.20.2) and the remote agent");
    // Every tenant dials from 127.0.0.1 here, where real origins come from addresses of their
    // own: the per-address connection limit is raised past the most tenants the bench runs.
    let mut peering =
        Peering::start_with_flags(false, &[], &["--max-connections-per-source=256"]).await?;
    // The peering's own local agent is not one of the measured tenants.
    if let Some(local) = peering.local.take() {
        local.stop().await;
    }
    let provider = peering.provider.client().await?;
    let remote_pid = peering
        .remote
        .as_ref()
        .and_then(Agent::pid)
        .context("remote agent not running")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_empty = rss_bytes(remote_pid);

    let mut clusters: Vec<Option<ControlPlane>> = Vec::new();
    if args.shared_origin {
        clusters.resize_with(args.tenants.into(), || None);
    } else {
        say(&format!(
            "starting {} origin control planes (etcd + kube-apiserver), one per tenant",
            args.tenants
        ));
        let started: Vec<ControlPlane> = stream::iter(1..=args.tenants)
            .map(|n| ControlPlane::start(Options::named(&format!("origin-{n:02}"))))
            .buffered(4)
            .try_collect()
            .await
            .context("failed to start the tenants' origins")?;
        clusters.extend(started.into_iter().map(Some));
    }
    say(&format!(
        "starting {} local agents, one tenant each, and extending one namespace per tenant",
        args.tenants
    ));
    let mut tenants = Vec::new();
    for (n, cluster) in (1..=args.tenants).zip(clusters) {
        tenants.push(start_tenant(&peering, &provider, n, cluster).await?);
    }
    // Let every reflector see its extension, and the connections settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_connected = rss_bytes(remote_pid);

    let total = tenants.len() * args.objects;
    say(&format!(
        "burst: {} ConfigMaps of {} bytes in each of {} namespaces ({total} in all)",
        args.objects,
        args.data_bytes,
        tenants.len()
    ));
    let cpu0 = cpu_by_group(remote_pid, &tenants, &peering);
    let start = Instant::now();
    let sent = burst(&tenants, "b-", args.objects, args.data_bytes).await?;
    until_seen(&tenants, &sent, timeout).await?;
    let burst_secs = start.elapsed().as_secs_f64();
    let burst_cpu = spent(&cpu0, &cpu_by_group(remote_pid, &tenants, &peering));
    let burst_remote_cpu = burst_cpu["remote agent"];
    let burst_tenants = figures(&tenants, &sent, start);
    // Until the remote agent's store and buffers settle after the burst.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_full = rss_bytes(remote_pid);
    let throughput = total as f64 / burst_secs;
    let burst_done: Vec<f64> = burst_tenants.iter().map(|f| f.done_ms).collect();
    let mut done_sorted = burst_done.clone();
    done_sorted.sort_by(f64::total_cmp);
    let (fastest, median_done, slowest) = (
        done_sorted[0],
        median(burst_done),
        done_sorted[done_sorted.len() - 1],
    );
    let burst_fairness = slowest / median_done;

    let rate = args.steady_rate.unwrap_or(throughput / 2.0);
    let window = Duration::from_secs(args.steady_seconds);
    say(&format!(
        "steady: {rate:.0} ConfigMaps/s over all tenants ({:.1}/s each) for {} s",
        rate / tenants.len() as f64,
        args.steady_seconds
    ));
    let cpu0 = cpu_by_group(remote_pid, &tenants, &peering);
    let start = Instant::now();
    let sent = steady(&tenants, "s-", rate, window, args.data_bytes).await?;
    until_seen(&tenants, &sent, timeout).await?;
    let steady_secs = start.elapsed().as_secs_f64();
    let steady_cpu = spent(&cpu0, &cpu_by_group(remote_pid, &tenants, &peering));
    let steady_remote_cpu = steady_cpu["remote agent"];
    let steady_tenants = figures(&tenants, &sent, start);
    let steady_all = pooled(&tenants, &sent);
    let p99s: Vec<f64> = steady_tenants.iter().map(|f| f.p99_ms).collect();
    let worst_p99 = p99s.iter().copied().fold(0.0, f64::max);
    let median_p99 = median(p99s);
    let steady_fairness = worst_p99 / median_p99;

    let after_steady = rss_bytes(remote_pid);

    let churn = if args.churn_seconds > 0 {
        let churn_rate = args.churn_rate.unwrap_or(rate);
        say(&format!(
            "churn: {churn_rate:.0} replacements/s (a delete and a create each) over all tenants for {} s, memory sampled every 5 s",
            args.churn_seconds
        ));
        let (samples, replaced) = churn::run(
            &provider,
            &tenants,
            args.objects,
            (
                churn_rate,
                Duration::from_secs(args.churn_seconds),
                args.data_bytes,
            ),
            remote_pid,
            timeout,
        )
        .await?;
        Some(Churn::of(samples, churn_rate, replaced))
    } else {
        None
    };

    let n = tenants.len() as f64;
    let per_tenant_rss = (rss_full.saturating_sub(rss_empty)) as f64 / n;
    let report = json!({
        "tenants": tenants.len(),
        "objects_per_tenant": args.objects,
        "data_bytes": args.data_bytes,
        "burst": {
            "seconds": burst_secs,
            "aggregate_objects_per_second": throughput,
            "fairness_slowest_over_median_done": burst_fairness,
            "cpu_seconds": burst_cpu,
            "by_tenant": burst_tenants,
        },
        "steady": {
            "rate": rate,
            "seconds": steady_secs,
            "objects": sent.len(),
            "p50_ms": ms(percentile(&steady_all, 50.0)),
            "p99_ms": ms(percentile(&steady_all, 99.0)),
            "median_tenant_p99_ms": median_p99,
            "worst_tenant_p99_ms": worst_p99,
            "fairness_worst_over_median_p99": steady_fairness,
            "cpu_seconds": steady_cpu,
            "by_tenant": steady_tenants,
        },
        "remote_agent_rss_bytes": {
            "no_tenant": rss_empty,
            "tenants_connected_nothing_reflected": rss_connected,
            "tenants_objects_reflected": rss_full,
            "after_steady": after_steady,
        },
        "churn": churn,
    });
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)?;

    println!("| figure | measured |");
    println!("|---|---|");
    println!(
        "| tenants × objects | {} × {} ConfigMaps of {} bytes, one remote agent |",
        tenants.len(),
        args.objects,
        args.data_bytes
    );
    println!(
        "| burst: aggregate throughput | {throughput:.0} objects/s ({total} in {burst_secs:.1} s) |"
    );
    println!(
        "| burst: each tenant done after (fastest / median / slowest) | {:.1} / {:.1} / {:.1} s; fairness slowest / median = **{burst_fairness:.2}** |",
        fastest / 1000.0,
        median_done / 1000.0,
        slowest / 1000.0
    );
    println!(
        "| steady {rate:.0}/s ({:.1}/s per tenant): p50 / p99 over all tenants | {:.1} / {:.1} ms |",
        rate / n,
        ms(percentile(&steady_all, 50.0)),
        ms(percentile(&steady_all, 99.0))
    );
    println!(
        "| steady: p99 per tenant, median / worst | {median_p99:.1} / {worst_p99:.1} ms; fairness worst / median = **{steady_fairness:.2}** |"
    );
    println!(
        "| steady: p99 of each tenant (ms) | {} |",
        steady_tenants
            .iter()
            .map(|f| format!("{:.0}", f.p99_ms))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| remote agent memory: no tenant / {} connected, nothing reflected / {total} objects reflected | {:.1} / {:.1} / {:.1} MiB |",
        tenants.len(),
        mib(rss_empty),
        mib(rss_connected),
        mib(rss_full)
    );
    println!(
        "| remote agent memory per tenant (connected, and with its {} objects) | {:.0} KiB / {:.2} MiB ({:.0} bytes per object) |",
        args.objects,
        (rss_connected.saturating_sub(rss_empty)) as f64 / n / 1024.0,
        per_tenant_rss / (1024.0 * 1024.0),
        per_tenant_rss / args.objects as f64
    );
    println!(
        "| remote agent CPU: burst, per tenant ({} objects) / per object | {:.3} CPU-s / {:.3} ms |",
        args.objects,
        burst_remote_cpu / n,
        burst_remote_cpu * 1000.0 / total as f64
    );
    println!(
        "| remote agent CPU: steady, per tenant | {:.4} cores ({:.3} ms per object) |",
        steady_remote_cpu / steady_secs / n,
        steady_remote_cpu * 1000.0 / sent.len() as f64
    );
    let by_group = |cpu: &BTreeMap<&str, f64>| {
        cpu.iter()
            .map(|(group, s)| format!("{group} {s:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| CPU-seconds in the burst, by process | {} |",
        by_group(&burst_cpu)
    );
    println!(
        "| CPU-seconds in the steady phase, by process | {} |",
        by_group(&steady_cpu)
    );
    if let Some(c) = &churn {
        c.print(args.objects);
    }
    say(&format!("JSON written to {}", args.json.display()));

    for t in tenants {
        t.agent.stop().await;
    }
    Ok(())
}
