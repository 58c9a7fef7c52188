//! `pod-scale-bench`: many offloaded pods through one peering (issue 53, point 4: "10,000
//! offloaded pods through one peering (the fake kubelet may run them)").
//!
//! Starts two control planes (a scheduler and controllers on the provider, four fake-kubelet
//! nodes there with room for every pod), both agents as users run them, and a tenant policy
//! whose pod quota fits (the default holds a tenant to 1,000 pods). Then:
//!
//! - **Offload**: creates `--pods` pods bound to the virtual node, `--parallel` at a time,
//!   and times until every one shows `Running` at the origin; per pod, the time from the
//!   provider's pod first seen `Running` to the origin's (status back, under the burst).
//! - **Status back at a steady rate**: as a kubelet would, changes one running provider pod's
//!   status every `1 / --status-rate` s (its container's restart count), and times each change
//!   from the provider's answer to the origin's watch first seeing it. Goal: p99 at most 1 s
//!   at 50 changes a second.
//! - **Memory**: each agent's resident memory before the pods and after (20 s after the last
//!   is Running), per pod (goal: at most 10 KB each); again once the steady phase's changes
//!   are back, and after the agents have been idle a while (`--idle-seconds`).
//!
//! It starts and stops everything itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark harness: a panic is how it reports a failed step"
)]
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use refract_bench::fake_fleet::{offload_to_fake_nodes, sleeper_pod};
use refract_bench::kube_ops::create_all;
use refract_bench::procfs::rss_bytes;
use refract_bench::sightings::FirstSeen;
use refract_bench::stats::{ms, percentile};
use refract_e2e::{Agent, Peering};
use refract_testkit::Options;
use serde_json::json;

/// Measures offloading many pods through one peering.
#[derive(Debug, Parser)]
#[command(name = "pod-scale-bench", version)]
struct Args {
    /// Pods offloaded.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Pods created at the origin at the same time.
    #[arg(long, default_value_t = 32)]
    parallel: usize,
    /// Provider pod status changes a second in the steady phase.
    #[arg(long, default_value_t = 50.0)]
    status_rate: f64,
    /// Length of the steady phase, seconds.
    #[arg(long, default_value_t = 60)]
    status_seconds: u64,
    /// After the steady phase, how long both agents are left idle before their memory is
    /// read again: what stays resident then is what they hold, not what the burst left in
    /// the allocator. 0 skips that reading.
    #[arg(long, default_value_t = 120)]
    idle_seconds: u64,
    /// How long offloading every pod may take, seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_seconds: u64,
    /// An extra flag for the remote agent (repeatable), e.g. `--remote-arg=--pod-workers=1`,
    /// to compare settings with one build.
    #[arg(long = "remote-arg", allow_hyphen_values = true)]
    remote_args: Vec<String>,
    /// Where etcd keeps its data.
    #[arg(long, default_value = "/dev/shm")]
    etcd_parent: PathBuf,
    /// Where the JSON of the run is written.
    #[arg(long, default_value = "target/bench/pod-scale.json")]
    json: PathBuf,
}

/// The offloaded namespace, and its twin on the provider (the default naming).
const NS: &str = "scale";
const TWIN: &str = "scale-origin";

fn say(started: Instant, what: &str) {
    eprintln!(
        "\x1b[1m[pod-scale-bench {:>6.1}s]\x1b[0m {what}",
        started.elapsed().as_secs_f64()
    );
}

fn exists(_: &Pod) -> bool {
    true
}

fn is_scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The steady phase's mark: a container restarted once.
fn restarted(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.restart_count >= 1))
}

fn pod_name(i: usize) -> String {
    format!("pod-{i:05}")
}

/// p50 and p99 in milliseconds of sorted samples.
fn p50_p99(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    (ms(percentile(samples, 50.0)), ms(percentile(samples, 99.0)))
}

