//! The benchmark's results: one table for people, the same numbers as JSON for machines.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::latency::KindLatency;

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Latency {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
    /// Objects measured.
    pub samples: usize,
}

impl Latency {
    /// Percentiles of `samples` (milliseconds).
    pub fn of(mut samples: Vec<f64>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| {
            samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1]
        };
        Self {
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: *samples.last().expect("not empty"),
            samples: samples.len(),
        }
    }
}

/// Everything measured for one system.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SystemResult {
    /// `refract`, `direct` or `guarded`.
    pub system: String,
    /// Burst size → objects per second, the median of the rounds.
    pub throughput: Vec<(usize, f64)>,
    /// Burst size → objects per second in each throughput round, in round order.
    pub throughput_by_round: Vec<(usize, Vec<f64>)>,
    /// Steady-load latency by kind (`ConfigMap` at half the largest burst's throughput,
    /// `Service` at half the Service burst's), over every round.
    pub latency: BTreeMap<&'static str, KindLatency>,
    /// The steady rate used for ConfigMaps, objects per second.
    pub steady_rate: f64,
    /// Service burst size and Services per second, the median of the rounds.
    pub service_throughput: (usize, f64),
    /// Services per second in each throughput round.
    pub service_throughput_by_round: Vec<f64>,
    /// The steady rate used for Services.
    pub steady_rate_service: f64,
    /// Provider writes during the change phases.
    pub writes: u64,
    /// Effective changes made at the origin during those phases.
    pub effective_changes: u64,
    /// Length of the idle window, seconds.
    pub idle_seconds: u64,
    /// Provider writes during the idle window.
    pub idle_writes: u64,
    /// CPU seconds of the system's processes during the idle window.
    pub idle_cpu_seconds: f64,
    /// Resident memory per process (name, bytes) with nothing reflected.
    pub rss_empty: Vec<(String, u64)>,
    /// Resident memory per process with the largest burst reflected.
    pub rss_full: Vec<(String, u64)>,
    /// Objects reflected when `rss_full` was read.
    pub objects: usize,
    /// CPU seconds of every process during the largest burst of round 1 (the system's own,
    /// both clusters' kube-apiserver and etcd): where the time goes.
    pub burst_cpu: Vec<(String, f64)>,
    /// The same for the largest burst of each throughput round, in round order.
    pub largest_burst_cpu_by_round: Vec<Vec<(String, f64)>>,
    /// The same for the Service burst of each throughput round: Services cost the API servers
    /// more than ConfigMaps, so the agents' share differs.
    pub service_burst_cpu_by_round: Vec<Vec<(String, f64)>>,
    /// Requests each API server served per Service during the Service burst of round 1, by
    /// cluster, verb and resource, and watch events it sent by kind: what a system asks of the
    /// control planes beyond the load itself.
    pub service_burst_requests: Vec<(String, f64)>,
    /// Seconds from restarting the origin-side process until both sides agree again.
    pub reconnect_seconds: f64,
    /// Provider writes caused by that restart.
    pub reconnect_writes: u64,
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl SystemResult {
    /// Records one round's burst of `n` ConfigMaps at `rate`; the reported throughput becomes
    /// the median of the rounds so far.
    pub fn add_burst(&mut self, n: usize, rate: f64) {
        let i = match self.throughput_by_round.iter().position(|(m, _)| *m == n) {
            Some(i) => i,
            None => {
                self.throughput_by_round.push((n, Vec::new()));
                self.throughput.push((n, 0.0));
                self.throughput_by_round.len() - 1
            }
        };
        self.throughput_by_round[i].1.push(rate);
        self.throughput[i].1 = median(&self.throughput_by_round[i].1);
    }

    /// Records one round's Service burst at `rate`, as [`Self::add_burst`] does.
    pub fn add_service_burst(&mut self, rate: f64) {
        self.service_throughput_by_round.push(rate);
        self.service_throughput.1 = median(&self.service_throughput_by_round);
    }

    /// The steady-load latency of `kind` (empty when it was not measured).
    pub fn latency_of(&self, kind: &str) -> KindLatency {
        self.latency.get(kind).cloned().unwrap_or_default()
    }

    /// Provider writes per effective change.
    pub fn amplification(&self) -> f64 {
        self.writes as f64 / self.effective_changes.max(1) as f64
    }

    /// The largest ConfigMap burst size (0 before any burst).
    fn largest_burst(&self) -> usize {
        self.throughput.last().map_or(0, |(n, _)| *n)
    }

    /// CPU milliseconds per object of every process together, in the largest burst of each
    /// round: on a saturated machine, what decides throughput.
    pub fn cpu_ms_per_object_by_round(&self) -> Vec<f64> {
        ms_per_object(&self.largest_burst_cpu_by_round, self.largest_burst())
    }

    /// CPU milliseconds per Service of every process together, in each round's Service burst.
    pub fn service_cpu_ms_per_object_by_round(&self) -> Vec<f64> {
        ms_per_object(&self.service_burst_cpu_by_round, self.service_throughput.0)
    }

    /// Each process's CPU milliseconds per Service in the Service bursts, the median of the
    /// rounds: where a Service's cost goes.
    pub fn service_cpu_ms_per_object_by_process(&self) -> Vec<(String, f64)> {
        let n = self.service_throughput.0.max(1) as f64;
        let Some(first) = self.service_burst_cpu_by_round.first() else {
            return Vec::new();
        };
        first
            .iter()
            .map(|(process, _)| {
                let of_rounds: Vec<f64> = self
                    .service_burst_cpu_by_round
                    .iter()
                    .filter_map(|r| r.iter().find(|(p, _)| p == process))
                    .map(|(_, s)| s * 1000.0 / n)
                    .collect();
                (process.clone(), median(&of_rounds))
            })
            .collect()
    }

    /// Memory growth per reflected object, over all the system's processes.
    pub fn bytes_per_object(&self) -> f64 {
        let sum = |v: &[(String, u64)]| v.iter().map(|(_, b)| *b as f64).sum::<f64>();
        (sum(&self.rss_full) - sum(&self.rss_empty)) / self.objects.max(1) as f64
    }
}

