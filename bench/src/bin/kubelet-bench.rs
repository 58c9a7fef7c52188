//! `kubelet-bench`: what the virtual node's kubelet API costs, on two real control planes and a
//! real provider node, in one run.
//!
//! - Time to the first log line (`kubectl logs --tail=1`) and an exec round trip
//!   (`kubectl exec -- true`), through Refract at the origin against the same command run
//!   directly on the provider, taking turns; medians and their ratio.
//! - Reflection latency (ConfigMap created at the origin → seen by a watch on the provider) at a
//!   steady rate, with and without ten concurrent `kubectl logs -f` streams of a chatty pod,
//!   windows taking turns; p50, p99 and their ratio.
//!
//! It starts and stops everything itself (about five minutes).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use refract_bench::sightings::FirstSeen;
use refract_bench::stats::{ms, percentile};
use refract_e2e::{busybox, kubectl_stdin, origin_get, Peering};

/// Measures logs, exec and reflection latency under log streams, through Refract and directly.
#[derive(Debug, Parser)]
#[command(name = "kubelet-bench", version)]
struct Args {
    /// Turns of each command per side.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Concurrent `kubectl logs -f` streams in the loaded windows.
    #[arg(long, default_value_t = 10)]
    streams: usize,
    /// ConfigMaps created per second in the latency windows.
    #[arg(long, default_value_t = 20)]
    rate: u32,
    /// Length of each latency window, seconds.
    #[arg(long, default_value_t = 20)]
    window_seconds: u64,
    /// Latency windows per condition (with and without streams), taking turns.
    #[arg(long, default_value_t = 2)]
    windows: usize,
}

const NS: &str = "bench";
const TWIN: &str = "bench-origin";

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()));
    cmd.args(args);
    cmd
}

/// Wall time from starting `cmd` to the first byte on its stdout (it must print one).
fn time_to_first_byte(mut cmd: Command) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut byte = [0u8; 1];
    let n = child.stdout.take().expect("piped").read(&mut byte)?;
    let elapsed = started.elapsed();
    let _ = child.wait();
    anyhow::ensure!(n == 1, "the command printed nothing");
    Ok(elapsed)
}

/// Wall time of `cmd`, which must succeed.
fn time_to_exit(mut cmd: Command) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    anyhow::ensure!(status.success(), "the command failed: {status}");
    Ok(started.elapsed())
}

/// Runs `measure` alternately through the origin and directly on the provider; medians.
fn compare(
    rounds: usize,
    mut measure: impl FnMut(bool) -> anyhow::Result<Duration>,
) -> anyhow::Result<(Duration, Duration)> {
    let (mut refract, mut direct) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always runs on a warmer machine.
        for through_refract in [round % 2 == 0, round % 2 == 1] {
            let d = measure(through_refract)?;
            if through_refract {
                refract.push(d);
            } else {
                direct.push(d);
            }
        }
    }
    refract.sort();
    direct.sort();
    Ok((percentile(&refract, 50.0), percentile(&direct, 50.0)))
}

/// Creates ConfigMaps at `rate` per second for `seconds`; returns each one's latency.
async fn latency_window(
    origin: &kube::Client,
    seen: &FirstSeen,
    prefix: &str,
    rate: u32,
    seconds: u64,
) -> anyhow::Result<Vec<Duration>> {
    let api: Api<ConfigMap> = Api::namespaced(origin.clone(), NS);
    let count = rate as u64 * seconds;
    let period = Duration::from_secs(1) / rate;
    let mut created = Vec::new();
    let mut tick = tokio::time::interval(period);
    for i in 0..count {
        tick.tick().await;
        let name = format!("{prefix}-{i}");
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            data: Some([("k".to_string(), "v".repeat(512))].into()),
            ..Default::default()
        };
        let at = Instant::now();
        api.create(&PostParams::default(), &cm).await?;
        created.push((name, at));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = { created.iter().all(|(n, _)| seen.of(n).is_some()) };
        if all {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "ConfigMaps of {prefix} did not all arrive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(created
        .iter()
        .map(|(n, at)| {
            seen.of(n)
                .expect("every one seen")
                .saturating_duration_since(*at)
        })
        .collect())
}

