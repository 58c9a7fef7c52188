//! The phases every system goes through, in order, on its own namespace; their bursts are
//! round 1 of the throughput rounds ([`crate::throughput`] has the others, and the latency
//! rounds that follow are in [`crate::latency`]).

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::load;
use crate::report::SystemResult;
use crate::say;
use crate::sides::Side;
use refract_bench::procfs::{cpu_seconds, rss_bytes};

/// How long any one wait may take before the run fails.
pub const PATIENCE: Duration = Duration::from_secs(900);
/// Quiet time after a phase, to count late writes too.
const SETTLE: Duration = Duration::from_secs(3);

/// What to run.
pub struct Plan {
    /// Burst sizes, ascending.
    pub sizes: Vec<usize>,
    /// ConfigMap payload, bytes.
    pub data_bytes: usize,
    /// Idle window.
    pub idle: Duration,
    /// Services in the Service burst.
    pub service_burst: usize,
}

/// Runs `create` (which makes `n` objects of `kind` named `prefix…` at the origin) and
/// returns the objects per second until the provider's watch had them all.
async fn timed_burst(
    side: &impl Side,
    kind: &'static str,
    prefix: &str,
    n: usize,
    create: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let creating = tokio::spawn(create);
    let owned_prefix = prefix.to_string();
    let arrived = side
        .watch()
        .until(PATIENCE, "the burst on the provider", move |w| {
            w.present(kind, &owned_prefix) >= n
        });
    tokio::pin!(arrived);
    // A failed creation would leave the wait hanging: watch both.
    let done = tokio::select! {
        done = &mut arrived => done,
        created = creating => {
            created?.context("failed to create the burst at the origin")?;
            arrived.await
        }
    }?;
    Ok(n as f64 / (done - start).as_secs_f64())
}

/// Creates `n` ConfigMaps `prefix…` of `bytes` at the origin; returns the objects per second
/// until the provider had them all.
pub async fn configmap_burst(
    side: &impl Side,
    prefix: &str,
    n: usize,
    bytes: usize,
) -> anyhow::Result<f64> {
    let (origin, ns, p) = (
        side.origin().clone(),
        side.origin_ns().to_string(),
        prefix.to_string(),
    );
    let creating = async move { load::burst(&origin, &ns, &p, n, bytes).await };
    timed_burst(side, "ConfigMap", prefix, n, creating).await
}

/// The same for `n` Services.
pub async fn service_burst(side: &impl Side, prefix: &str, n: usize) -> anyhow::Result<f64> {
    let (origin, ns, p) = (
        side.origin().clone(),
        side.origin_ns().to_string(),
        prefix.to_string(),
    );
    let creating = async move { load::service_burst(&origin, &ns, &p, n).await };
    timed_burst(side, "Service", prefix, n, creating).await
}

/// Deletes the ConfigMap burst `prefix…` and waits until the provider has too.
pub async fn delete_configmap_burst(side: &impl Side, prefix: &str) -> anyhow::Result<()> {
    load::delete_burst(side.origin(), side.origin_ns(), prefix).await?;
    side.watch()
        .until(PATIENCE, "the burst deleted on the provider", |w| {
            w.present("ConfigMap", prefix) == 0
        })
        .await?;
    Ok(())
}

fn rss(side: &impl Side) -> Vec<(String, u64)> {
    side.processes()
        .into_iter()
        .map(|(n, pid)| (n, rss_bytes(pid)))
        .collect()
}

/// CPU seconds each process has spent since `before` (from [`cpu_by_process`]).
pub fn cpu_since(
    side: &impl Side,
    clusters: &[(String, u32)],
    before: &[(String, f64)],
) -> Vec<(String, f64)> {
    cpu_by_process(side, clusters)
        .into_iter()
        .zip(before)
        .map(|((n, after), (_, before))| (n, after - before))
        .collect()
}

/// CPU seconds per process: the system's own and the clusters'.
pub fn cpu_by_process(side: &impl Side, clusters: &[(String, u32)]) -> Vec<(String, f64)> {
    side.processes()
        .iter()
        .chain(clusters)
        .map(|(n, pid)| (n.clone(), cpu_seconds(*pid)))
        .collect()
}

/// Each API server's request and watch-event counters, by cluster.
async fn read_requests(
    api_servers: &[(String, kube::Client)],
) -> Vec<(String, refract_bench::requests::Counts)> {
    let mut counts = Vec::new();
    for (cluster, client) in api_servers {
        counts.push((cluster.clone(), refract_bench::requests::read(client).await));
    }
    counts
}