/// Each round's CPU seconds of every process together, as milliseconds per object of `n`.
fn ms_per_object(rounds: &[Vec<(String, f64)>], n: usize) -> Vec<f64> {
    let n = n.max(1) as f64;
    rounds
        .iter()
        .map(|r| r.iter().map(|(_, s)| s).sum::<f64>() * 1000.0 / n)
        .collect()
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// `items`, comma-separated: a table cell holding one value per round or per process.
fn joined(items: impl IntoIterator<Item = String>) -> String {
    items.into_iter().collect::<Vec<_>>().join(", ")
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

/// The table being built: one column per system (Refract first), then Refract's figure over
/// each baseline's where a ratio means something.
struct Table<'a> {
    systems: Vec<&'a SystemResult>,
    rows: Vec<Vec<String>>,
}

impl<'a> Table<'a> {
    fn baselines(&self) -> usize {
        self.systems.len() - 1
    }

    /// A row of one cell per system, with no ratio.
    fn row(&mut self, metric: String, cell: impl Fn(&SystemResult) -> String) {
        let mut cells = vec![metric];
        cells.extend(self.systems.iter().map(|s| cell(s)));
        cells.extend(std::iter::repeat_n(String::new(), self.baselines()));
        self.rows.push(cells);
    }

    /// A row of one figure per system, with `decimals`, and Refract's over each baseline's.
    fn compared(&mut self, metric: String, decimals: usize, value: impl Fn(&SystemResult) -> f64) {
        let values: Vec<f64> = self.systems.iter().map(|s| value(s)).collect();
        let mut cells = vec![metric];
        cells.extend(values.iter().map(|v| format!("{v:.decimals$}")));
        cells.extend(values[1..].iter().map(|b| ratio(values[0], *b)));
        self.rows.push(cells);
    }

    /// A row of Refract's figure over each baseline's, paired round by round: the median and its
    /// 95 % interval ([`paired_ratio`]). Rounds run in rotating order, so the two bursts of a
    /// pair met the clusters at nearly the same time and in either order.
    fn paired(&mut self, metric: String, by_round: impl Fn(&SystemResult) -> Vec<f64>) {
        let refract = by_round(self.systems[0]);
        let mut cells = vec![metric];
        cells.extend(std::iter::repeat_n(String::new(), self.systems.len()));
        for baseline in &self.systems[1..] {
            cells.push(
                paired_ratio(&refract, &by_round(baseline)).map_or("-".into(), |p| {
                    format!(
                        "{:.2} [{:.2}, {:.2}] ({} rounds, {:.0} %)",
                        p.median,
                        p.low,
                        p.high,
                        p.rounds,
                        p.confidence * 100.0
                    )
                }),
            );
        }
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let mut header = vec!["metric".to_string()];
        header.extend(self.systems.iter().map(|s| label(&s.system).to_string()));
        header.extend(
            self.systems[1..]
                .iter()
                .map(|s| format!("refract/{}", s.system)),
        );
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].len())
                    .chain([header[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut out = line(&header);
        let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        out.push_str(&format!("|-{}-|\n", dashes.join("-|-")));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// A system's column heading.
fn label(system: &str) -> &str {
    match system {
        "direct" => "direct copier",
        "guarded" => "guarded copier",
        other => other,
    }
}

/// Refract's figure over a baseline's, paired round by round.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PairedRatio {
    /// The median of the rounds' ratios.
    pub median: f64,
    /// The interval's lower bound.
    pub low: f64,
    /// The interval's upper bound.
    pub high: f64,
    /// The confidence the interval reaches: 95 % needs 6 rounds (the whole range then); 20
    /// rounds give the 6th to the 15th of the sorted ratios at 95.9 %.
    pub confidence: f64,
    /// Rounds paired.
    pub rounds: usize,
}

/// The ratios `refract[i] / baseline[i]` of the rounds both have, their median and 95 %
/// interval; `None` without a round.
pub fn paired_ratio(refract: &[f64], baseline: &[f64]) -> Option<PairedRatio> {
    let ratios: Vec<f64> = refract
        .iter()
        .zip(baseline)
        .filter(|(_, b)| **b > 0.0)
        .map(|(r, b)| r / b)
        .collect();
    let (low, median, high, confidence) = refract_bench::stats::median_interval(&ratios, 0.95)?;
    Some(PairedRatio {
        median,
        low,
        high,
        confidence,
        rounds: ratios.len(),
    })
}

/// The table, as printed and committed in BENCHMARKS.md: Refract, then each baseline.
pub fn table(refract: &SystemResult, baselines: &[&SystemResult]) -> String {
    let mut t = Table {
        systems: std::iter::once(refract)
            .chain(baselines.iter().copied())
            .collect(),
        rows: Vec::new(),
    };
    let rounds = |v: &[f64]| joined(v.iter().map(|t| format!("{t:.0}")));
    for &(n, _) in &refract.throughput {
        let of = move |s: &SystemResult| -> Vec<f64> {
            s.throughput_by_round
                .iter()
                .find(|(m, _)| *m == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        t.compared(
            format!("throughput, burst of {n} ConfigMaps, median of rounds (objects/s)"),
            0,
            |s| {
                s.throughput
                    .iter()
                    .find(|(m, _)| *m == n)
                    .map_or(0.0, |(_, r)| *r)
            },
        );
        t.paired(
            format!("throughput, burst of {n} ConfigMaps, ratio paired by round: median [95 % interval]"),
            of,
        );
        t.row(
            format!("throughput, burst of {n} ConfigMaps, each round (objects/s)"),
            |s| rounds(&of(s)),
        );
    }
    let n = refract.service_throughput.0;
    t.compared(
        format!("throughput, burst of {n} Services, median of rounds (objects/s)"),
        0,
        |s| s.service_throughput.1,
    );
    t.paired(
        format!("throughput, burst of {n} Services, ratio paired by round: median [95 % interval]"),
        |s| s.service_throughput_by_round.clone(),
    );
    t.row(
        format!("throughput, burst of {n} Services, each round (objects/s)"),
        |s| rounds(&s.service_throughput_by_round),
    );
    let ms_each = |values: Vec<f64>| joined(values.iter().map(|ms| format!("{ms:.2}")));
    t.row(
        format!(
            "CPU of all processes per object, {}-object burst, each round (ms)",
            refract.largest_burst()
        ),
        |s| ms_each(s.cpu_ms_per_object_by_round()),
    );
    t.row(
        format!(
            "CPU of all processes per Service, {}-Service burst, each round (ms)",
            refract.service_throughput.0
        ),
        |s| ms_each(s.service_cpu_ms_per_object_by_round()),
    );
    t.row(
        "CPU per Service in the Service bursts by process, median of rounds (ms)".into(),
        |s| {
            joined(
                s.service_cpu_ms_per_object_by_process()
                    .iter()
                    .map(|(p, ms)| format!("{p} {ms:.2}")),
            )
        },
    );
    t.row(
        "API server requests and watch events per Service, round-1 Service burst".into(),
        |s| {
            joined(
                s.service_burst_requests
                    .iter()
                    .map(|(what, per)| format!("{what} {per:.2}")),
            )
        },
    );
    for what in ["ConfigMap", "Service"] {
        type Quantile = fn(&Latency) -> f64;
        let quantiles: [(&str, Quantile); 3] = [
            ("p50", |l| l.p50_ms),
            ("p99", |l| l.p99_ms),
            ("max", |l| l.max_ms),
        ];
        for (q, of) in quantiles {
            t.compared(format!("latency {what} {q} (ms)"), 1, |s| {
                of(&s.latency_of(what).pooled)
            });
        }
        t.row(format!("latency {what} p99 of each round (ms)"), |s| {
            joined(
                s.latency_of(what)
                    .by_round
                    .iter()
                    .map(|l| format!("{:.0}", l.p99_ms)),
            )
        });
        // The system's own processes per steady object: what they cost, and how often they
        // were woken for it. Each: (what, unit, decimals, its total and its split by process).
        type PerObject = fn(&KindLatency) -> (f64, Vec<(String, f64)>);
        let measures: [(&str, &str, usize, PerObject); 2] = [
            ("CPU", " (ms)", 2, |k| {
                (k.cpu_ms_per_object, k.cpu_ms_per_object_by_process.clone())
            }),
            ("wake-ups", "", 1, |k| {
                (
                    k.wakeups_per_object,
                    k.wakeups_per_object_by_process.clone(),
                )
            }),
        ];
        for (measure, unit, decimals, of) in measures {
            t.compared(
                format!("{measure} of the system's processes per steady {what}{unit}"),
                decimals,
                |s| of(&s.latency_of(what)).0,
            );
            t.row(
                format!("the same by process, per steady {what}{unit}"),
                |s| {
                    joined(
                        of(&s.latency_of(what))
                            .1
                            .iter()
                            .map(|(p, v)| format!("{p} {v:.decimals$}")),
                    )
                },
            );
        }
    }
    t.row(
        "steady rate for ConfigMap latency, every system (objects/s)".into(),
        |s| format!("{:.0}", s.steady_rate),
    );
    t.row(
        "steady rate for Service latency, every system (objects/s)".into(),
        |s| format!("{:.0}", s.steady_rate_service),
    );
    t.row("provider writes per effective change".into(), |s| {
        format!(
            "{:.2} ({}/{})",
            s.amplification(),
            s.writes,
            s.effective_changes
        )
    });
    t.row(
        format!(
            "idle {} s with {} objects: provider writes",
            refract.idle_seconds, refract.objects
        ),
        |s| s.idle_writes.to_string(),
    );
    t.row(
        format!(
            "idle {} s: CPU seconds of the system's processes",
            refract.idle_seconds
        ),
        |s| format!("{:.2}", s.idle_cpu_seconds),
    );
    let procs = |v: &[(String, u64)]| joined(v.iter().map(|(n, b)| format!("{n} {}", mib(*b))));
    t.row("resident memory, nothing reflected".into(), |s| {
        procs(&s.rss_empty)
    });
    t.row(
        format!("resident memory, {} objects", refract.objects),
        |s| procs(&s.rss_full),
    );
    t.row(
        "memory per reflected object (bytes, all processes)".into(),
        |s| format!("{:.0}", s.bytes_per_object()),
    );
    t.compared(
        "restart of the origin side: seconds until in agreement".into(),
        2,
        |s| s.reconnect_seconds,
    );
    t.row("restart of the origin side: provider writes".into(), |s| {
        s.reconnect_writes.to_string()
    });
    t.row(
        format!(
            "CPU seconds during the {}-object burst of round 1, by process",
            refract.largest_burst()
        ),
        |s| {
            joined(
                s.burst_cpu
                    .iter()
                    .filter(|(_, c)| *c >= 0.05)
                    .map(|(n, c)| format!("{n} {c:.1}")),
            )
        },
    );
    t.render()
}

/// The same results as JSON, with the conditions they were measured under.
pub fn json(conditions: Value, refract: &SystemResult, baselines: &[&SystemResult]) -> Value {
    let over = |base: &SystemResult| {
        let lat = |kind: &str, q: fn(&Latency) -> f64| {
            q(&refract.latency_of(kind).pooled) / q(&base.latency_of(kind).pooled)
        };
        let steady = |kind: &str, q: fn(&KindLatency) -> f64| {
            q(&refract.latency_of(kind)) / q(&base.latency_of(kind))
        };
        json!({
            "throughput": refract.throughput.iter().zip(&base.throughput)
                .map(|((n, r), (_, d))| json!({"n": n, "ratio": r / d})).collect::<Vec<_>>(),
            "throughput_paired": refract.throughput_by_round.iter().zip(&base.throughput_by_round)
                .map(|((n, r), (_, d))| json!({"n": n, "ratio": paired_ratio(r, d)}))
                .collect::<Vec<_>>(),
            "service_throughput": refract.service_throughput.1 / base.service_throughput.1,
            "service_throughput_paired": paired_ratio(
                &refract.service_throughput_by_round,
                &base.service_throughput_by_round,
            ),
            "latency_configmap_p50": lat("ConfigMap", |l| l.p50_ms),
            "latency_configmap_p99": lat("ConfigMap", |l| l.p99_ms),
            "latency_service_p50": lat("Service", |l| l.p50_ms),
            "latency_service_p99": lat("Service", |l| l.p99_ms),
            "cpu_per_steady_configmap": steady("ConfigMap", |k| k.cpu_ms_per_object),
            "cpu_per_steady_service": steady("Service", |k| k.cpu_ms_per_object),
            "wakeups_per_steady_configmap": steady("ConfigMap", |k| k.wakeups_per_object),
            "wakeups_per_steady_service": steady("Service", |k| k.wakeups_per_object),
        })
    };
    let with_derived = |s: &SystemResult| {
        let mut v = serde_json::to_value(s).expect("serializes");
        v["writes_per_effective_change"] = json!(s.amplification());
        v["bytes_per_object"] = json!(s.bytes_per_object());
        v["cpu_ms_per_object_by_round"] = json!(s.cpu_ms_per_object_by_round());
        v["service_cpu_ms_per_object_by_round"] = json!(s.service_cpu_ms_per_object_by_round());
        v["service_cpu_ms_per_object_by_process"] = json!(s.service_cpu_ms_per_object_by_process());
        v
    };
    let mut out = json!({
        "conditions": conditions,
        "refract": with_derived(refract),
    });
    for base in baselines {
        out[base.system.as_str()] = with_derived(base);
        out[format!("refract_over_{}", base.system)] = over(base);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn throughput_is_the_median_of_each_size_rounds() {
        let mut r = SystemResult::default();
        for (n, rate) in [(1000, 500.0), (10000, 400.0), (1000, 300.0), (10000, 450.0)] {
            r.add_burst(n, rate);
        }
        r.add_burst(1000, 700.0);
        assert_eq!(r.throughput, vec![(1000, 500.0), (10000, 425.0)]);
        assert_eq!(
            r.throughput_by_round,
            vec![
                (1000, vec![500.0, 300.0, 700.0]),
                (10000, vec![400.0, 450.0])
            ]
        );
        for rate in [200.0, 100.0, 300.0] {
            r.add_service_burst(rate);
        }
        assert_eq!(r.service_throughput.1, 200.0);
        assert_eq!(r.service_throughput_by_round, vec![200.0, 100.0, 300.0]);
    }

    #[test]
    fn cpu_per_object_sums_every_process_of_each_round() {
        let mut r = SystemResult::default();
        r.add_burst(10000, 400.0);
        r.largest_burst_cpu_by_round = vec![
            vec![("a".into(), 10.0), ("b".into(), 20.0)],
            vec![("a".into(), 15.0), ("b".into(), 25.0)],
        ];
        assert_eq!(r.cpu_ms_per_object_by_round(), vec![3.0, 4.0]);
    }

    #[test]
    fn the_table_gives_cpu_and_wake_ups_per_steady_object_with_their_split() {
        let system = |cpu: Vec<(&str, f64)>, wakeups: Vec<(&str, f64)>| {
            let mut kind = KindLatency::default();
            let owned = |v: &[(&str, f64)]| -> Vec<(String, f64)> {
                v.iter().map(|(p, x)| (p.to_string(), *x)).collect()
            };
            kind.cpu_ms_per_object = cpu.iter().map(|(_, x)| x).sum();
            kind.cpu_ms_per_object_by_process = owned(&cpu);
            kind.wakeups_per_object = wakeups.iter().map(|(_, x)| x).sum();
            kind.wakeups_per_object_by_process = owned(&wakeups);
            let mut r = SystemResult::default();
            r.latency.insert("ConfigMap", kind);
            r
        };
        let refract = system(
            vec![("local-agent", 0.29), ("remote-agent", 0.43)],
            vec![("local-agent", 1.28), ("remote-agent", 2.47)],
        );
        let direct = system(vec![("direct-copier", 0.29)], vec![("direct-copier", 2.2)]);
        let table = table(&refract, &[&direct]);
        let cells = |metric: &str| -> Vec<String> {
            let row: Vec<String> = table
                .lines()
                .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
                .find(|cells: &Vec<String>| cells.get(1).is_some_and(|c| c == metric))
                .unwrap_or_else(|| panic!("no row {metric:?} in\n{table}"));
            row.into_iter().skip(2).filter(|c| !c.is_empty()).collect()
        };
        assert_eq!(
            cells("CPU of the system's processes per steady ConfigMap (ms)"),
            ["0.72", "0.29", "2.48"]
        );
        assert_eq!(
            cells("the same by process, per steady ConfigMap (ms)"),
            ["local-agent 0.29, remote-agent 0.43", "direct-copier 0.29"]
        );
        assert_eq!(
            cells("wake-ups of the system's processes per steady ConfigMap"),
            ["3.8", "2.2", "1.70"]
        );
        assert_eq!(
            cells("the same by process, per steady ConfigMap"),
            ["local-agent 1.3, remote-agent 2.5", "direct-copier 2.2"]
        );
    }

    #[test]
    fn paired_ratios_give_a_median_and_its_interval_for_each_baseline() {
        let rounds = |rates: &[f64]| {
            let mut r = SystemResult::default();
            for rate in rates {
                r.add_service_burst(*rate);
            }
            r
        };
        let mut refract = rounds(&[100.0, 100.0, 100.0, 100.0, 100.0]);
        refract.system = "refract".into();
        let mut direct = rounds(&[50.0, 100.0, 200.0, 100.0, 80.0]);
        direct.system = "direct".into();
        let p = paired_ratio(
            &refract.service_throughput_by_round,
            &direct.service_throughput_by_round,
        )
        .unwrap();
        assert_eq!((p.low, p.median, p.high, p.rounds), (0.5, 1.0, 2.0, 5));
        let mut guarded = rounds(&[100.0; 5]);
        guarded.system = "guarded".into();
        let table = table(&refract, &[&direct, &guarded]);
        let header = table.lines().next().unwrap();
        assert!(
            header.contains("refract/direct") && header.contains("refract/guarded"),
            "{header}"
        );
        let row = table
            .lines()
            .find(|l| l.contains("Services, ratio paired by round"))
            .unwrap();
        assert!(row.contains("1.00 [0.50, 2.00] (5 rounds, 94 %)"), "{row}");
        assert!(row.contains("1.00 [1.00, 1.00] (5 rounds, 94 %)"), "{row}");
    }

    #[test]
    fn service_cpu_is_per_service_by_round_and_the_median_by_process() {
        let mut r = SystemResult::default();
        r.service_throughput.0 = 1000;
        r.service_burst_cpu_by_round = vec![
            vec![("a".into(), 1.0), ("b".into(), 2.0)],
            vec![("a".into(), 3.0), ("b".into(), 1.0)],
            vec![("a".into(), 2.0), ("b".into(), 4.0)],
        ];
        assert_eq!(r.service_cpu_ms_per_object_by_round(), vec![3.0, 4.0, 6.0]);
        assert_eq!(
            r.service_cpu_ms_per_object_by_process(),
            vec![("a".into(), 2.0), ("b".into(), 2.0)]
        );
    }
}
