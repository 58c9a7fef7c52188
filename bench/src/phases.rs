//! The phases every system goes through, in order, on its own namespace; their bursts are
//! round 1 of the throughput rounds ([`crate::throughput`] has the others, and the latency
//! rounds that follow are in [`crate::latency`]).

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::load;
use crate::measure::{cpu_seconds, rss_bytes};
use crate::report::SystemResult;
use crate::say;
use crate::sides::Side;

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
/// returns when the provider's watch has seen them all.
pub async fn until_reflected(
    watch: &crate::measure::ProviderWatch,
    kind: &'static str,
    prefix: &str,
    n: usize,
    create: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<Instant> {
    let creating = tokio::spawn(create);
    let prefix = prefix.to_string();
    let arrived = watch.until(PATIENCE, "the burst on the provider", move |w| {
        w.present(kind, &prefix) >= n
    });
    tokio::pin!(arrived);
    // A failed creation would leave the wait hanging: watch both.
    tokio::select! {
        done = &mut arrived => done,
        created = creating => {
            created?.context("failed to create the burst at the origin")?;
            arrived.await
        }
    }
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

/// Runs every phase against `side`.
pub async fn run(
    name: &str,
    side: &mut impl Side,
    plan: &Plan,
    clusters: &[(String, u32)],
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
        let start = Instant::now();
        let cpu_before = cpu_by_process(side, clusters);
        let creating = {
            let (origin, ns, prefix) = (origin.clone(), ns.clone(), prefix.clone());
            let bytes = plan.data_bytes;
            async move { load::burst(&origin, &ns, &prefix, n, bytes).await }
        };
        let done = until_reflected(&watch, "ConfigMap", &prefix, n, creating).await?;
        let secs = (done - start).as_secs_f64();
        r.burst_cpu = cpu_since(side, clusters, &cpu_before);
        if n == largest {
            r.largest_burst_cpu_by_round.push(r.burst_cpu.clone());
        }
        say(&format!(
            "{name}: {n} objects on the provider in {secs:.2} s ({:.0}/s)",
            n as f64 / secs
        ));
        r.add_burst(n, n as f64 / secs);
        changes += n as u64;
        if i + 1 < plan.sizes.len() {
            load::delete_burst(&origin, &ns, &prefix).await?;
            watch
                .until(PATIENCE, "the burst deleted on the provider", |w| {
                    w.present("ConfigMap", &prefix) == 0
                })
                .await?;
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
    let start = Instant::now();
    let creating = {
        let (origin, ns) = (origin.clone(), ns.clone());
        async move { load::service_burst(&origin, &ns, "bsvc-", n).await }
    };
    let done = until_reflected(&watch, "Service", "bsvc-", n, creating).await?;
    let secs = (done - start).as_secs_f64();
    say(&format!(
        "{name}: {n} Services on the provider in {secs:.2} s ({:.0}/s)",
        n as f64 / secs
    ));
    r.service_throughput.0 = n;
    r.add_service_burst(n as f64 / secs);
    Ok(r)
}
