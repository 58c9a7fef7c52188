//! `resume-bench`: what a reconnect costs with many objects reflected, on two real control
//! planes with both agent binaries over mutual TLS.
//!
//! With `--objects` ConfigMaps reflected (default 10,000):
//! 1. the local agent restarts, nothing changed: bytes sent against a full resend, time until
//!    both sides agree, provider writes;
//! 2. the local agent is stopped, `--changed` ConfigMaps change at the origin, it starts again:
//!    Upserts that travel and provider writes (both must equal `--changed`), time to agree;
//! 3. the remote agent restarts: the same figures as 1.
//!
//! "Agree" means the local agent is connected and has compared every bucket, every object
//! confirmed, and (for 2) the provider shows every change. It starts and stops everything itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use refract_e2e::resume_series::{SENT, SKIPPED_BYTES, SKIPPED_OBJECTS, UPSERTS};
use refract_e2e::{kubectl_stdin, metric, Peering};

/// Measures what a reconnect sends and writes with many objects reflected.
#[derive(Debug, Parser)]
#[command(name = "resume-bench", version)]
struct Args {
    /// ConfigMaps reflected.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// ConfigMap payload, bytes.
    #[arg(long, default_value_t = 1024)]
    data_bytes: usize,
    /// ConfigMaps changed while the local agent is down.
    #[arg(long, default_value_t = 100)]
    changed: usize,
}

const NS: &str = "resume";
const TWIN: &str = "resume-origin";
const WAIT: Duration = Duration::from_secs(180);

fn say(what: &str) {
    eprintln!("\x1b[1m[resume-bench]\x1b[0m {what}");
}