/// Waits until `seen` has `n` sightings of names starting with `prefix`; when the last was.
async fn until_seen(
    seen: &FirstSeen,
    prefix: &str,
    n: usize,
    deadline: Instant,
    what: &str,
) -> anyhow::Result<Instant> {
    loop {
        let (count, last) = seen.with_prefix(prefix);
        if count >= n {
            return last.context("no sighting");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: {count} of {n} in time");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    refract_bench::set_up_run(&args.etcd_parent)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_seconds);

    say(started, "starting the control planes and both agents");
    let policy = tempfile::NamedTempFile::new()?;
    std::fs::write(
        policy.path(),
        format!(
            "defaults:\n  quota:\n    hard:\n      pods: {}\n",
            args.pods + 100
        ),
    )?;
    let policy_flag = format!("--policy={}", policy.path().display());
    let mut remote_flags = vec![policy_flag.as_str()];
    remote_flags.extend(args.remote_args.iter().map(String::as_str));
    // No controllers at the origin: pods are bound to the virtual node by name. The provider
    // schedules the offloaded pods on its fake nodes.
    let p = Peering::start_on(
        Options::named("origin"),
        Options::named("provider").with_controllers(),
        &[],
        &remote_flags,
    )
    .await?;
    let _stop_nodes = offload_to_fake_nodes(&p, NS, args.pods).await?;
    let origin = p.origin.client().await?;
    let provider = p.provider.client().await?;
    let pids = [
        ("local agent", p.local.as_ref().and_then(Agent::pid)),
        ("remote agent", p.remote.as_ref().and_then(Agent::pid)),
    ]
    .map(|(name, pid)| (name, pid.expect("both agents run")));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_before = pids.map(|(_, pid)| rss_bytes(pid));

    let origin_pods: Api<Pod> = Api::namespaced(origin.clone(), NS);
    let provider_pods: Api<Pod> = Api::namespaced(provider.clone(), TWIN);
    let running_origin = FirstSeen::watch(origin_pods.clone(), is_running).await;
    let running_provider = FirstSeen::watch(provider_pods.clone(), is_running).await;
    // Where the time goes: the ShadowPods the remote agent wrote, the provider's pods its
    // controller made from them, scheduled, running.
    let shadowpods: Api<kube::api::DynamicObject> = Api::namespaced_with(
        provider.clone(),
        TWIN,
        &kube::api::ApiResource {
            group: "offloading.refract.io".into(),
            version: "v1alpha1".into(),
            api_version: refract_core::forge::pod::SHADOWPOD_API_VERSION.into(),
            kind: "ShadowPod".into(),
            plural: "shadowpods".into(),
        },
    );
    let shadowpods_written = FirstSeen::watch(shadowpods, |_| true).await;
    let created_provider = FirstSeen::watch(provider_pods.clone(), exists).await;
    let scheduled_provider = FirstSeen::watch(provider_pods.clone(), is_scheduled).await;

    say(
        started,
        &format!(
            "offloading {} pods, {} created at a time",
            args.pods, args.parallel
        ),
    );
    let t0 = Instant::now();
    create_all(&origin_pods, args.pods, args.parallel, |i| {
        sleeper_pod(&pod_name(i))
    })
    .await
    .context("failed to create the pods")?;
    let created = t0.elapsed();
    say(
        started,
        &format!(
            "created in {:.1} s; waiting until every one is Running at the origin",
            created.as_secs_f64()
        ),
    );
    let last = until_seen(
        &running_origin,
        "pod-",
        args.pods,
        deadline,
        "pods Running at the origin",
    )
    .await?;
    let offloaded = last.saturating_duration_since(t0);
    let stage = |seen: &FirstSeen| {
        seen.with_prefix("pod-")
            .1
            .map_or(0.0, |at| at.saturating_duration_since(t0).as_secs_f64())
    };
    let stages = [
        ("ShadowPods written", stage(&shadowpods_written)),
        ("provider pods created", stage(&created_provider)),
        ("provider pods scheduled", stage(&scheduled_provider)),
        ("provider pods Running", stage(&running_provider)),
        ("origin pods Running", offloaded.as_secs_f64()),
    ];
    let mut back_under_burst: Vec<Duration> = (0..args.pods)
        .filter_map(|i| {
            let name = pod_name(i);
            Some(
                running_origin
                    .of(&name)?
                    .saturating_duration_since(running_provider.of(&name)?),
            )
        })
        .collect();
    let (burst_p50, burst_p99) = p50_p99(&mut back_under_burst);
    say(
        started,
        &format!(
            "all Running at the origin after {:.1} s; settling 20 s before reading memory",
            offloaded.as_secs_f64()
        ),
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    let rss_after = pids.map(|(_, pid)| rss_bytes(pid));

    let changes = (args.status_rate * args.status_seconds as f64).ceil() as usize;
    let changes = changes.min(args.pods);
    say(
        started,
        &format!(
            "steady: {changes} provider pod status changes at {:.0}/s",
            args.status_rate
        ),
    );
    let restarted_origin = FirstSeen::watch(origin_pods.clone(), restarted).await;
    let pace = Duration::from_secs_f64(1.0 / args.status_rate);
    let start = Instant::now();
    let mut changed_at = Vec::with_capacity(changes);
    for i in 0..changes {
        tokio::time::sleep_until((start + pace.mul_f64(i as f64)).into()).await;
        let name = pod_name(i);
        // As the provider's kubelet would report a restart: merged into the container's
        // status by name.
        let patch = json!({"status": {"containerStatuses": [{"name": "c", "restartCount": 1}]}});
        provider_pods
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .with_context(|| format!("failed to change {name}'s status on the provider"))?;
        changed_at.push((name, Instant::now()));
    }
    let steady_deadline = Instant::now() + Duration::from_secs(60);
    let mut back_steady = Vec::with_capacity(changes);
    for (name, at) in &changed_at {
        let seen = loop {
            if let Some(seen) = restarted_origin.of(name) {
                break seen;
            }
            anyhow::ensure!(
                Instant::now() < steady_deadline,
                "{name}'s restart never reached the origin"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        back_steady.push(seen.saturating_duration_since(*at));
    }
    let (steady_p50, steady_p99) = p50_p99(&mut back_steady);
    // Read again once every change is back: what the changes added shows apart from what
    // idling adds (or gives back).
    let rss_steady = pids.map(|(_, pid)| rss_bytes(pid));
    let rss_idle = if args.idle_seconds > 0 {
        say(
            started,
            &format!("idle {} s before reading memory again", args.idle_seconds),
        );
        tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
        Some(pids.map(|(_, pid)| rss_bytes(pid)))
    } else {
        None
    };

    // What the agents asked of the provider's API server about ShadowPods over the whole run:
    // creates and status writes are the work; anything else (a restore's apply, a relist)
    // answers a change the agents took for someone else's.
    let shadowpod_requests: Vec<(String, f64)> = refract_bench::requests::read(&provider)
        .await
        .into_iter()
        .filter(|(what, _)| what.contains(" shadowpods"))
        .collect();

    // What agent `i` held a pod at `reading`, beyond what it held before the pods.
    let per_pod_at = |reading: &[u64; 2], i: usize| {
        reading[i].saturating_sub(rss_before[i]) as f64 / args.pods as f64
    };
    let per_pod = |i: usize| per_pod_at(&rss_after, i);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "pod-scale-bench: {} pods offloaded through one peering (fake kubelets on the provider)",
        args.pods
    );
    println!("| figure | measured |");
    println!("|---|---|");
    println!(
        "| created at the origin ({} at a time) | {:.1} s |",
        args.parallel,
        created.as_secs_f64()
    );
    println!(
        "| every pod Running at the origin after | **{:.1} s** ({:.0} pods/s) |",
        offloaded.as_secs_f64(),
        args.pods as f64 / offloaded.as_secs_f64()
    );
    let stages_text: Vec<String> = stages
        .iter()
        .map(|(what, at)| format!("{what} {at:.1} s"))
        .collect();
    println!(
        "| the last pod, from the first create: | {} |",
        stages_text.join(", ")
    );
    println!("| status back under the burst (provider Running → origin Running): p50 / p99 | {burst_p50:.0} / {burst_p99:.0} ms |");
    println!("| status back at {:.0} changes/s ({changes} changes): p50 / p99 | {steady_p50:.0} / **{steady_p99:.0} ms** (goal p99 ≤ 1,000) |", args.status_rate);
    for (i, (name, _)) in pids.iter().enumerate() {
        println!(
            "| {name} memory: before / after / per pod | {:.1} / {:.1} MiB / **{:.0} bytes** (goal ≤ 10,000) |",
            mib(rss_before[i]),
            mib(rss_after[i]),
            per_pod(i)
        );
        println!(
            "| {name} memory after the status changes: resident / per pod | {:.1} MiB / **{:.0} bytes** |",
            mib(rss_steady[i]),
            per_pod_at(&rss_steady, i)
        );
        if let Some(idle) = &rss_idle {
            println!(
                "| {name} memory after {} s idle: resident / per pod | {:.1} MiB / **{:.0} bytes** |",
                args.idle_seconds,
                mib(idle[i]),
                per_pod_at(idle, i)
            );
        }
    }
    let requests_text: Vec<String> = shadowpod_requests
        .iter()
        .map(|(what, n)| format!("{what} {n:.0}"))
        .collect();
    println!(
        "| provider requests on ShadowPods over the run | {} |",
        requests_text.join(", ")
    );
    let report = json!({
        "args": {"pods": args.pods, "parallel": args.parallel, "status_rate": args.status_rate,
            "status_seconds": args.status_seconds, "remote_args": args.remote_args},
        "created_seconds": created.as_secs_f64(),
        "offloaded_seconds": offloaded.as_secs_f64(),
        "last_pod_seconds": stages.iter().map(|(what, at)| (what.to_string(), json!(at)))
            .collect::<serde_json::Map<_, _>>(),
        "status_back_under_burst_ms": {"p50": burst_p50, "p99": burst_p99},
        "status_back_steady_ms": {"changes": changes, "p50": steady_p50, "p99": steady_p99},
        "rss_bytes": {"local_agent": [rss_before[0], rss_after[0]],
            "remote_agent": [rss_before[1], rss_after[1]]},
        "bytes_per_pod": {"local_agent": per_pod(0), "remote_agent": per_pod(1)},
        "rss_bytes_after_status_changes": {"local_agent": rss_steady[0],
            "remote_agent": rss_steady[1]},
        "provider_shadowpod_requests": shadowpod_requests.iter()
            .map(|(what, n)| (what.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "rss_bytes_after_idle": rss_idle.map(|idle| json!({"idle_seconds": args.idle_seconds,
            "local_agent": idle[0], "remote_agent": idle[1]})),
    });
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?)?;
    say(started, &format!("wrote {}", args.json.display()));
    Ok(())
}
