//! Log lines about what a peer sends, at most one per kind of line per period: a provider that
//! floods the link with bad messages must not flood the logs too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::lock::Locked;

/// Allows one line per key per period and counts the ones it held back.
pub struct Throttle {
    every: Duration,
    state: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl Throttle {
    /// A throttle allowing one line per key every `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::default(),
        }
    }

    /// `Some(lines held back since the last one)` when a line for `key` may be written now.
    pub fn allow(&self, key: &'static str) -> Option<u64> {
        let mut state = self.state.locked();
        let now = Instant::now();
        match state.get_mut(key) {
            Some((last, held)) if now.duration_since(*last) < self.every => {
                *held += 1;
                None
            }
            Some((last, held)) => {
                *last = now;
                Some(std::mem::take(held))
            }
            None => {
                state.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_and_a_count_of_the_rest() {
        let t = Throttle::new(Duration::from_millis(50));
        assert_eq!(t.allow("a"), Some(0));
        assert_eq!(t.allow("a"), None);
        assert_eq!(t.allow("a"), None);
        assert_eq!(t.allow("b"), Some(0));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.allow("a"), Some(2));
    }
}
