//! `refract-bench`: Refract's reflection against two direct copiers, on the same two real
//! control planes, in one run.
//!
//! First both control planes take the largest burst once, untimed ([`warm_up`]). Then the three
//! systems get the same phases ([`phases`]): bursts of ConfigMaps (throughput), updates and
//! no-op touches (writes per effective change), an idle minute (writes and CPU), memory with
//! nothing and with the largest burst reflected, a restart of the origin side (time to agree,
//! writes), a burst of Services. Then more rounds of the bursts ([`throughput`]) and rounds of
//! steady load at half Refract's median throughput of each kind ([`latency`]: ConfigMaps and
//! Services), the systems taking turns in both. Refract runs as
//! its two agent binaries over mutual TLS. The baselines are the same binary, `direct-copier`,
//! which watches the origin and writes Refract's own forged objects straight into the provider
//! with an admin kubeconfig: bare (a floor that keeps none of Refract's guarantees), and
//! guarded (`--guarded`, the Liqo-shaped baseline: what one trusted process costs that watches
//! its copies, restores drift, skips unchanged objects and takes over nothing). It prints one
//! table and writes JSON.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
mod latency;
mod load;
mod measure;
mod phases;
mod report;
mod sides;
mod throughput;
mod warm_up;

use std::path::PathBuf;

use anyhow::Context;
use refract_e2e::Peering;
use serde_json::json;
use sides::Side;

/// Measures Refract against a bare and a guarded direct copier on two local control planes.
#[derive(Debug, clap::Parser)]
#[command(name = "refract-bench", version, about, long_about)]
struct Args {
    /// Burst sizes, ascending; the largest stays reflected for the later phases.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sizes: Vec<usize>,
    /// ConfigMap payload, bytes.
    #[arg(long, default_value_t = 4096)]
    data_bytes: usize,
    /// Concurrency of both systems: Refract's ConfigMap and Service workers and the remote
    /// agent's apply concurrency; the direct copier's writers per kind.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Worker threads of every Rust process of both systems (the agents' --worker-threads,
    /// and the direct copier's).
    #[arg(long, default_value_t = 1)]
    worker_threads: u16,
    /// Length of the idle window, seconds.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Throughput rounds: the bulk phases' bursts are round 1; each further round gives each
    /// system every ConfigMap burst and the Service burst again, alternating which goes
    /// first, with only that system's processes running. The throughput reported is the
    /// median of the rounds: the API servers' CPU per object drifts over minutes, and one
    /// burst per system measures where it happened to fall.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    throughput_rounds: u16,
    /// Length of each steady-load window, seconds.
    #[arg(long, default_value_t = 20)]
    latency_seconds: u64,
    /// Latency rounds. Each round gives each system one window per kind, alternating which
    /// goes first, with only that system's processes running; percentiles are taken over the
    /// samples of every round. One window's p99 is decided by the few API-server pauses that
    /// fall in it: pooled rounds measure the system rather than the pauses.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    rounds: u16,
    /// Seconds of load at the same rate before each window, not measured.
    #[arg(long, default_value_t = 5)]
    warmup_seconds: u64,
    /// Steady-load rate, objects per second (default: half Refract's throughput on the
    /// largest burst, the median of the rounds, used for both systems).
    #[arg(long)]
    steady_rate: Option<f64>,
    /// Services in the Service burst, whose throughput sets the Service steady rate.
    #[arg(long, default_value_t = 1000)]
    service_burst: usize,
    /// Steady-load rate of Services (default: half Refract's Service throughput, the median
    /// of the rounds, used for both systems).
    #[arg(long)]
    steady_rate_service: Option<f64>,
    /// Folder in which both control planes' etcd keep their data. The default, a tmpfs, keeps
    /// the disk out of the comparison: on a virtual disk etcd's fsyncs stall at random (here
    /// up to a second of iowait every few seconds), hitting whichever system is being measured.
    /// Give a folder on disk to measure with it.
    #[arg(long, default_value = "/dev/shm")]
    etcd_parent: PathBuf,
    /// Also write every steady-load object (system, kind, name, wall-clock ms of its origin
    /// write, latency ms) to this file, replacing it, to line the samples up with the agents'
    /// per-object logs (`REFRACT_AGENT_LOG_LEVEL=info,refract::trace=debug`).
    #[arg(long)]
    samples: Option<PathBuf>,
    /// Copy the agents' logs into this folder: `local-agent.log` and `remote-agent.log` after
    /// Refract's phases, `*.round<N>.log` after each of its latency turns (the run's own folder
    /// is removed at the end).
    #[arg(long)]
    keep_logs: Option<PathBuf>,
    /// Measure on fresh control planes: skip the untimed pass of the largest burst and the
    /// Service burst through both clusters that otherwise comes first. Without it, whichever
    /// system runs first (Refract) pays for the clusters' growth.
    #[arg(long)]
    no_warm_up: bool,
    /// Run the copiers' bulk phases (round 1 of the bursts, updates, idle, memory, restart)
    /// before Refract's instead of after. The later rounds rotate the order either way.
    #[arg(long)]
    direct_first: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/results.json")]
    json: PathBuf,
    /// Run both control planes (etcd, kube-apiserver) on these CPUs only, and every other
    /// process of the run (the agents, the direct copier, this benchmark's load and watches) on
    /// --others-cpus: the agents then take no CPU from the API servers, as in a peering whose
    /// agents run on other nodes than its control planes. CPU lists as `taskset` takes them
    /// (`0`, `0-3`, `0,2`). By default every process may run on every CPU.
    #[arg(long, value_name = "CPUS", requires = "others_cpus")]
    control_plane_cpus: Option<String>,
    /// With --control-plane-cpus: the CPUs of every other process of the run.
    #[arg(long, value_name = "CPUS", requires = "control_plane_cpus")]
    others_cpus: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    // Interrupted, the run is dropped: its agents and control planes are stopped and their
    // folders removed (etcd's are in memory by default), instead of left running.
    tokio::select! {
        result = run(args) => return result,
        _ = refract_shared::telemetry::shutdown_signal() => {}
    }
    say("interrupted: the agents and control planes are stopped");
    std::process::exit(130)
}