/// Runs every phase against `side`.
pub async fn run(
    name: &str,
    side: &mut impl Side,
    plan: &Plan,
    clusters: &[(String, u32)],
    api_servers: &[(String, kube::Client)],
) -> anyhow::Result<SystemResult> {
    let mut r = SystemResult {
        system: name.into(),
        rss_empty: rss(side),
        ..Default::default()
    };
    let origin = side.origin().clone();
    let ns = side.origin_ns().to_string();
    let watch = side.watch().clone();
    let writes_start = watch.writes();
    let mut changes = 0u64;
    let largest = *plan.sizes.last().expect("sizes checked");
    let largest_prefix = format!("b{largest}-");

    for (i, &n) in plan.sizes.iter().enumerate() {
        let prefix = format!("b{n}-");
        say(&format!(
            "{name}: burst of {n} ConfigMaps of {} bytes",
            plan.data_bytes
        ));
        let cpu_before = cpu_by_process(side, clusters);
        let rate = configmap_burst(side, &prefix, n, plan.data_bytes).await?;
        r.burst_cpu = cpu_since(side, clusters, &cpu_before);
        if n == largest {
            r.largest_burst_cpu_by_round.push(r.burst_cpu.clone());
        }
        say(&format!(
            "{name}: {n} objects on the provider in {:.2} s ({rate:.0}/s)",
            n as f64 / rate
        ));
        r.add_burst(n, rate);
        changes += n as u64;
        if i + 1 < plan.sizes.len() {
            delete_configmap_burst(side, &prefix).await?;
            changes += n as u64;
        }
    }

    let touched = largest.min(1000);
    say(&format!(
        "{name}: {touched} updates, then {touched} changes of a never-reflected annotation"
    ));
    let before = watch.writes();
    load::update(&origin, &ns, &largest_prefix, touched, plan.data_bytes).await?;
    watch
        .until(PATIENCE, "the updates on the provider", |w| {
            w.writes() >= before + touched as u64
        })
        .await?;
    changes += touched as u64;
    load::touch(&origin, &ns, &largest_prefix, touched).await?;
    tokio::time::sleep(SETTLE * 2).await;
    r.writes = watch.writes() - writes_start;
    r.effective_changes = changes;
    say(&format!(
        "{name}: {} provider writes for {changes} effective changes",
        r.writes
    ));

    r.objects = largest;
    r.rss_full = rss(side);

    say(&format!(
        "{name}: idle for {:?} with {largest} objects reflected",
        plan.idle
    ));
    let (writes0, cpu0) = (watch.writes(), side.cpu_seconds());
    tokio::time::sleep(plan.idle).await;
    r.idle_writes = watch.writes() - writes0;
    r.idle_seconds = plan.idle.as_secs();
    r.idle_cpu_seconds = side.cpu_seconds() - cpu0;

    say(&format!("{name}: restarting the origin side"));
    let writes0 = watch.writes();
    let start = Instant::now();
    side.restart(largest).await?;
    r.reconnect_seconds = start.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    r.reconnect_writes = watch.writes() - writes0;
    say(&format!(
        "{name}: in agreement after {:.2} s, {} provider writes",
        r.reconnect_seconds, r.reconnect_writes
    ));

    // Services cost the API servers far more than ConfigMaps (a ClusterIP is allocated on
    // both clusters): their latency is measured at half their own throughput.
    let n = plan.service_burst;
    say(&format!("{name}: burst of {n} Services"));
    let requests_before = read_requests(api_servers).await;
    let cpu_before = cpu_by_process(side, clusters);
    let rate = service_burst(side, "bsvc-", n).await?;
    r.service_burst_cpu_by_round
        .push(cpu_since(side, clusters, &cpu_before));
    // Late requests (status writes, events) count too.
    tokio::time::sleep(SETTLE).await;
    let requests_after = read_requests(api_servers).await;
    for ((cluster, before), (_, after)) in requests_before.iter().zip(&requests_after) {
        r.service_burst_requests.extend(
            refract_bench::requests::per_object(before, after, n)
                .into_iter()
                .map(|(what, per)| (format!("{cluster} {what}"), per)),
        );
    }
    say(&format!(
        "{name}: {n} Services on the provider in {:.2} s ({rate:.0}/s)",
        n as f64 / rate
    ));
    r.service_throughput.0 = n;
    r.add_service_burst(rate);
    Ok(r)
}
