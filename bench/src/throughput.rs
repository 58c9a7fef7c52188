//! Throughput in rounds that alternate the two systems, as the latency rounds do.
//!
//! One burst per system says little: the API servers' CPU per object drifts by tens of percent
//! over minutes on the same clusters (the same 3,000 applies cost one API server 1.2 ms each
//! and, less than a minute later, 2.1 ms), and whichever system bursts first meets the clusters in
//! another state than the second. The bulk phases' bursts are round 1; each further round gives
//! each system the same bursts again on its own (the other's processes stopped), the first turn
//! alternating, and the throughput reported is the median of the rounds.

use crate::latency::in_turn;
use crate::load;
use crate::phases::{
    configmap_burst, cpu_by_process, cpu_since, delete_configmap_burst, service_burst, Plan,
    PATIENCE,
};
use crate::report::SystemResult;
use crate::say;
use crate::sides::Side;

/// One system's turn in throughput round `round` (2 and up): its processes started and idle,
/// each ConfigMap burst of `plan` then the Service burst, each deleted again once measured,
/// then its processes stopped (also when the turn failed). The CPU of every process (the
/// system's and `clusters'`) during the largest burst and the Service burst is recorded too.
pub async fn take_turn(
    name: &str,
    side: &mut impl Side,
    round: usize,
    plan: &Plan,
    clusters: &[(String, u32)],
    into: &mut SystemResult,
) -> anyhow::Result<()> {
    in_turn(name, side, async |side| {
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
            delete_configmap_burst(side, &prefix).await?;
        }
        let (n, prefix) = (plan.service_burst, format!("t{round}svc-"));
        let cpu_before = cpu_by_process(side, clusters);
        let rate = service_burst(side, &prefix, n).await?;
        let cpu = cpu_since(side, clusters, &cpu_before);
        let cpu_ms = cpu.iter().map(|(_, s)| s).sum::<f64>() * 1000.0 / n as f64;
        say(&format!(
            "{name}, round {round}: {n} Services on the provider at {rate:.0}/s, {cpu_ms:.2} ms of CPU per Service (all processes)"
        ));
        into.service_burst_cpu_by_round.push(cpu);
        into.add_service_burst(rate);
        // The namespace holds nothing else between the bulk phases and the latency rounds.
        load::delete_all(side.origin(), side.origin_ns()).await?;
        side.watch()
            .until(PATIENCE, "the Services deleted on the provider", |w| {
                w.present("Service", &prefix) == 0
            })
            .await?;
        Ok(())
    })
    .await
}
