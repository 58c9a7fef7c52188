//! `wire-tenants-bench`: one remote agent serving many tenants, each a synthetic origin that
//! speaks the wire itself with a client certificate of its own (issue 53, point 4: "100
//! tenants on one remote agent ... synthetic origins are fine").
//!
//! A provider control plane and the remote agent (release builds, the peering's flags, the
//! per-address connection limit raised: every tenant dials from 127.0.0.1). Each tenant opens
//! one stream, has its twin namespace written, then:
//!
//! - **Burst**: every tenant sends its ConfigMaps at once, one request in flight per tenant,
//!   each answered before the next (the remote agent writes them all the same way a local
//!   agent's would be written). Aggregate throughput and each tenant's completion.
//! - **Steady**: every tenant creates new objects at an even share of a fixed aggregate rate;
//!   each one's latency is from sending it to a provider watch's first sight of it (the
//!   remote agent's answers are held up to its `--ack-linger` to leave together, so they time
//!   the link's batching, not the write). Each tenant's p50 and p99, and fairness: the worst tenant's p99
//!   against the median tenant's (goal: at most 1.5).
//! - **A noisy neighbour**: the same steady load again while one more tenant pipelines a
//!   burst of its own (every request sent without waiting, answers read as they come), over
//!   and over until the window ends. Each quiet tenant's p99 against its own quiet p99 (goal:
//!   no tenant above 2x). The quiet and the noisy windows alternate over `--rounds` rounds, so
//!   that what drifts over a run weighs on both alike; `--noisy-idle` is the control.
//! - The remote agent's resident memory with no tenant, every tenant connected, and every
//!   tenant's objects written: per connected tenant and per object.
//!
//! It starts and stops everything itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use refract_bench::sightings::FirstSeen;
use refract_bench::stats::{ms, percentile};
use refract_e2e::wire::{upsert_message, Wire};
use refract_e2e::{Agent, Peering};
use refract_testkit::procfs::{cpu_seconds, rss_bytes};
use refract_wire::proto::{remote_message, Outcome};
use serde_json::{json, Value};

/// Measures one remote agent serving many synthetic tenants.
#[derive(Debug, Parser)]
#[command(name = "wire-tenants-bench", version)]
struct Args {
    /// Tenants, each with its own certificate and stream.
    #[arg(long, default_value_t = 100)]
    tenants: usize,
    /// ConfigMaps each tenant writes in the burst.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// ConfigMap payload, bytes.
    #[arg(long, default_value_t = 1024)]
    data_bytes: usize,
    /// Aggregate rate of the steady phases, new objects per second over all tenants.
    #[arg(long, default_value_t = 200.0)]
    steady_rate: f64,
    /// Length of each steady phase, seconds (with the default rate, 120 samples a tenant, so
    /// that a tenant's p99 is not simply its slowest request).
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Objects the noisy tenant pipelines during the second steady phase, rewriting them
    /// until it ends (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    noisy_objects: usize,
    /// The steady phases are taken in this many rounds, each a quiet window and a window with
    /// the noisy tenant (order alternating), so that what drifts over the run weighs on both.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// A control run: the noisy tenant connects for its windows but writes nothing, so the
    /// ratios show what the windows move by themselves, without a noisy neighbour.
    #[arg(long)]
    noisy_idle: bool,
    /// An extra flag for the remote agent (repeatable), e.g. `--remote-arg=--apply-concurrency=4`
    /// to compare settings in runs of one build.
    #[arg(long = "remote-arg", allow_hyphen_values = true)]
    remote_args: Vec<String>,
    /// Where etcd keeps its data.
    #[arg(long, default_value = "/dev/shm")]
    etcd_parent: PathBuf,
    /// Where the JSON of the run is written.
    #[arg(long, default_value = "target/bench/wire-tenants.json")]
    json: PathBuf,
}

fn say(message: &str) {
    eprintln!("\x1b[1m[wire-tenants-bench]\x1b[0m {message}");
}

fn tenant_id(n: usize) -> String {
    format!("synthetic-{n:03}")
}

/// The label naming the phase an object was written in (`burst`, `steady`, `noisy`): the
/// steady phase's watch selects its own objects, so the bench does not decode the noisy
/// tenant's 10,000 alongside them, as no quiet tenant's observer would.
const PHASE: &str = "refract-bench/phase";

