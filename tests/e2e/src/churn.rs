//! A churn of origin ConfigMaps and what it made the provider write: the fault and failover
//! tests change every object while something breaks, then check that the provider holds
//! exactly the origin's state, was written once per change and never with what it held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;

use refract_testkit::ControlPlane;

use crate::kubectl_get;

/// The name of churned object `i`.
fn name(i: usize) -> String {
    format!("cm-{i:04}")
}

/// Writes the provider saw: every watch event with a new resourceVersion, and those whose
/// data equals what the object already held (a write that changed nothing).
#[derive(Default)]
struct Seen {
    last: HashMap<String, (String, String)>,
    writes: u64,
    duplicates: Vec<String>,
    /// When the provider first held each (name, round).
    at: HashMap<(String, String), Instant>,
}

/// The provider's writes of one namespace's ConfigMaps, watched for the whole test.
#[derive(Clone, Default)]
pub struct ProviderWrites(Arc<Mutex<Seen>>);

impl ProviderWrites {
    /// Starts watching `namespace` on the provider.
    pub fn watch(client: kube::Client, namespace: &str) -> Self {
        let writes = Self::default();
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let seen = writes.0.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event {
                    record(&seen, &cm)
                }
            }
        });
        writes
    }

    /// Writes seen so far.
    pub fn count(&self) -> u64 {
        self.0.lock().unwrap().writes
    }

    /// Writes so far that changed nothing, as `name@rv (after rv)`.
    pub fn duplicates(&self) -> Vec<String> {
        self.0.lock().unwrap().duplicates.clone()
    }

    /// Once the provider has converged: waits a moment (late duplicates would show within
    /// it), then the writes since the count was `before`, and every duplicate write so far.
    pub async fn settled(&self, before: u64) -> (u64, Vec<String>) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        (self.count() - before, self.duplicates())
    }

    /// The 99th percentile of how long each object's `round` took from the origin accepting it
    /// to the provider holding it.
    pub fn p99(&self, accepted: &HashMap<String, Instant>, round: u32) -> Duration {
        let round = round.to_string();
        let seen = self.0.lock().unwrap();
        let mut took: Vec<Duration> = accepted
            .iter()
            .filter_map(|(name, at)| {
                let held = seen.at.get(&(name.clone(), round.clone()))?;
                Some(held.saturating_duration_since(*at))
            })
            .collect();
        assert_eq!(
            took.len(),
            accepted.len(),
            "every object reached the provider"
        );
        took.sort();
        took[(took.len() * 99).div_ceil(100) - 1]
    }
}

fn record(seen: &Mutex<Seen>, cm: &ConfigMap) {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let rv = cm.metadata.resource_version.clone().unwrap_or_default();
    let data = serde_json::to_string(&cm.data).unwrap_or_default();
    let mut s = seen.lock().unwrap();
    match s.last.get(&name) {
        Some((seen_rv, _)) if *seen_rv == rv => return, // a relist delivering it again
        Some((seen_rv, seen_data)) if *seen_data == data => {
            let duplicate = format!("{name}@{rv} (after {seen_rv})");
            s.duplicates.push(duplicate);
        }
        _ => {}
    }
    s.writes += 1;
    if let Some(round) = cm.data.as_ref().and_then(|d| d.get("round")) {
        s.at.entry((name.clone(), round.clone()))
            .or_insert_with(Instant::now);
    }
    s.last.insert(name, (rv, data));
}

/// Creates `objects` ConfigMaps at round 0, 16 at a time.
pub async fn create(origin: &Api<ConfigMap>, objects: usize) {
    futures::stream::iter(0..objects)
        .map(|i| {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name(i)}, "data": {"round": "0"}}))
            .unwrap();
            async move { origin.create(&PostParams::default(), &cm).await.map(|_| ()) }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await
        .unwrap();
}

/// Sets `round` on each of `objects` origin ConfigMaps, 16 writes in flight; when the origin
/// accepted each.
pub async fn churn(
    origin: &Api<ConfigMap>,
    objects: usize,
    round: u32,
) -> HashMap<String, Instant> {
    futures::stream::iter(0..objects)
        .map(|i| {
            let patch = serde_json::json!({"data": {"round": round.to_string()}});
            let name = name(i);
            async move {
                origin
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map(|_| (name, Instant::now()))
            }
        })
        .buffer_unordered(16)
        .try_collect::<HashMap<String, Instant>>()
        .await
        .expect("origin writes")
}

/// How long until each of `objects` provider copies holds `round`; panics after `wait`.
pub async fn converged(
    provider: &Api<ConfigMap>,
    objects: usize,
    round: u32,
    wait: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let behind = behind(provider, objects, round).await;
        if behind == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < wait,
            "{behind} provider copies still lack round {round} after {wait:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How many of `objects` provider copies do not hold `round` yet (all of them while the
/// provider cannot be listed).
pub async fn behind(provider: &Api<ConfigMap>, objects: usize, round: u32) -> usize {
    let want = round.to_string();
    provider
        .list(&ListParams::default())
        .await
        .map_or(objects, |l| {
            objects.saturating_sub(
                l.items
                    .iter()
                    .filter(|cm| cm.data.as_ref().and_then(|d| d.get("round")) == Some(&want))
                    .count(),
            )
        })
}

/// The provider pods' identity in `namespace`: pod UID, container ID, restart count and phase
/// of each, a line a pod.
pub fn provider_pods(provider: &ControlPlane, namespace: &str) -> String {
    kubectl_get(
        provider,
        &["-n", namespace, "pods", "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount} {.status.phase}{\"\\n\"}{end}"],
    )
    .unwrap_or_default()
}
