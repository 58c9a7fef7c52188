//! Latency under steady load, in rounds that alternate the two systems on the same clusters.
//!
//! One 30 s window per system (runs 1–10 of `BENCHMARKS.md`) gave p99s that moved by several
//! times from run to run: a p99 of one window is decided by the few API-server pauses that
//! happen to fall in it, and the two systems' windows were minutes apart, on clusters in
//! different states (etcd's size, the API servers' heaps, what the other system left behind).
//! Here each system gets several shorter windows, alternating (R D, D R, R D, …), only its own
//! processes running during its turn; the samples of all its windows are pooled. Each round's
//! own percentiles are kept too, so the spread stays visible.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use refract_bench::procfs::Usage;

use crate::load::{self, SteadyKind};
use crate::measure::ProviderWatch;
use crate::phases::PATIENCE;
use crate::report::Latency;
use crate::say;
use crate::sides::Side;

/// Latency above which a sample is counted in the slow-samples timeline.
const SLOW_MS: f64 = 100.0;

/// The steady load of one kind.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// What is created.
    pub kind: SteadyKind,
    /// Objects per second.
    pub rate: f64,
}

impl Load {
    /// The Kubernetes kind the provider watch reports.
    pub fn k8s_kind(&self) -> &'static str {
        match self.kind {
            SteadyKind::ConfigMap => "ConfigMap",
            SteadyKind::Service => "Service",
        }
    }

    fn prefix(&self, round: usize) -> String {
        match self.kind {
            SteadyKind::ConfigMap => format!("lat-cm-r{round}-"),
            SteadyKind::Service => format!("lat-svc-r{round}-"),
        }
    }
}

/// The length of every window.
#[derive(Debug, Clone)]
pub struct Windows {
    /// Load before each window, not measured.
    pub warmup: Duration,
    /// Each measured window.
    pub steady: Duration,
    /// ConfigMap payload, bytes.
    pub data_bytes: usize,
    /// Where to append each sample, if anywhere.
    pub samples: Option<PathBuf>,
}

/// One kind's latency for one system, over every round.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KindLatency {
    /// Percentiles of the pooled samples of every round.
    pub pooled: Latency,
    /// Percentiles of each round's window, in round order.
    pub by_round: Vec<Latency>,
    /// The rate used, objects per second.
    pub rate: f64,
    /// CPU seconds of the system's own processes per object, over the windows and their
    /// warm-ups (milliseconds): what each object costs the system under this load.
    pub cpu_ms_per_object: f64,
    /// The same by process: (name, milliseconds per object), to say which process the cost
    /// is in.
    pub cpu_ms_per_object_by_process: Vec<(String, f64)>,
    /// Wake-ups of the system's own processes per object over the same time (voluntary
    /// context switches, see `procfs::wakeups`): how many times an object made a process
    /// wait and be woken, which is where a message's cost goes that no function shows.
    pub wakeups_per_object: f64,
    /// The same by process: (name, wake-ups per object).
    pub wakeups_per_object_by_process: Vec<(String, f64)>,
    /// Per round: (second of the window, samples above 100 ms sent in it).
    pub slow_by_second: Vec<Vec<(u64, usize)>>,
    #[serde(skip)]
    all: Vec<f64>,
    #[serde(skip)]
    usage_by_process: BTreeMap<String, Usage>,
    #[serde(skip)]
    objects: usize,
}

impl KindLatency {
    fn add(&mut self, window: WindowResult) {
        self.by_round.push(window.latency);
        self.all.extend(window.latencies);
        self.pooled = Latency::of(self.all.clone());
        self.objects += window.objects;
        for (process, used) in window.usage_by_process {
            *self.usage_by_process.entry(process).or_default() += used;
        }
        let objects = self.objects.max(1) as f64;
        let per_object = |of: fn(&Usage) -> f64| {
            let by_process: Vec<(String, f64)> = self
                .usage_by_process
                .iter()
                .map(|(p, used)| (p.clone(), of(used) / objects))
                .collect();
            (by_process.iter().map(|(_, v)| v).sum(), by_process)
        };
        (self.cpu_ms_per_object, self.cpu_ms_per_object_by_process) =
            per_object(|u| u.cpu_seconds * 1000.0);
        (self.wakeups_per_object, self.wakeups_per_object_by_process) =
            per_object(|u| u.wakeups as f64);
        self.slow_by_second.push(window.slow_by_second);
    }
}

