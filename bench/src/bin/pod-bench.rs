//! `pod-bench`: how long an offloaded pod takes to run, against the same pod created directly on
//! the provider, on two real control planes and a real provider node (containerd, kubelet).
//!
//! - Single pods, one at a time, taking turns (Refract first in even turns): the time from just
//!   before the create call until a watch sees the pod `Running`, at the origin for an offloaded
//!   pod and on the provider for a direct one; p50, p99 and their ratio. For offloaded pods,
//!   also where the time went: origin create → the provider's twin pod `Running`, and that →
//!   the origin pod `Running` (status written back).
//! - A Deployment of many replicas at the origin and the same Deployment on the provider, in
//!   rounds taking turns: the time from creating it until every replica is `Running` where it
//!   was created.
//!
//! It starts and stops everything itself (about ten minutes with the defaults).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use refract_bench::sightings::FirstSeen;
use refract_bench::stats::{ms, percentile};
use refract_e2e::{busybox, kubectl_stdin, Peering};
use serde_json::json;

/// Times offloaded pods and a Deployment against the same created directly on the provider.
#[derive(Debug, Parser)]
#[command(name = "pod-bench", version)]
struct Args {
    /// Single pods timed per side.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Replicas of the Deployment timed per side.
    #[arg(long, default_value_t = 100)]
    replicas: u32,
    /// Deployments timed per side, taking turns (Refract first in odd rounds).
    #[arg(long, default_value_t = 2)]
    deployment_rounds: usize,
    /// Longest wait for one pod, or for a Deployment, to be Running, seconds.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
}

/// The offloaded namespace at the origin.
const OFFLOADED: &str = "bench";
/// Its twin on the provider, where the remote agent runs the offloaded pods.
const TWIN: &str = "bench-origin";
/// A provider namespace of its own for the pods created directly there.
const DIRECT: &str = "direct";

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// A pod that starts at once and idles, the same on both sides.
fn sleeper(image: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}]
        }
    })
}

/// Polls `done` every 50 ms until it holds or `timeout` passes.
async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not done after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// One side of the comparison: where pods are created and where they are seen Running.
struct Side {
    pods: Api<Pod>,
    deployments: Api<Deployment>,
    running: FirstSeen,
}

impl Side {
    /// Creates pod `name` and waits until it is Running; when the create call started and when
    /// the pod was first seen Running.
    async fn time_pod(
        &self,
        name: &str,
        image: &str,
        timeout: Duration,
    ) -> anyhow::Result<(Instant, Instant)> {
        let mut pod: Pod = serde_json::from_value(sleeper(image, json!({"bench": "single"})))?;
        pod.metadata.name = Some(name.to_string());
        let created = Instant::now();
        self.pods.create(&PostParams::default(), &pod).await?;
        wait_until(&format!("pod {name}"), timeout, || {
            self.running.of(name).is_some()
        })
        .await?;
        Ok((created, self.running.of(name).expect("seen")))
    }

    /// Creates Deployment `name` of `replicas` and waits until every replica is Running.
    async fn time_deployment(
        &self,
        name: &str,
        replicas: u32,
        image: &str,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": sleeper(image, json!({"app": name}))
            }
        }))?;
        let created = Instant::now();
        self.deployments
            .create(&PostParams::default(), &deployment)
            .await?;
        let prefix = format!("{name}-");
        let waited = wait_until(
            &format!("Deployment {name}: {replicas} Running"),
            timeout,
            || self.running.with_prefix(&prefix).0 >= replicas as usize,
        )
        .await;
        if let Err(e) = waited {
            return Err(e.context(self.why_not_running().await));
        }
        let (_, last) = self.running.with_prefix(&prefix);
        Ok(last
            .expect("replicas seen")
            .saturating_duration_since(created))
    }

    /// What the pods not Running here are waiting for, counted by phase and reason.
    async fn why_not_running(&self) -> String {
        let pods = match self.pods.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => return format!("pods could not be listed: {e}"),
        };
        let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
        for pod in pods.iter().filter(|p| !is_running(p)) {
            let status = pod.status.clone().unwrap_or_default();
            let waiting = status
                .container_statuses
                .iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .next();
            let condition = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.status == "False")
                .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()));
            let why = format!(
                "{} {}",
                status.phase.unwrap_or_else(|| "no phase".into()),
                waiting.or(condition).unwrap_or_default()
            );
            *reasons.entry(why).or_default() += 1;
        }
        format!("{} pods, not Running: {reasons:?}", pods.len())
    }
}

