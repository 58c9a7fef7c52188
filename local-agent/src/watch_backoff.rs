//! How the origin watches retry after an error.
//!
//! kube-runtime's default waits up to 30 s between attempts; the origin's API server is this
//! agent's own cluster's, and a watch that resumes 30 s after it came back delays every change
//! made meanwhile by as much (a relist after `410 Gone` included). Origin watches retry
//! between 0.5 and 5 s instead, jittered so that the agent's watches do not retry in step.

use std::time::Duration;

use refract_core::backoff::Backoff;

/// The first retry waits up to this long.
const MIN: Duration = Duration::from_millis(500);
/// No retry waits longer than this.
const MAX: Duration = Duration::from_secs(5);

/// The retry delays of one origin watch; pass to `WatchStreamExt::backoff`.
pub struct WatchBackoff(Backoff);

/// A fresh [`WatchBackoff`].
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff(Backoff::new(MIN, MAX))
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.0.next_delay())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}