async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    refract_bench::agents_log_at_info();
    // The agents and the direct copier are built beside this binary.
    if std::env::var_os("REFRACT_BIN_DIR").is_none() {
        let exe = std::env::current_exe()?;
        std::env::set_var("REFRACT_BIN_DIR", exe.parent().context("binary folder")?);
    }
    if let Some(path) = &args.samples {
        // One run's samples per file: the phases append to it.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::File::create(path).with_context(|| format!("failed to create {path:?}"))?;
    }
    // Read by the testkit when it starts etcd.
    std::env::set_var("REFRACT_ETCD_PARENT", &args.etcd_parent);
    let c = args.concurrency.to_string();
    let threads = format!("--worker-threads={}", args.worker_threads);
    let workers = [
        format!("--configmap-reflection-workers={c}"),
        format!("--service-reflection-workers={c}"),
        threads.clone(),
    ];
    let apply = [format!("--apply-concurrency={c}"), threads];
    // The machine's, read before this process is pinned to fewer.
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if let Some(others) = &args.others_cpus {
        // Before anything starts: every process this one starts inherits it, and the control
        // planes are moved to theirs once they run.
        refract_bench::cpus::pin(std::process::id(), others)?;
    }
    say("starting two control planes (etcd + kube-apiserver 1.20.2) and the agent pair");
    let mut peering = Peering::start_with_flags(
        false,
        &workers.iter().map(String::as_str).collect::<Vec<_>>(),
        &apply.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await
    .context("failed to start the peering")?;
    let plan = phases::Plan {
        sizes: args.sizes.clone(),
        data_bytes: args.data_bytes,
        idle: std::time::Duration::from_secs(args.idle_seconds),
        service_burst: args.service_burst,
    };

    let clusters: Vec<(String, u32)> =
        [("origin", &peering.origin), ("provider", &peering.provider)]
            .into_iter()
            .flat_map(|(c, cp)| {
                cp.processes()
                    .into_iter()
                    .map(move |(n, pid)| (format!("{c} {n}"), pid))
            })
            .collect();
    if let Some(cpus) = &args.control_plane_cpus {
        for (_, pid) in &clusters {
            refract_bench::cpus::pin(*pid, cpus)?;
        }
        let mut processes = clusters.clone();
        for (name, agent) in [
            ("local-agent", &peering.local),
            ("remote-agent", &peering.remote),
        ] {
            processes.extend(
                agent
                    .as_ref()
                    .and_then(|a| a.pid())
                    .map(|pid| (name.into(), pid)),
            );
        }
        processes.push(("refract-bench".into(), std::process::id()));
        let allowed: Vec<String> = processes
            .iter()
            .map(|(name, pid)| format!("{name} {}", refract_bench::cpus::allowed(*pid)))
            .collect();
        say(&format!(
            "CPUs each process may use: {}",
            allowed.join(", ")
        ));
    }
    if !args.no_warm_up {
        let (origin, provider) = (
            peering.origin.client().await?,
            peering.provider.client().await?,
        );
        warm_up::run(&origin, &provider, &plan).await?;
    }
    let api_servers = vec![
        ("origin".to_string(), peering.origin.client().await?),
        ("provider".to_string(), peering.provider.client().await?),
    ];
    let mut refract_side = sides::Refract::new(&mut peering).await?;
    // Refract's bulk phases first, or with --direct-first last, its agents paused meanwhile.
    let mut refract = None;
    if args.direct_first {
        refract_side.pause().await;
    } else {
        refract =
            Some(bulk_refract(&args, &mut refract_side, &plan, &clusters, &api_servers).await?);
    }
    let mut copiers = Vec::new();
    for shape in COPIERS {
        let peering = refract_side.peering();
        copiers.push(bulk_direct(shape, &args, peering, &plan, &clusters, &api_servers).await?);
    }
    let mut refract = match refract {
        Some(r) => r,
        None => {
            refract_side.resume().await?;
            bulk_refract(&args, &mut refract_side, &plan, &clusters, &api_servers).await?
        }
    };

    if args.throughput_rounds > 1 {
        say(&format!(
            "== throughput: rounds 2 to {}, the systems taking turns",
            args.throughput_rounds
        ));
    }
    for round in 2..=usize::from(args.throughput_rounds) {
        for system in turns(round, args.direct_first) {
            let Some(i) = system else {
                throughput::take_turn(
                    "refract",
                    &mut refract_side,
                    round,
                    &plan,
                    &clusters,
                    &mut refract,
                )
                .await?;
                continue;
            };
            let (side, result) = &mut copiers[i];
            throughput::take_turn(side.system(), side, round, &plan, &clusters, result).await?;
        }
    }
    // Every system gets the same load: half Refract's throughput (the median of the rounds).
    let rate = args
        .steady_rate
        .unwrap_or_else(|| refract.throughput.last().map_or(1.0, |(_, t)| t / 2.0));
    let rate_service = args
        .steady_rate_service
        .unwrap_or(refract.service_throughput.1 / 2.0);
    for s in std::iter::once(&mut refract).chain(copiers.iter_mut().map(|(_, r)| r)) {
        (s.steady_rate, s.steady_rate_service) = (rate, rate_service);
    }

    say(&format!(
        "== latency: {} rounds, the systems taking turns",
        args.rounds
    ));
    let loads = [
        latency::Load {
            kind: load::SteadyKind::ConfigMap,
            rate,
        },
        latency::Load {
            kind: load::SteadyKind::Service,
            rate: rate_service,
        },
    ];
    let windows = latency::Windows {
        warmup: std::time::Duration::from_secs(args.warmup_seconds),
        steady: std::time::Duration::from_secs(args.latency_seconds),
        data_bytes: args.data_bytes,
        samples: args.samples.clone(),
    };
    for round in 1..=usize::from(args.rounds) {
        for system in turns(round, false) {
            let Some(i) = system else {
                let r = latency::take_turn(
                    "refract",
                    &mut refract_side,
                    round,
                    &loads,
                    &windows,
                    &mut refract.latency,
                )
                .await;
                keep_logs(&args, refract_side.peering(), &format!(".round{round}"))?;
                r?;
                continue;
            };
            let (side, result) = &mut copiers[i];
            latency::take_turn(
                side.system(),
                side,
                round,
                &loads,
                &windows,
                &mut result.latency,
            )
            .await?;
        }
    }

    let baselines: Vec<&report::SystemResult> = copiers.iter().map(|(_, r)| r).collect();
    let table = report::table(&refract, &baselines);
    println!("\n{table}");
    let conditions = json!({
        "sizes": args.sizes,
        "data_bytes": args.data_bytes,
        "service_burst": args.service_burst,
        "concurrency": args.concurrency,
        "refract_workers_per_kind": args.concurrency,
        "remote_apply_concurrency": args.concurrency,
        "direct_writers_per_kind": args.concurrency,
        "guarded_writers_per_kind": args.concurrency,
        "worker_threads_per_process": args.worker_threads,
        // The agents inherit the environment: an opt-in window changes what is measured.
        "local_agent_send_window": std::env::var("REFRACT_SEND_WINDOW").unwrap_or_else(|_| "0ms".into()),
        "remote_agent_ack_linger": std::env::var("REFRACT_ACK_LINGER").unwrap_or_else(|_| "100ms".into()),
        "idle_seconds": args.idle_seconds,
        "latency_seconds": args.latency_seconds,
        "latency_rounds": args.rounds,
        "throughput_rounds": args.throughput_rounds,
        "warmup_seconds": args.warmup_seconds,
        "kubernetes": "1.20.2 (etcd 3.4, loopback)",
        "etcd_data_parent": args.etcd_parent,
        "warm_up": !args.no_warm_up,
        "bulk_phases_first": if args.direct_first { "direct" } else { "refract" },
        "turn_order": "rotating: round r starts with system (r - 1) mod 3 of refract, direct, guarded (shifted by one with --direct-first for the throughput rounds)",
        "refract_version": refract_core::AGENT_VERSION,
        "cores": cores,
        "control_plane_cpus": args.control_plane_cpus,
        "others_cpus": args.others_cpus,
    });
    let out = report::json(conditions, &refract, &baselines);
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&out)? + "\n")?;
    say(&format!("JSON written to {}", args.json.display()));
    Ok(())
}