/// Deletes every pod and Deployment this benchmark made, and waits until the provider's node
/// runs none of them, so that one phase's clean-up never loads the next.
async fn clear(
    origin: &Side,
    direct: &Side,
    twin_pods: &Api<Pod>,
    timeout: Duration,
) -> anyhow::Result<()> {
    for side in [origin, direct] {
        side.deployments
            .delete_collection(&DeleteParams::background(), &ListParams::default())
            .await?;
        side.pods
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
    }
    let deadline = Instant::now() + timeout;
    for api in [&origin.pods, &direct.pods, twin_pods] {
        while !api.list(&ListParams::default()).await?.items.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "pods still there after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

async fn wait_for_default_service_account(
    client: kube::Client,
    namespace: &str,
) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.get_opt("default").await?.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no ServiceAccount default in {namespace}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `p50` and `p99` of `samples`, sorted here.
fn p50_p99(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 50.0), percentile(&samples, 99.0))
}

/// The single pods' tables: both sides' percentiles, and where an offloaded pod's time went.
fn print_singles(
    pods: usize,
    refract: Vec<Duration>,
    provider: Vec<Duration>,
    forward: Vec<Duration>,
    back: Vec<Duration>,
) {
    let (r50, r99) = p50_p99(refract);
    let (d50, d99) = p50_p99(provider);
    let (f50, f99) = p50_p99(forward);
    let (b50, b99) = p50_p99(back);
    println!();
    println!(
        "| pod created → Running ({} pods each) | through Refract, at the origin | direct on the provider | ratio |",
        pods
    );
    println!("|---|---|---|---|");
    for (name, a, b) in [("p50", r50, d50), ("p99", r99, d99)] {
        println!(
            "| {name} | {:.0} ms | {:.0} ms | {:.2}x |",
            ms(a),
            ms(b),
            ms(a) / ms(b)
        );
    }
    println!();
    println!("| where an offloaded pod's time went | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| origin create → its twin Running on the provider | {:.0} ms | {:.0} ms |",
        ms(f50),
        ms(f99)
    );
    println!(
        "| twin Running → origin pod Running (status written back) | {:.0} ms | {:.0} ms |",
        ms(b50),
        ms(b99)
    );
}