fn follow_streams(p: &Peering, n: usize) -> anyhow::Result<Vec<Child>> {
    (0..n)
        .map(|_| {
            Ok(
                kubectl(&p.origin.kubeconfig, &["-n", NS, "logs", "-f", "chatty"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()?,
            )
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    refract_bench::agents_log_at_info();
    eprintln!("[kubelet-bench] starting two control planes, a real provider node and the agents");
    let p = Peering::start_offloading().await?;
    let image = busybox();
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {{name: offloading, namespace: {NS}}}
spec: {{podOffloadingStrategy: Remote}}
---
apiVersion: v1
kind: Pod
metadata: {{name: quiet, namespace: {NS}}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: "{image}", command: ["sh", "-c", "echo ready; exec sleep 3600"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: chatty, namespace: {NS}}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: "{image}", command: ["sh", "-c", "while true; do seq 1 50 | sed 's/^/chatty line padded to about a hundred bytes ........................................ /'; sleep 0.1; done"]}}]
"#
        ),
    );
    let started = Instant::now();
    for pod in ["quiet", "chatty"] {
        loop {
            let phase = origin_get(
                &p,
                &["-n", NS, "pod", pod, "-o", "jsonpath={.status.phase}"],
            );
            if phase.as_deref() == Some("Running") {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(180),
                "pod {pod} not Running"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let (origin_kc, provider_kc) = (p.origin.kubeconfig.clone(), p.provider.kubeconfig.clone());
    let side = |through_refract: bool| {
        if through_refract {
            (&origin_kc, NS)
        } else {
            (&provider_kc, TWIN)
        }
    };

    eprintln!(
        "[kubelet-bench] time to the first log line, {} turns each",
        args.rounds
    );
    let (logs_refract, logs_direct) = compare(args.rounds, |r| {
        let (kc, ns) = side(r);
        time_to_first_byte(kubectl(kc, &["-n", ns, "logs", "--tail=1", "quiet"]))
    })?;
    eprintln!(
        "[kubelet-bench] exec round trip, {} turns each",
        args.rounds
    );
    let (exec_refract, exec_direct) = compare(args.rounds, |r| {
        let (kc, ns) = side(r);
        time_to_exit(kubectl(kc, &["-n", ns, "exec", "quiet", "--", "true"]))
    })?;

    eprintln!(
        "[kubelet-bench] reflection latency at {}/s, {} windows of {}s with and without {} logs -f streams",
        args.rate, args.windows, args.window_seconds, args.streams
    );
    let origin = p.origin.client().await?;
    let seen = FirstSeen::watch(
        Api::<ConfigMap>::namespaced(p.provider.client().await?, TWIN),
        |_| true,
    )
    .await;
    let (mut quiet, mut loaded) = (Vec::new(), Vec::new());
    for window in 0..args.windows * 2 {
        let with_streams = window % 2 == 1;
        let mut followers = if with_streams {
            let f = follow_streams(&p, args.streams)?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            f
        } else {
            Vec::new()
        };
        let lat = latency_window(
            &origin,
            &seen,
            &format!("w{window}"),
            args.rate,
            args.window_seconds,
        )
        .await;
        let open = followers
            .iter_mut()
            .map(|c| c.try_wait())
            .filter(|w| matches!(w, Ok(None)))
            .count();
        for mut c in followers {
            let _ = c.kill();
            let _ = c.wait();
        }
        let lat = lat?;
        if with_streams {
            anyhow::ensure!(
                open == args.streams,
                "only {open} of {} logs -f streams stayed open",
                args.streams
            );
            loaded.extend(lat);
        } else {
            quiet.extend(lat);
        }
    }
    quiet.sort();
    loaded.sort();

    println!();
    println!("| figure | through Refract | direct on the provider | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| time to the first log line (`kubectl logs --tail=1`), median of {} | {:.1} ms | {:.1} ms | {:.2}x |",
        args.rounds,
        ms(logs_refract),
        ms(logs_direct),
        ms(logs_refract) / ms(logs_direct)
    );
    println!(
        "| exec round trip (`kubectl exec -- true`), median of {} | {:.1} ms | {:.1} ms | {:.2}x |",
        args.rounds,
        ms(exec_refract),
        ms(exec_direct),
        ms(exec_refract) / ms(exec_direct)
    );
    println!();
    println!(
        "| reflection latency ({} ConfigMaps each) | without streams | with {} `logs -f` | ratio |",
        quiet.len(),
        args.streams
    );
    println!("|---|---|---|---|");
    for (name, pct) in [("p50", 50.0), ("p99", 99.0)] {
        let (a, b) = (percentile(&quiet, pct), percentile(&loaded, pct));
        println!(
            "| {name} | {:.1} ms | {:.1} ms | {:.2}x |",
            ms(a),
            ms(b),
            ms(b) / ms(a)
        );
    }
    drop(p);
    Ok(())
}