/// Refract's bulk phases; its agents are stopped afterwards.
async fn bulk_refract(
    args: &Args,
    side: &mut sides::Refract<'_>,
    plan: &phases::Plan,
    clusters: &[(String, u32)],
    api_servers: &[(String, kube::Client)],
) -> anyhow::Result<report::SystemResult> {
    say("== Refract (local-agent -> mTLS gRPC -> remote-agent)");
    let result = phases::run("refract", side, plan, clusters, api_servers).await?;
    side.clean_up().await?;
    keep_logs(args, side.peering(), "")?;
    Ok(result)
}

/// The baselines, in turn order after Refract.
const COPIERS: [sides::Copier; 2] = [sides::Copier::Bare, sides::Copier::Guarded];

/// The order of the systems' turns in `round`: `None` is Refract, `Some(i)` the baseline
/// `COPIERS[i]`. Round 1 starts with Refract (with `copiers_first`, with the bare copier), and
/// each later round starts one system further, so no system always follows the same one.
fn turns(round: usize, copiers_first: bool) -> Vec<Option<usize>> {
    let mut order: Vec<Option<usize>> = std::iter::once(None)
        .chain((0..COPIERS.len()).map(Some))
        .collect();
    let n = order.len();
    order.rotate_left((round + n - 1 + usize::from(copiers_first)) % n);
    order
}

