//! Cumulative CPU time from CPU rates.
//!
//! `metrics.k8s.io` reports each container's CPU as a rate over a window. The virtual node's
//! `/metrics/resource` serves `container_cpu_usage_seconds_total`, a counter from which the
//! origin's metrics-server computes a rate again, so the counter is rebuilt here: each new
//! sample adds its rate times the time since the previous one. It only grows, and a sample no
//! newer than the last adds nothing.

use std::collections::HashMap;

/// Which container a counter belongs to: tenant, namespace, pod, container.
pub type Key = (String, String, String, String);

const NANOS_PER_SECOND: u128 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Counter {
    at_nanos: i64,
    core_nanos: u64,
}

/// The counters of every container seen, per tenant.
#[derive(Debug, Default)]
pub struct CpuCounters {
    counters: HashMap<Key, Counter>,
}

impl CpuCounters {
    /// Adds a sample of `nano_cores` measured over `window_nanos` ending at `at_nanos`, and
    /// returns the container's cumulative core-nanoseconds. A container's first sample counts
    /// its window; later ones the time since the previous sample.
    pub fn advance(&mut self, key: Key, at_nanos: i64, window_nanos: i64, nano_cores: u64) -> u64 {
        let used = |nanos: i64| -> u64 {
            let nanos = u128::try_from(nanos.max(0)).unwrap_or_default();
            u64::try_from(u128::from(nano_cores) * nanos / NANOS_PER_SECOND).unwrap_or(u64::MAX)
        };
        let counter = match self.counters.get(&key) {
            None => Counter {
                at_nanos,
                core_nanos: used(window_nanos),
            },
            Some(last) if at_nanos > last.at_nanos => Counter {
                at_nanos,
                core_nanos: last
                    .core_nanos
                    .saturating_add(used(at_nanos - last.at_nanos)),
            },
            Some(last) => *last,
        };
        self.counters.insert(key, counter);
        counter.core_nanos
    }

    /// Forgets the tenant's containers that are not in `seen` (their pods are gone).
    pub fn keep_only(&mut self, tenant: &str, seen: &std::collections::HashSet<Key>) {
        self.counters
            .retain(|key, _| key.0 != tenant || seen.contains(key));
    }

    /// How many containers are counted.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.counters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, container: &str) -> Key {
        (tenant.into(), "ns".into(), "pod".into(), container.into())
    }

    const SECOND: i64 = 1_000_000_000;

    #[test]
    fn a_steady_rate_gives_a_counter_whose_rate_is_that_rate() {
        let mut counters = CpuCounters::default();
        // Half a core, sampled every 15 s over a 10 s window.
        let first = counters.advance(key("a", "c"), 100 * SECOND, 10 * SECOND, 500_000_000);
        assert_eq!(first, 5 * SECOND as u64);
        let second = counters.advance(key("a", "c"), 115 * SECOND, 10 * SECOND, 500_000_000);
        assert_eq!(second - first, 7_500_000_000);
        // What the origin's metrics-server computes from two scrapes: back to half a core.
        let rate = (second - first) as f64 / 15.0 / 1e9;
        assert!((rate - 0.5).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn the_same_or_an_older_sample_adds_nothing() {
        let mut counters = CpuCounters::default();
        let first = counters.advance(key("a", "c"), 100 * SECOND, 10 * SECOND, 1_000_000_000);
        assert_eq!(
            counters.advance(key("a", "c"), 100 * SECOND, 10 * SECOND, 1_000_000_000),
            first
        );
        assert_eq!(
            counters.advance(key("a", "c"), 90 * SECOND, 10 * SECOND, 9_000_000_000),
            first
        );
    }

    #[test]
    fn huge_rates_saturate_instead_of_wrapping() {
        let mut counters = CpuCounters::default();
        counters.advance(key("a", "c"), 0, SECOND, u64::MAX);
        assert_eq!(
            counters.advance(key("a", "c"), i64::MAX, SECOND, u64::MAX),
            u64::MAX
        );
    }

    #[test]
    fn forgetting_one_tenant_keeps_the_others() {
        let mut counters = CpuCounters::default();
        counters.advance(key("a", "gone"), SECOND, SECOND, 1);
        counters.advance(key("a", "kept"), SECOND, SECOND, 1);
        counters.advance(key("b", "gone"), SECOND, SECOND, 1);
        let seen = [key("a", "kept")].into_iter().collect();
        counters.keep_only("a", &seen);
        assert_eq!(counters.len(), 2);
        assert_eq!(counters.advance(key("b", "gone"), SECOND, SECOND, 5), 1);
    }
}