/// One reconnect's figures.
struct Reconnect {
    what: String,
    seconds: f64,
    sent_bytes: f64,
    full_bytes: f64,
    upserts: f64,
    writes: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    refract_bench::agents_log_at_info();
    say("starting two control planes and both agents");
    let mut p = Peering::start(false).await?;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{}}\n"),
    );
    let origin: Api<ConfigMap> = Api::namespaced(p.origin.client().await?, NS);
    let provider: Api<ConfigMap> = Api::namespaced(p.provider.client().await?, TWIN);
    p.until_extended(NS, Duration::from_secs(60)).await;

    say(&format!(
        "creating {} ConfigMaps of {} bytes at the origin",
        args.objects, args.data_bytes
    ));
    let payload = "x".repeat(args.data_bytes);
    futures::stream::iter(0..args.objects)
        .map(|i| {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("cm-{i:05}")),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([("payload".into(), payload.clone())])),
                ..Default::default()
            };
            let origin = origin.clone();
            async move { origin.create(&PostParams::default(), &cm).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let started = Instant::now();
    let mut held = versions(&provider).await?;
    while held.len() < args.objects {
        anyhow::ensure!(
            started.elapsed() < WAIT,
            "the ConfigMaps did not reach the provider"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        held = versions(&provider).await?;
    }
    say(&format!(
        "{} ConfigMaps on the provider after {:.1} s",
        held.len(),
        started.elapsed().as_secs_f64()
    ));
    let mut results = Vec::new();

    say("1. restarting the local agent, nothing changed");
    if let Some(local) = p.local.take() {
        local.stop().await;
    }
    let base = Baseline::now(&p).await;
    let started = Instant::now();
    p.start_local();
    let seconds = until_settled(&p, started, args.objects as f64).await?;
    let writes = rewritten(&held, &versions(&provider).await?);
    let what = "local agent restarted, nothing changed";
    results.push(base.figures(&p, what, seconds, writes).await);

    say(&format!(
        "2. stopping the local agent, changing {} ConfigMaps, starting it",
        args.changed
    ));
    if let Some(local) = p.local.take() {
        local.stop().await;
    }
    let step = args.objects / args.changed.max(1);
    let changed: Vec<String> = (0..args.changed)
        .map(|i| format!("cm-{:05}", i * step))
        .collect();
    for name in &changed {
        let patch = serde_json::json!({"data": {"payload": format!("changed-{payload}")}});
        origin
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let base = Baseline::now(&p).await;
    let started = Instant::now();
    p.start_local();
    let unchanged = (args.objects - args.changed) as f64;
    until_settled(&p, started, unchanged).await?;
    loop {
        let now = versions(&provider).await?;
        if changed.iter().all(|n| now.get(n) != held.get(n)) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < WAIT,
            "the changes did not reach the provider"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let now = versions(&provider).await?;
    let what = format!("{} changed while the local agent was down", args.changed);
    results.push(
        base.figures(&p, &what, seconds, rewritten(&held, &now))
            .await,
    );
    let changed_written = changed
        .iter()
        .filter(|n| now.get(*n) != held.get(*n))
        .count();
    held = now;

    say("3. restarting the remote agent");
    if let Some(remote) = p.remote.take() {
        remote.stop().await;
    }
    let base = Baseline::now(&p).await;
    let started = Instant::now();
    p.start_remote();
    let seconds = until_settled(&p, started, base.skipped_objects + args.objects as f64).await?;
    let writes = rewritten(&held, &versions(&provider).await?);
    let what = "remote agent restarted, nothing changed";
    results.push(base.figures(&p, what, seconds, writes).await);

    println!();
    println!(
        "| reconnect ({} ConfigMaps of {} bytes) | seconds to agree | bytes sent | bytes of a full resend | sent / full | Upserts received | provider writes |",
        args.objects, args.data_bytes
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {:.2} | {:.0} | {:.0} | {:.3} % | {:.0} | {} |",
            r.what,
            r.seconds,
            r.sent_bytes,
            r.full_bytes,
            100.0 * r.sent_bytes / r.full_bytes.max(1.0),
            r.upserts,
            r.writes
        );
    }
    println!(
        "\nof the {} changed ConfigMaps, {changed_written} were written on the provider",
        args.changed
    );
    Ok(())
}

/// Waits until the local agent has resumed and settled; seconds since `since`.
async fn until_settled(p: &Peering, since: Instant, skipped: f64) -> anyhow::Result<f64> {
    refract_e2e::until_resumed(&p.local_admin, since, skipped, WAIT)
        .await
        .map(|took| took.as_secs_f64())
        .map_err(|e| anyhow::anyhow!("{e}:\n{}", p.local_log()))
}

/// The agents' counters before a reconnect, read with the restarted agent stopped (a stopped
/// agent's counters read 0, as its new process starts them).
struct Baseline {
    sent: f64,
    skipped_bytes: f64,
    skipped_objects: f64,
    upserts: f64,
}

impl Baseline {
    async fn now(p: &Peering) -> Self {
        Self {
            sent: metric(&p.local_admin, SENT).await,
            skipped_bytes: metric(&p.local_admin, SKIPPED_BYTES).await,
            skipped_objects: metric(&p.local_admin, SKIPPED_OBJECTS).await,
            upserts: metric(&p.remote_admin, UPSERTS).await,
        }
    }

    /// The figures of the reconnect since: bytes sent, the full resend (sent plus not sent),
    /// Upserts the remote agent received.
    async fn figures(&self, p: &Peering, what: &str, seconds: f64, writes: usize) -> Reconnect {
        let sent = metric(&p.local_admin, SENT).await - self.sent;
        let skipped = metric(&p.local_admin, SKIPPED_BYTES).await - self.skipped_bytes;
        Reconnect {
            what: what.to_string(),
            seconds,
            sent_bytes: sent,
            full_bytes: sent + skipped,
            upserts: metric(&p.remote_admin, UPSERTS).await - self.upserts,
            writes,
        }
    }
}

/// The provider's ConfigMaps: name → resourceVersion.
async fn versions(provider: &Api<ConfigMap>) -> anyhow::Result<BTreeMap<String, String>> {
    let list = provider.list_metadata(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|m| m.name_any().starts_with("cm-"))
        .map(|m| (m.name_any(), m.resource_version().unwrap_or_default()))
        .collect())
}

/// How many objects of `before` have another resourceVersion (or are gone) in `after`.
fn rewritten(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> usize {
    before
        .iter()
        .filter(|(name, rv)| after.get(*name) != Some(*rv))
        .count()
}
