//! A reflector's worker tasks, as many as the options in force say: the reflection values
//! file can change their number while the agent runs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Reflectable, Reflector};

/// How many workers run, and how many should.
#[derive(Default)]
pub(super) struct Workers {
    wanted: AtomicU32,
    running: AtomicU32,
}

impl Workers {
    /// Counts one more worker when fewer than wanted run.
    fn start_one(&self) -> bool {
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.wanted.load(Ordering::SeqCst)).then_some(n + 1)
            })
            .is_ok()
    }

    /// Counts one worker less when more than wanted run: that worker then stops.
    fn stop_one(&self) -> bool {
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > self.wanted.load(Ordering::SeqCst)).then(|| n - 1)
            })
            .is_ok()
    }
}

impl<K: Reflectable> Reflector<K> {
    /// Runs `wanted` workers: starts the missing ones at once; extra ones stop after the
    /// object each is working on, or the next one it takes.
    pub(super) fn resize(self: &Arc<Self>, wanted: u32, shutdown: &CancellationToken) {
        self.workers.wanted.store(wanted, Ordering::SeqCst);
        while self.workers.start_one() {
            let r = self.clone();
            self.spawn_until(shutdown.clone(), async move {
                while !r.workers.stop_one() {
                    let key = r.queue.next().await;
                    r.reconcile(&key).await;
                    drop(key);
                }
            });
        }
    }

    /// Follows the options in force: resizes the workers, and forges every object again when
    /// something the forge reads changed (policy, skip lists, patch).
    pub(super) async fn follow_options(self: Arc<Self>, shutdown: CancellationToken) {
        let mut changes = self.shared.options.changes();
        let mut last = self.shared.options.current();
        while changes.changed().await.is_ok() {
            let now = changes.borrow_and_update().clone();
            let workers = now.kind(self.kind).workers;
            // Turned off (0 workers), a kind whose reflector others read keeps its watch and
            // its workers, which withdraw every copy (see `reconcile`); turned on again, they
            // send every object anew. Kinds nothing else reads are stopped instead
            // (`start::switchable`), before this sees their 0.
            if workers > 0 && workers != self.workers.wanted.load(Ordering::SeqCst) {
                tracing::info!(
                    kind = self.kind.kind(),
                    workers,
                    "reflection workers resized"
                );
                self.resize(workers, &shutdown);
            }
            let switched = (workers > 0) != (last.kind(self.kind).workers > 0);
            if switched {
                tracing::info!(
                    kind = self.kind.kind(),
                    on = workers > 0,
                    "reflection of the kind turned {}",
                    if workers > 0 { "on" } else { "off" }
                );
            }
            if switched || crate::settings::forged_differently(&last, &now) {
                let objects = self.store.state();
                tracing::info!(
                    kind = self.kind.kind(),
                    objects = objects.len(),
                    "settings changed; forging every object again"
                );
                for obj in objects {
                    self.enqueue_object(&obj);
                }
            }
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_start_up_to_the_wanted_number_and_extra_ones_stop() {
        let w = Workers::default();
        w.wanted.store(2, Ordering::SeqCst);
        assert!(w.start_one() && w.start_one() && !w.start_one());
        assert!(!w.stop_one(), "none stops while as many as wanted run");
        w.wanted.store(1, Ordering::SeqCst);
        assert!(w.stop_one() && !w.stop_one());
        assert_eq!(w.running.load(Ordering::SeqCst), 1);
    }
}