/// The Deployment table: each round's times (Refract, direct) and their mean.
fn print_deployments(replicas: u32, rounds: &[[Duration; 2]]) {
    println!();
    println!(
        "| Deployment of {replicas} replicas, created → all Running | through Refract, at the origin | direct on the provider | ratio |"
    );
    println!("|---|---|---|---|");
    let row = |name: &str, refract: f64, direct: f64| {
        println!(
            "| {name} | {refract:.1} s | {direct:.1} s | {:.2}x |",
            refract / direct
        )
    };
    for (i, [refract, direct]) in rounds.iter().enumerate() {
        let first = if i % 2 == 0 { "Refract" } else { "direct" };
        row(
            &format!("round {} ({first} first)", i + 1),
            refract.as_secs_f64(),
            direct.as_secs_f64(),
        );
    }
    if rounds.len() > 1 {
        let mean = |side: usize| {
            rounds.iter().map(|r| r[side].as_secs_f64()).sum::<f64>() / rounds.len() as f64
        };
        row("mean", mean(0), mean(1));
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    refract_bench::agents_log_at_info();
    let timeout = Duration::from_secs(args.timeout_seconds);
    eprintln!("[pod-bench] starting two control planes, a real provider node and the agents");
    // The provider is one node of 110 pods; the default 90 % share would offer 99, and a
    // Deployment of 100 must fit on the virtual node as on the provider.
    let p = Peering::start_offloading_with(&["--sharing-percentage=100"]).await?;
    let image = busybox();
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OFFLOADED}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {OFFLOADED}}}\nspec: {{podOffloadingStrategy: Remote}}\n"
        ),
    );
    let (origin_client, provider_client) = (p.origin.client().await?, p.provider.client().await?);
    let namespaces: Api<Namespace> = Api::all(provider_client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": DIRECT}}))?,
        )
        .await?;
    wait_for_default_service_account(origin_client.clone(), OFFLOADED).await?;
    wait_for_default_service_account(provider_client.clone(), DIRECT).await?;

    let origin = Side {
        pods: Api::namespaced(origin_client.clone(), OFFLOADED),
        deployments: Api::namespaced(origin_client.clone(), OFFLOADED),
        running: FirstSeen::watch(
            Api::namespaced(origin_client.clone(), OFFLOADED),
            is_running,
        )
        .await,
    };
    let direct = Side {
        pods: Api::namespaced(provider_client.clone(), DIRECT),
        deployments: Api::namespaced(provider_client.clone(), DIRECT),
        running: FirstSeen::watch(Api::namespaced(provider_client.clone(), DIRECT), is_running)
            .await,
    };
    let twin_pods: Api<Pod> = Api::namespaced(provider_client.clone(), TWIN);
    let twin_running =
        FirstSeen::watch(Api::namespaced(provider_client.clone(), TWIN), is_running).await;

    eprintln!("[pod-bench] warm-up: one pod on each side");
    origin.time_pod("warm-up", &image, timeout).await?;
    direct.time_pod("warm-up", &image, timeout).await?;

    eprintln!(
        "[pod-bench] single pods, {} per side, one at a time, taking turns",
        args.pods
    );
    let (mut refract, mut provider) = (Vec::new(), Vec::new());
    let (mut forward, mut back) = (Vec::new(), Vec::new());
    for turn in 0..args.pods {
        // Alternate which goes first, so neither always meets a node still busy with the other.
        for through_refract in [turn % 2 == 0, turn % 2 == 1] {
            let name = format!("single-{turn}");
            if through_refract {
                let (created, running) = origin.time_pod(&name, &image, timeout).await?;
                let twin = twin_running.of(&name).with_context(|| {
                    format!("{name} Running at the origin before its twin on the provider")
                })?;
                forward.push(twin.saturating_duration_since(created));
                back.push(running.saturating_duration_since(twin));
                refract.push(running.saturating_duration_since(created));
            } else {
                let (created, running) = direct.time_pod(&name, &image, timeout).await?;
                provider.push(running.saturating_duration_since(created));
            }
        }
    }

    if args.pods > 0 {
        print_singles(args.pods, refract, provider, forward, back);
    }
    eprintln!("[pod-bench] removing the single pods");
    clear(&origin, &direct, &twin_pods, timeout).await?;

    let mut fleets = Vec::new();
    for round in 0..args.deployment_rounds {
        // Alternate which goes first: a node that has just removed 100 pods may still be
        // tearing their sandboxes down.
        let mut times = [Duration::ZERO; 2];
        for through_refract in [round % 2 == 0, round % 2 == 1] {
            let (side, where_) = if through_refract {
                (&origin, "at the origin")
            } else {
                (&direct, "directly on the provider")
            };
            eprintln!(
                "[pod-bench] deployment round {}: {} replicas {where_}",
                round + 1,
                args.replicas
            );
            let name = format!("fleet{round}");
            times[usize::from(!through_refract)] = side
                .time_deployment(&name, args.replicas, &image, timeout)
                .await?;
            clear(&origin, &direct, &twin_pods, timeout).await?;
        }
        fleets.push(times);
    }
    print_deployments(args.replicas, &fleets);
    drop(p);
    Ok(())
}