/// Starts a direct copier of `shape` and runs its bulk phases; it is stopped afterwards.
async fn bulk_direct(
    shape: sides::Copier,
    args: &Args,
    peering: &Peering,
    plan: &phases::Plan,
    clusters: &[(String, u32)],
    api_servers: &[(String, kube::Client)],
) -> anyhow::Result<(sides::Direct, report::SystemResult)> {
    say(&match shape {
        sides::Copier::Bare => "== direct copier (watch origin, server-side apply into the provider)".to_string(),
        sides::Copier::Guarded => "== guarded copier (the direct copier with a provider metadata watch, drift restore, hash skip and no takeover)".to_string(),
    });
    let mut side =
        sides::Direct::new(shape, peering, args.concurrency, args.worker_threads).await?;
    let result = phases::run(shape.system(), &mut side, plan, clusters, api_servers).await?;
    side.clean_up().await?;
    Ok((side, result))
}

/// With `--keep-logs`, copies the agents' logs there, named with `suffix`: a restarted agent
/// starts its log afresh.
fn keep_logs(args: &Args, peering: &Peering, suffix: &str) -> anyhow::Result<()> {
    let Some(dir) = &args.keep_logs else {
        return Ok(());
    };
    std::fs::create_dir_all(dir)?;
    for name in ["local-agent", "remote-agent"] {
        let (from, to) = (format!("{name}.log"), format!("{name}{suffix}.log"));
        std::fs::copy(peering.dir.path().join(&from), dir.join(&to))
            .with_context(|| format!("failed to keep {from}"))?;
    }
    say(&format!("agents' logs copied to {}", dir.display()));
    Ok(())
}

/// Progress on stderr, so stdout holds only the table.
pub fn say(message: &str) {
    eprintln!("\x1b[1m[bench]\x1b[0m {message}");
}