struct WindowResult {
    latency: Latency,
    latencies: Vec<f64>,
    slow_by_second: Vec<(u64, usize)>,
    usage_by_process: Vec<(String, Usage)>,
    objects: usize,
}

/// CPU below which a system counts as idle: 2 % of a core.
const IDLE_CPU_SECONDS_PER_SECOND: f64 = 0.02;
/// How long a system may take to become idle after it starts.
const SETTLE_PATIENCE: Duration = Duration::from_secs(60);

/// One system's turn in round `round`: its processes started and idle, then each load in
/// turn, one window each, added to `into`, then its processes stopped (also when the turn
/// failed).
pub async fn take_turn(
    name: &str,
    side: &mut impl Side,
    round: usize,
    loads: &[Load],
    windows: &Windows,
    into: &mut BTreeMap<&'static str, KindLatency>,
) -> anyhow::Result<()> {
    in_turn(name, side, async |side| {
        for load in loads {
            let result = window(name, side, round, *load, windows).await?;
            let entry = into.entry(load.k8s_kind()).or_default();
            entry.rate = load.rate;
            entry.add(result);
        }
        Ok(())
    })
    .await
}

/// Runs `turn` with the system's processes started and idle, then stops them (also when the
/// turn failed): one system's turn in a round, with the other's processes stopped.
pub async fn in_turn<S: Side>(
    name: &str,
    side: &mut S,
    turn: impl AsyncFnOnce(&mut S) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    side.resume().await?;
    settle(name, side).await;
    let result = turn(side).await;
    side.pause().await;
    result
}

