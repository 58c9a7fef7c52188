//! Following a watch until shutdown. A kind whose CRD is missing on this provider fails every
//! retry of its watch, for as long as the CRD stays missing: its first failure is a warning,
//! the next ones are quiet until the watch works again.

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

/// A watch's events, its failures logged rather than returned.
pub struct Following<K> {
    events: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    /// What is watched, for the log (for example "tenant objects of kind Widget").
    what: String,
    failing: bool,
}

impl<K> Following<K> {
    /// Follows `events`, watching `what`.
    pub fn new(
        events: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
        what: String,
    ) -> Self {
        Self {
            events,
            what,
            failing: false,
        }
    }

    /// The next event; `None` once `shutdown` is cancelled or the watch ends.
    pub async fn next(&mut self, shutdown: &CancellationToken) -> Option<watcher::Event<K>> {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return None,
                event = self.events.next() => event?,
            };
            match event {
                Ok(event) => {
                    self.failing = false;
                    return Some(event);
                }
                Err(error) if !self.failing => {
                    self.failing = true;
                    tracing::warn!(what = %self.what, %error, "cannot watch (is the kind's CRD installed?); retrying with backoff, quietly until it works");
                }
                Err(error) => tracing::debug!(what = %self.what, %error, "cannot watch"),
            }
        }
    }
}
