//! Steady churn: every tenant's objects replaced one at a time (the oldest deleted, a new one
//! created) at a fixed rate, while the agents' resident memory is sampled. Memory that grows
//! with the number of changes, with the number of objects held constant, is a leak: of
//! bookkeeping kept for deleted objects (sent hashes, statuses, desired states), or of buffers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use refract_bench::procfs::rss_bytes;

use crate::{config_map, Tenant};

/// How often memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Resident memory at one moment of the churn.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the churn started.
    pub seconds: f64,
    /// Changes (deletes and creates) sent to the origin so far.
    pub changes: u64,
    /// The remote agent's resident memory, bytes.
    pub remote_agent: u64,
    /// All local agents' resident memory together, bytes.
    pub local_agents: u64,
    /// Each local agent's resident memory, bytes, in tenant order: whether growth is every
    /// agent's or one agent's.
    pub local_agent_each: Vec<u64>,
}

/// The name of the object a tenant's `k`th replacement deletes: the burst's objects first
/// (`b-0` ...), then the replacements in the order they were created.
fn oldest(k: usize, per_tenant: usize) -> String {
    if k < per_tenant {
        format!("b-{k}")
    } else {
        format!("r-{}", k - per_tenant)
    }
}

/// Replaces objects at `rate` per second over all tenants for `duration` (replacement `i` in
/// tenant `i % tenants`), sampling memory every few seconds; then waits until every twin
/// namespace holds exactly its tenant's live objects again. Returns the samples and how many
/// replacements each tenant made.
pub async fn run(
    provider: &kube::Client,
    tenants: &[Tenant],
    per_tenant: usize,
    (rate, duration, bytes): (f64, Duration, usize),
    remote_pid: u32,
    timeout: Duration,
) -> anyhow::Result<(Vec<Sample>, usize)> {
    let n = tenants.len();
    let count = (rate * duration.as_secs_f64()).ceil().max(1.0) as usize;
    let local_pids: Vec<u32> = tenants.iter().filter_map(|t| t.agent.pid()).collect();
    let sample = |start: Instant, changes: u64| {
        let local_agent_each: Vec<u64> = local_pids.iter().map(|p| rss_bytes(*p)).collect();
        Sample {
            seconds: start.elapsed().as_secs_f64(),
            changes,
            remote_agent: rss_bytes(remote_pid),
            local_agents: local_agent_each.iter().sum(),
            local_agent_each,
        }
    };
    let start = Instant::now();
    let tick_start = tokio::time::Instant::now();
    let mut samples = vec![sample(start, 0)];
    let mut next_sample = tick_start + SAMPLE_EVERY;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        let due = tick_start + Duration::from_secs_f64(i as f64 / rate);
        if due >= next_sample {
            samples.push(sample(start, 2 * i as u64));
            next_sample += SAMPLE_EVERY;
        }
        tokio::time::sleep_until(due).await;
        let (t, k) = (i % n, i / n);
        let api: Api<ConfigMap> = Api::namespaced(tenants[t].origin.clone(), &tenants[t].origin_ns);
        let (gone, new) = (oldest(k, per_tenant), format!("r-{k}"));
        tasks.spawn(async move {
            api.delete(&gone, &DeleteParams::default())
                .await
                .with_context(|| format!("delete {gone}"))?;
            api.create(&PostParams::default(), &config_map(&new, bytes))
                .await
                .with_context(|| format!("create {new}"))?;
            anyhow::Ok(())
        });
        // Reap finished replacements as we go, so the set stays small.
        while let Some(done) = tasks.try_join_next() {
            done??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    samples.push(sample(start, 2 * count as u64));
    let replaced = count.div_ceil(n);
    until_converged(provider, tenants, per_tenant, count, timeout).await?;
    samples.push(sample(start, 2 * count as u64));
    Ok((samples, replaced))
}

/// Waits until each twin namespace holds exactly its tenant's live objects after `count`
/// replacements: nothing deleted at the origin is left on the provider, nothing created is
/// missing.
async fn until_converged(
    provider: &kube::Client,
    tenants: &[Tenant],
    per_tenant: usize,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let n = tenants.len();
    let deadline = Instant::now() + timeout;
    for (t, tenant) in tenants.iter().enumerate() {
        // Tenant t made replacements k = 0.. while t + k·n < count.
        let made = (count + n - 1 - t) / n;
        let live: BTreeSet<String> = (made..made + per_tenant)
            .map(|k| oldest(k, per_tenant))
            .collect();
        let api: Api<ConfigMap> = Api::namespaced(provider.clone(), &tenant.twin_ns);
        loop {
            let names: BTreeSet<String> = api
                .list_metadata(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|m| m.metadata.name)
                .filter(|name| name.starts_with("b-") || name.starts_with("r-"))
                .collect();
            if names == live {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "tenant {}: the provider holds {} objects, {} of them not live, {} live ones missing",
                tenant.id,
                names.len(),
                names.difference(&live).count(),
                live.difference(&names).count()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Least-squares slope of `value` against changes over `samples`, bytes per change.
pub fn growth_per_change(samples: &[Sample], value: impl Fn(&Sample) -> u64) -> f64 {
    let n = samples.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let x = |s: &Sample| s.changes as f64;
    let y = |s: &Sample| value(s) as f64;
    let (mx, my) = (
        samples.iter().map(x).sum::<f64>() / n,
        samples.iter().map(y).sum::<f64>() / n,
    );
    let cov: f64 = samples.iter().map(|s| (x(s) - mx) * (y(s) - my)).sum();
    let var: f64 = samples.iter().map(|s| (x(s) - mx).powi(2)).sum();
    if var == 0.0 {
        0.0
    } else {
        cov / var
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(changes: u64, remote: u64) -> Sample {
        Sample {
            seconds: 0.0,
            changes,
            remote_agent: remote,
            local_agents: 0,
            local_agent_each: Vec::new(),
        }
    }

    #[test]
    fn slope_of_a_line_and_of_a_flat_series() {
        let line = [at(0, 100), at(10, 200), at(20, 300)];
        assert!((growth_per_change(&line, |s| s.remote_agent) - 10.0).abs() < 1e-9);
        let flat = [at(0, 100), at(10, 100), at(20, 100)];
        assert_eq!(growth_per_change(&flat, |s| s.remote_agent), 0.0);
    }

    #[test]
    fn the_oldest_object_comes_from_the_burst_first() {
        assert_eq!(oldest(0, 3), "b-0");
        assert_eq!(oldest(2, 3), "b-2");
        assert_eq!(oldest(3, 3), "r-0");
    }
}