async fn window(
    name: &str,
    side: &mut impl Side,
    round: usize,
    load: Load,
    w: &Windows,
) -> anyhow::Result<WindowResult> {
    let (kind, prefix) = (load.k8s_kind(), load.prefix(round));
    say(&format!(
        "{name}, round {round}: {kind}s at {:.0}/s for {:?} (the first {:?} not measured)",
        load.rate,
        w.warmup + w.steady,
        w.warmup
    ));
    let before = side.usage_by_process();
    // One continuous load; its first seconds only drain what the previous phase left behind
    // in the API servers, so they are not counted.
    let measured_from = Instant::now() + w.warmup;
    let sent = load::steady(
        side.origin(),
        side.origin_ns(),
        load.kind,
        &prefix,
        load.rate,
        w.warmup + w.steady,
        w.data_bytes,
    )
    .await?;
    let watch = side.watch().clone();
    watch
        .until(PATIENCE, "every steady object on the provider", |w| {
            w.present(kind, &prefix) >= sent.len()
        })
        .await?;
    // Each process is matched by name: a system's processes are the same for the window.
    let usage_by_process: Vec<(String, Usage)> = side
        .usage_by_process()
        .into_iter()
        .map(|(name, after)| {
            let before = before
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(Usage::default(), |(_, used)| *used);
            (name, after.since(before))
        })
        .collect();
    let per_object = |v: f64| v / sent.len().max(1) as f64;
    let mut total = Usage::default();
    for (_, used) in &usage_by_process {
        total += *used;
    }
    let timed: Vec<(Instant, f64)> = sent
        .iter()
        .filter(|(_, at)| *at >= measured_from)
        .filter_map(|(n, at)| {
            watch.first_seen(kind, n).map(|seen| {
                let ms = seen.saturating_duration_since(*at).as_secs_f64() * 1000.0;
                (*at, ms)
            })
        })
        .collect();
    if let Some(path) = &w.samples {
        dump_samples(path, name, kind, &sent, &watch)?;
    }
    // When the slow ones were sent: one stall, or a tail spread over the window.
    let first = timed.iter().map(|(at, _)| *at).min();
    let mut slow = BTreeMap::<u64, usize>::new();
    for (at, ms) in &timed {
        if *ms > SLOW_MS {
            let second = first.map_or(0, |f| at.saturating_duration_since(f).as_secs());
            *slow.entry(second).or_default() += 1;
        }
    }
    let latencies: Vec<f64> = timed.into_iter().map(|(_, ms)| ms).collect();
    let l = Latency::of(latencies.clone());
    say(&format!(
        "{name}, round {round}: {kind} latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.2} ms of CPU and {:.1} wake-ups per object ({})",
        l.p50_ms,
        l.p99_ms,
        l.max_ms,
        per_object(total.cpu_seconds * 1000.0),
        per_object(total.wakeups as f64),
        usage_by_process
            .iter()
            .map(|(p, u)| format!(
                "{p} {:.2} ms, {:.1}",
                per_object(u.cpu_seconds * 1000.0),
                per_object(u.wakeups as f64)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    Ok(WindowResult {
        latency: l,
        latencies,
        slow_by_second: slow.into_iter().collect(),
        usage_by_process,
        objects: sent.len(),
    })
}

/// Waits until the system's processes are idle. A system that has just started still lists,
/// resyncs and collects for a while after it first agrees with the provider (Refract's remote
/// agent lists each kind for its store and for the orphan collection): measured during that,
/// its first seconds would show its start-up, not its steady state.
async fn settle(name: &str, side: &impl Side) {
    let started = Instant::now();
    let mut before = side.cpu_seconds();
    while started.elapsed() < SETTLE_PATIENCE {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = side.cpu_seconds();
        if now - before < IDLE_CPU_SECONDS_PER_SECOND {
            say(&format!(
                "{name}: idle {:.0} s after it agreed with the provider",
                started.elapsed().as_secs_f64()
            ));
            return;
        }
        before = now;
    }
    say(&format!(
        "{name}: still busy after {SETTLE_PATIENCE:?}; measuring anyway"
    ));
}

/// Appends each steady-load object (system, kind, name, wall-clock ms of its origin write,
/// latency ms) to `path`, to line the samples up with the agents' per-object trace logs.
fn dump_samples(
    path: &std::path::Path,
    system: &str,
    kind: &str,
    sent: &[(String, Instant)],
    watch: &ProviderWatch,
) -> anyhow::Result<()> {
    use std::io::Write;
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("failed to open {path:?}"))?;
    for (name, at) in sent {
        let written = wall - now.saturating_duration_since(*at);
        let unix_ms = written
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0;
        let latency = watch.first_seen(kind, name).map_or(f64::NAN, |seen| {
            seen.saturating_duration_since(*at).as_secs_f64() * 1000.0
        });
        writeln!(out, "{system} {kind} {name} {unix_ms:.1} {latency:.1}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(objects: usize, used: &[(&str, f64, u64)]) -> WindowResult {
        WindowResult {
            latency: Latency::default(),
            latencies: vec![10.0; objects],
            slow_by_second: Vec::new(),
            usage_by_process: used
                .iter()
                .map(|(p, cpu_seconds, wakeups)| {
                    let usage = Usage {
                        cpu_seconds: *cpu_seconds,
                        wakeups: *wakeups,
                    };
                    (p.to_string(), usage)
                })
                .collect(),
            objects,
        }
    }

    #[test]
    fn cpu_and_wake_ups_per_object_are_summed_over_windows_and_processes() {
        let mut kind = KindLatency::default();
        kind.add(window(100, &[("local", 0.02, 300), ("remote", 0.04, 500)]));
        kind.add(window(300, &[("local", 0.06, 900), ("remote", 0.04, 700)]));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // 400 objects: local 0.08 s and 1,200 wake-ups, remote 0.08 s and 1,200.
        assert!(close(kind.cpu_ms_per_object, 0.4), "{kind:?}");
        assert!(close(kind.wakeups_per_object, 6.0), "{kind:?}");
        let by_process: Vec<(&str, f64, f64)> = kind
            .cpu_ms_per_object_by_process
            .iter()
            .zip(&kind.wakeups_per_object_by_process)
            .map(|((p, ms), (_, n))| (p.as_str(), *ms, *n))
            .collect();
        assert_eq!(by_process.len(), 2);
        for (p, ms, n) in by_process {
            assert!(close(ms, 0.2) && close(n, 3.0), "{p}: {ms} ms, {n}");
        }
    }
}
