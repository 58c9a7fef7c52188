//! Requests of one tenant being applied now, across its streams: a new stream takes its
//! inventory only once the replaced stream's writes have all landed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`InFlight::drained`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// Counts requests under way; clones share the count.
#[derive(Clone, Default, Debug)]
pub struct InFlight(Arc<AtomicUsize>);

/// Counts one request until dropped.
pub struct Started(Arc<AtomicUsize>);

impl Drop for Started {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InFlight {
    /// Counts a request until the returned guard drops.
    pub fn start(&self) -> Started {
        self.0.fetch_add(1, Ordering::AcqRel);
        Started(self.0.clone())
    }

    /// Waits until nothing is under way; `false` if that takes longer than `within`.
    pub async fn drained(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.0.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drains_when_the_last_request_ends() {
        let in_flight = InFlight::default();
        assert!(in_flight.drained(Duration::ZERO).await);
        let started = in_flight.start();
        assert!(!in_flight.drained(Duration::from_millis(50)).await);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.drained(Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(started);
        assert!(waiter.await.unwrap());
    }
}
