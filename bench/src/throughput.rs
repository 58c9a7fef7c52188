//! Throughput in rounds that alternate the two systems, as the latency rounds do.
//!
//! One burst per system says little: the API servers' CPU per object drifts by tens of percent
//! over minutes on the same clusters (the same 3,000 applies cost one API server 1.2 ms each
//! and, less than a minute later, 2.1 ms), and whichever system bursts first meets the clusters in
//! another state than the second. The bulk phases' bursts are round 1; each further round gives
//! each system the same bursts again on its own (the other's processes stopped), the first turn
//! alternating, and the throughput reported is the median of the rounds.

use crate::load;
use crate::phases::{cpu_by_process, cpu_since, until_reflected, Plan, PATIENCE};
use crate::report::SystemResult;
use crate::say;
use crate::sides::Side;

/// One system's turn in throughput round `round` (2 and up): its processes started and idle,
/// each ConfigMap burst of `plan` then the Service burst, each deleted again once measured,
/// then its processes stopped (also when the turn failed). The CPU of every process (the
/// system's and `clusters'`) during the largest burst is recorded too.
pub async fn take_turn(
    name: &str,
    side: &mut impl Side,
    round: usize,
    plan: &Plan,
    clusters: &[(String, u32)],
    into: &mut SystemResult,
) -> anyhow::Result<()> {
    side.resume().await?;
    let result = async {
        crate::latency::settle(name, side).await;
        let largest = plan.sizes.last().copied();
        for &n in &plan.sizes {
            let prefix = format!("t{round}-{n}-");
            let cpu_before = cpu_by_process(side, clusters);
            let rate = configmap_burst(side, &prefix, n, plan.data_bytes).await?;
            let cpu = cpu_since(side, clusters, &cpu_before);
            let cpu_ms = cpu.iter().map(|(_, s)| s).sum::<f64>() * 1000.0 / n as f64;
            say(&format!(
                "{name}, round {round}: {n} ConfigMaps on the provider at {rate:.0}/s, {cpu_ms:.2} ms of CPU per object (all processes)"
            ));
            if Some(n) == largest {
                into.largest_burst_cpu_by_round.push(cpu);
            }
            into.add_burst(n, rate);
            delete_configmaps(side, &prefix).await?;
        }
        let n = plan.service_burst;
        let rate = service_burst(side, &format!("t{round}svc-"), n).await?;
        say(&format!(
            "{name}, round {round}: {n} Services on the provider at {rate:.0}/s"
        ));
        into.add_service_burst(rate);
        anyhow::Ok(())
    }
    .await;
    side.pause().await;
    result
}

/// Creates `n` ConfigMaps and returns the objects per second until the provider had them all.
async fn configmap_burst(
    side: &impl Side,
    prefix: &str,
    n: usize,
    bytes: usize,
) -> anyhow::Result<f64> {
    let (origin, ns, watch) = (side.origin(), side.origin_ns(), side.watch());
    let start = std::time::Instant::now();
    let creating = {
        let (origin, ns, prefix) = (origin.clone(), ns.to_string(), prefix.to_string());
        async move { load::burst(&origin, &ns, &prefix, n, bytes).await }
    };
    let done = until_reflected(watch, "ConfigMap", prefix, n, creating).await?;
    Ok(n as f64 / (done - start).as_secs_f64())
}

/// Deletes a ConfigMap burst and waits until the provider has too.
async fn delete_configmaps(side: &impl Side, prefix: &str) -> anyhow::Result<()> {
    load::delete_burst(side.origin(), side.origin_ns(), prefix).await?;
    side.watch()
        .until(PATIENCE, "the burst deleted on the provider", |w| {
            w.present("ConfigMap", prefix) == 0
        })
        .await?;
    Ok(())
}

/// The same for `n` Services.
async fn service_burst(side: &impl Side, prefix: &str, n: usize) -> anyhow::Result<f64> {
    let (origin, ns, watch) = (side.origin(), side.origin_ns(), side.watch());
    let start = std::time::Instant::now();
    let creating = {
        let (origin, ns, prefix) = (origin.clone(), ns.to_string(), prefix.to_string());
        async move { load::service_burst(&origin, &ns, &prefix, n).await }
    };
    let done = until_reflected(watch, "Service", prefix, n, creating).await?;
    let rate = n as f64 / (done - start).as_secs_f64();
    // The namespace holds nothing else between the bulk phases and the latency rounds.
    load::delete_all(origin, ns).await?;
    watch
        .until(PATIENCE, "the Services deleted on the provider", |w| {
            w.present("Service", prefix) == 0
        })
        .await?;
    Ok(rate)
}
