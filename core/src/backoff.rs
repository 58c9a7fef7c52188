//! Jittered exponential backoff: reconnects, and retries of a failing object.

use std::time::Duration;

use crate::lock::Locked;

/// Delays that double from `min` to `max`, each drawn uniformly from its upper half, so that
/// many local agents cut off together do not reconnect in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff starting at `min`, capped at `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            current: min,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = ceiling / 2;
        half + half.mul_f64(fastrand::f64())
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// One [`Backoff`] per failing key: each retry of a key waits longer than the last, until the
/// key succeeds. Keys are forgotten on success, so the map holds only what is failing.
pub struct PerKey<K> {
    min: Duration,
    max: Duration,
    failing: std::sync::Mutex<std::collections::HashMap<K, Backoff>>,
}

impl<K: std::hash::Hash + Eq + Clone> PerKey<K> {
    /// Backoffs starting at `min`, capped at `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            failing: Default::default(),
        }
    }

    /// The delay before `key`'s next attempt, after one more failure.
    pub fn failed(&self, key: &K) -> Duration {
        let mut failing = self.failing.locked();
        failing
            .entry(key.clone())
            .or_insert_with(|| Backoff::new(self.min, self.max))
            .next_delay()
    }

    /// `key` succeeded (or went away): its next failure starts over.
    pub fn succeeded(&self, key: &K) {
        self.failing.locked().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_key_backoffs_grow_separately_and_reset() {
        let b = PerKey::new(Duration::from_secs(4), Duration::from_secs(60));
        let first = b.failed(&"a");
        assert!(first <= Duration::from_secs(4));
        let second = b.failed(&"a");
        assert!(second >= Duration::from_secs(4), "{second:?}");
        assert!(
            b.failed(&"b") <= Duration::from_secs(4),
            "another key starts over"
        );
        b.succeeded(&"a");
        assert!(b.failed(&"a") <= Duration::from_secs(4));
    }

    #[test]
    fn grows_within_bounds_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut ceilings = vec![];
        for _ in 0..8 {
            let before = b.current;
            let d = b.next_delay();
            assert!(
                d >= before / 2 && d <= before,
                "{d:?} outside [{:?}, {before:?}]",
                before / 2
            );
            ceilings.push(before);
        }
        assert_eq!(ceilings[0], Duration::from_millis(100));
        assert_eq!(ceilings[1], Duration::from_millis(200));
        assert_eq!(*ceilings.last().unwrap(), Duration::from_secs(1));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