fn config_map(namespace: &str, name: &str, phase: &str, data_bytes: usize) -> Value {
    let payload = "x".repeat(data_bytes);
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {PHASE: phase}},
        "data": {"payload": payload}})
}

/// Opens tenant `n`'s stream and has its twin namespace written; returns it and the namespace.
async fn open(peering: &Peering, n: usize) -> anyhow::Result<(Wire, String)> {
    let id = tenant_id(n);
    let certs = peering.certs.issue(&id, &id, "client", &[]);
    let mut wire = Wire::open(&peering.remote_addr, "provider", &id, &certs)
        .await
        .with_context(|| format!("tenant {id} cannot connect"))?;
    let namespace = format!("work-{id}");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace,
        "annotations": {"refract.io/original-name": "work"}}});
    expect_written(wire.upsert(&ns).await?, &namespace)?;
    Ok((wire, namespace))
}

fn expect_written(answer: refract_e2e::wire::Answer, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        matches!(answer.outcome, Outcome::Applied | Outcome::Unchanged),
        "{what}: {answer:?}"
    );
    Ok(())
}

/// Writes `objects` ConfigMaps named `<prefix><i>` one after the other, each answered before
/// the next; paced (`Some((pace, phase))`), the first after `phase`, then one each `pace`.
/// When each was sent.
async fn write_all(
    wire: &mut Wire,
    namespace: &str,
    prefix: &str,
    objects: usize,
    data_bytes: usize,
    pace: Option<(Duration, Duration)>,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let mut sent = Vec::with_capacity(objects);
    let start = Instant::now();
    let labelled = if pace.is_some() { "steady" } else { "burst" };
    for i in 0..objects {
        if let Some((pace, phase)) = pace {
            tokio::time::sleep_until((start + phase + pace.mul_f64(i as f64)).into()).await;
        }
        let name = format!("{prefix}{i:05}");
        sent.push((name.clone(), Instant::now()));
        expect_written(
            wire.upsert(&config_map(namespace, &name, labelled, data_bytes))
                .await?,
            &name,
        )?;
    }
    Ok(sent)
}

/// Every tenant creates `objects` new ConfigMaps (`s<round>-<tenant>-<i>`), one each `pace`,
/// the tenants' phases spread evenly over `pace` (all starting together would make the
/// steady load a burst of one request per tenant each `pace`); each request's latency from
/// its sending to the provider watch's first sight of it.
async fn steady(
    tenants: &mut [(Wire, String)],
    seen: &FirstSeen,
    objects: usize,
    data_bytes: usize,
    round: u64,
    pace: Duration,
) -> anyhow::Result<Vec<Vec<Duration>>> {
    let count = tenants.len();
    let sent =
        try_join_all(
            tenants.iter_mut().enumerate().map(|(t, (wire, ns))| {
                let prefix = format!("s{round}-{t:03}-");
                let phase = pace.mul_f64(t as f64 / count as f64);
                async move {
                    write_all(wire, ns, &prefix, objects, data_bytes, Some((pace, phase))).await
                }
            }),
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut latencies = Vec::with_capacity(sent.len());
    for tenant in sent {
        let mut took = Vec::with_capacity(tenant.len());
        for (name, at) in tenant {
            let seen_at = loop {
                if let Some(seen_at) = seen.of(&name) {
                    break seen_at;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "{name} never seen on the provider"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            took.push(seen_at.saturating_duration_since(at));
        }
        took.sort();
        latencies.push(took);
    }
    Ok(latencies)
}

/// Each tenant's p50 and p99 of a steady phase, from sorted samples.
fn per_tenant(samples: &[Vec<Duration>]) -> Vec<(f64, f64)> {
    samples
        .iter()
        .map(|s| (ms(percentile(s, 50.0)), ms(percentile(s, 99.0))))
        .collect()
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What the noisy tenant did: how many writes it had answered, over how long.
struct Noise {
    writes: usize,
    took: Duration,
}

/// The noisy tenant during one window: pipelines its `objects` ConfigMaps, every request sent
/// without waiting and the answers read as they come, and once all are written starts over
/// with each one changed, until `stop` (so every quiet sample of the window is taken under the
/// burst, not only those of its first seconds); then waits for the answers of what it sent,
/// and gives its stream back for the next window. With no objects it writes nothing (the
/// control run).
async fn noisy_burst(
    (mut wire, namespace): (Wire, String),
    objects: usize,
    data_bytes: usize,
    window: u64,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<(Noise, (Wire, String))> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let start = Instant::now();
    let sender = wire.sender();
    let sent = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sending = tokio::spawn({
        let (sent, done) = (sent.clone(), done.clone());
        let namespace = namespace.clone();
        async move {
            // Revisions go on from window to window on the one stream.
            let mut revision = window << 32;
            if objects == 0 {
                // The control: connected, writing nothing.
                stop.cancelled().await;
            } else {
                let writes = (0..).flat_map(|pass| (0..objects).map(move |i| (pass, i)));
                for (pass, i) in writes.take_while(|_| !stop.is_cancelled()) {
                    // A pass's payload differs from the last one's, so each is a real write.
                    let mut cm = config_map(&namespace, &format!("n-{i:05}"), "noisy", data_bytes);
                    cm["data"]["pass"] = json!(format!("{window}-{pass}"));
                    revision += 1;
                    if sender.send(upsert_message(&cm, revision)).await.is_err() {
                        break;
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            }
            done.store(true, Ordering::SeqCst);
        }
    });
    let mut answered = 0;
    while !(done.load(Ordering::SeqCst) && answered >= sent.load(Ordering::SeqCst)) {
        let Ok(message) =
            tokio::time::timeout(Duration::from_millis(100), wire.next_message()).await
        else {
            continue;
        };
        let message = message?.context("the remote agent closed the noisy tenant's stream")?;
        if let Some(remote_message::Kind::Ack(ack)) = message.kind {
            answered += 1;
            let outcome = Outcome::try_from(ack.outcome).unwrap_or(Outcome::Unspecified);
            anyhow::ensure!(
                matches!(outcome, Outcome::Applied | Outcome::Unchanged),
                "the noisy tenant's {} was not written: {outcome:?} {}",
                ack.object.map(|o| o.name).unwrap_or_default(),
                ack.message
            );
        }
    }
    sending.await?;
    Ok((
        Noise {
            writes: answered,
            took: start.elapsed(),
        },
        (wire, namespace),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    refract_bench::set_up_run(&args.etcd_parent)?;

    say("starting the provider (etcd + kube-apiserver 1.20.2) and the remote agent");
    let mut remote_flags = vec!["--max-connections-per-source=1024"];
    remote_flags.extend(args.remote_args.iter().map(String::as_str));
    let mut peering = Peering::start_with_flags(false, &[], &remote_flags).await?;
    if let Some(local) = peering.local.take() {
        local.stop().await;
    }
    let remote = peering
        .remote
        .as_ref()
        .and_then(Agent::pid)
        .context("remote agent not running")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_empty = rss_bytes(remote);

    say(&format!(
        "connecting {} tenants, each with its own certificate",
        args.tenants
    ));
    let mut tenants = Vec::new();
    for n in 1..=args.tenants {
        tenants.push(open(&peering, n).await?);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_connected = rss_bytes(remote);

    let total = args.tenants * args.objects;
    say(&format!(
        "burst: {} ConfigMaps of {} bytes from each tenant ({total} in all)",
        args.objects, args.data_bytes
    ));
    let cpu0 = cpu_seconds(remote);
    let start = Instant::now();
    let done: Vec<f64> = try_join_all(tenants.iter_mut().map(|(wire, ns)| async {
        write_all(wire, ns, "c-", args.objects, args.data_bytes, None).await?;
        anyhow::Ok(start.elapsed().as_secs_f64())
    }))
    .await?;
    let burst_secs = start.elapsed().as_secs_f64();
    let burst_cpu = cpu_seconds(remote) - cpu0;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_full = rss_bytes(remote);

    // Every ConfigMap on the provider, first sightings by name (names are unique across
    // tenants in the steady phases).
    let configmaps: Api<ConfigMap> = Api::all(peering.provider.client().await?);
    let seen = FirstSeen::watch_selected(configmaps, &format!("{PHASE}=steady"), |_| true).await;
    let per_tenant_rate = args.steady_rate / args.tenants as f64;
    let steady_n = (per_tenant_rate * args.steady_seconds as f64).ceil() as usize;
    let pace = Duration::from_secs_f64(1.0 / per_tenant_rate);
    // The quiet and the noisy windows alternate (quiet then noisy, then noisy then quiet, ...),
    // so that what drifts over the run (the provider's objects growing, its compactions)
    // weighs on both alike: in one quiet phase followed by one noisy phase of 240 s, a
    // control run with the noisy tenant writing nothing moved the second phase's p99 7.6x.
    let noisy = args.noisy_objects > 0;
    let rounds = if noisy { args.rounds.max(1) } else { 1 };
    let window_n = steady_n.div_ceil(rounds);
    say(&format!(
        "steady: {:.0} new ConfigMaps/s over all tenants, {} s{}",
        args.steady_rate,
        args.steady_seconds,
        if noisy {
            format!(
                " quiet and {} s while one more tenant pipelines its {} ConfigMaps{}, in {rounds} rounds of alternating windows",
                args.steady_seconds,
                args.noisy_objects,
                if args.noisy_idle { " (control: it writes nothing)" } else { "" }
            )
        } else {
            String::new()
        }
    ));
    let mut noisy_wire = if noisy {
        Some(open(&peering, args.tenants + 1).await?)
    } else {
        None
    };
    let mut quiet: Vec<Vec<Duration>> = vec![Vec::new(); tenants.len()];
    let mut loud: Vec<Vec<Duration>> = vec![Vec::new(); tenants.len()];
    let mut noise_total = Noise {
        writes: 0,
        took: Duration::ZERO,
    };
    let mut steady_cpu = 0.0;
    let mut window = 0u64;
    for round in 0..rounds {
        let noisy_first = round % 2 == 1;
        for noisy_now in [noisy_first, !noisy_first] {
            if noisy_now && !noisy {
                continue;
            }
            window += 1;
            let samples = if noisy_now {
                let stream = noisy_wire.take().context("the noisy tenant's stream")?;
                let stop = tokio_util::sync::CancellationToken::new();
                let writer = tokio::spawn(noisy_burst(
                    stream,
                    if args.noisy_idle {
                        0
                    } else {
                        args.noisy_objects
                    },
                    args.data_bytes,
                    window,
                    stop.clone(),
                ));
                let samples =
                    steady(&mut tenants, &seen, window_n, args.data_bytes, window, pace).await;
                stop.cancel();
                let (noise, wire) = writer.await??;
                noise_total.writes += noise.writes;
                noise_total.took += noise.took;
                noisy_wire = Some(wire);
                samples?
            } else {
                let cpu = cpu_seconds(remote);
                let samples =
                    steady(&mut tenants, &seen, window_n, args.data_bytes, window, pace).await?;
                steady_cpu += cpu_seconds(remote) - cpu;
                samples
            };
            let pool = if noisy_now { &mut loud } else { &mut quiet };
            for (pooled, tenant) in pool.iter_mut().zip(samples) {
                pooled.extend(tenant);
            }
        }
    }
    for pooled in quiet.iter_mut().chain(loud.iter_mut()) {
        pooled.sort();
    }
    let steady_n = window_n * rounds;
    let quiet_figures = per_tenant(&quiet);
    let quiet_p99: Vec<f64> = quiet_figures.iter().map(|f| f.1).collect();
    let all_quiet: Vec<Duration> = {
        let mut all: Vec<Duration> = quiet.iter().flatten().copied().collect();
        all.sort();
        all
    };
    let noisy_result = noisy.then(|| {
        let loud_figures = per_tenant(&loud);
        let ratios: Vec<f64> = loud_figures
            .iter()
            .zip(&quiet_figures)
            .map(|(l, q)| l.1 / q.1)
            .collect();
        (noise_total, loud_figures, ratios)
    });

    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let per_tenant_kib =
        (rss_connected.saturating_sub(rss_empty)) as f64 / 1024.0 / args.tenants as f64;
    let per_object = rss_full.saturating_sub(rss_connected) as f64 / total as f64;
    let fairness = quiet_p99.iter().copied().fold(0.0, f64::max) / median(&quiet_p99);
    println!(
        "wire-tenants-bench: {} tenants × {} ConfigMaps of {} bytes, one remote agent",
        args.tenants, args.objects, args.data_bytes
    );
    println!("| figure | measured |");
    println!("|---|---|");
    println!(
        "| burst: aggregate throughput | {:.0} objects/s ({total} in {burst_secs:.1} s) |",
        total as f64 / burst_secs
    );
    println!(
        "| burst: tenants done after, fastest / median / slowest | {:.1} / {:.1} / {:.1} s |",
        done.iter().copied().fold(f64::MAX, f64::min),
        median(&done),
        done.iter().copied().fold(0.0, f64::max)
    );
    println!(
        "| burst: remote agent CPU per object | {:.3} ms |",
        burst_cpu * 1000.0 / total as f64
    );
    println!(
        "| steady, {:.0}/s in all: p50 / p99 over all tenants | {:.1} / {:.1} ms |",
        args.steady_rate,
        ms(percentile(&all_quiet, 50.0)),
        ms(percentile(&all_quiet, 99.0))
    );
    println!("| steady: p99 per tenant, median / worst | {:.1} / {:.1} ms: fairness **{fairness:.2}** (goal ≤ 1.5) |", median(&quiet_p99), quiet_p99.iter().copied().fold(0.0, f64::max));
    println!(
        "| steady: remote agent CPU per object | {:.3} ms |",
        steady_cpu * 1000.0 / (steady_n * args.tenants) as f64
    );
    println!("| remote agent memory: no tenant / {} connected / {total} objects | {:.1} / {:.1} / {:.1} MiB |", args.tenants, mib(rss_empty), mib(rss_connected), mib(rss_full));
    println!("| remote agent memory per connected tenant / per object | **{per_tenant_kib:.0} KiB** (goal ≤ 400) / **{per_object:.0} bytes** (goal ≤ 4,096) |");
    let mut noisy_json = Value::Null;
    if let Some((noise, loud, ratios)) = &noisy_result {
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        let loud_p99: Vec<f64> = loud.iter().map(|f| f.1).collect();
        println!(
            "| a noisy tenant pipelining its {} ConfigMaps over and over{} | {} writes in {:.1} s ({:.0}/s) |",
            args.noisy_objects,
            if args.noisy_idle { " (control: connected, writing nothing)" } else { "" },
            noise.writes,
            noise.took.as_secs_f64(),
            noise.writes as f64 / noise.took.as_secs_f64()
        );
        println!("| meanwhile, p99 per tenant, median / worst | {:.1} / {:.1} ms (median {:.2}x the quiet phase's) |", median(&loud_p99), loud_p99.iter().copied().fold(0.0, f64::max), median(&loud_p99) / median(&quiet_p99));
        println!("| each quiet tenant's p99 against its own quiet p99: median / 90th percentile / worst | {:.2}x / {:.2}x / **{:.2}x** (goal ≤ 2) |", at(0.5), at(0.9), at(1.0));
        noisy_json = json!({"objects": args.noisy_objects, "idle": args.noisy_idle, "writes": noise.writes,
            "seconds": noise.took.as_secs_f64(),
            "p99_ms_per_tenant": loud_p99, "ratio_to_quiet": ratios});
    }
    let report = json!({
        "args": {"tenants": args.tenants, "objects": args.objects, "data_bytes": args.data_bytes,
            "steady_rate": args.steady_rate, "steady_seconds": args.steady_seconds, "rounds": args.rounds, "noisy_idle": args.noisy_idle,
            "remote_args": args.remote_args},
        "burst": {"seconds": burst_secs, "objects_per_second": total as f64 / burst_secs,
            "tenant_done_seconds": done, "remote_cpu_seconds": burst_cpu},
        "steady": {"p50_p99_ms_per_tenant": quiet_figures, "fairness": fairness,
            "remote_cpu_seconds": steady_cpu},
        "noisy": noisy_json,
        "remote_agent_rss_bytes": {"empty": rss_empty, "connected": rss_connected, "full": rss_full},
    });
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?)?;
    say(&format!("wrote {}", args.json.display()));
    drop(tenants);
    drop(peering);
    Ok(())
}
