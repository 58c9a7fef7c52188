//! A coalescing work queue: a key is queued at most once however often it changes, so a burst
//! of updates to one object costs one reconcile, and memory is bounded by the number of
//! distinct objects, not the number of events.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The queue; clones share it.
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

struct State<K> {
    order: VecDeque<K>,
    queued: HashSet<K>,
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    order: VecDeque::new(),
                    queued: HashSet::new(),
                }),
                notify: Notify::new(),
            }),
        }
    }

    /// Queues `key` unless it is queued already.
    pub fn add(&self, key: K) {
        let mut s = self.inner.state.lock().expect("queue poisoned");
        if s.queued.insert(key.clone()) {
            s.order.push_back(key);
            drop(s);
            self.inner.notify.notify_one();
        }
    }

    /// Queues `key` after `delay` (a retry).
    pub fn add_after(&self, key: K, delay: Duration) {
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    /// Waits for the next key.
    pub async fn next(&self) -> K {
        loop {
            let notified = self.inner.notify.notified();
            {
                let mut s = self.inner.state.lock().expect("queue poisoned");
                if let Some(key) = s.order.pop_front() {
                    s.queued.remove(&key);
                    if !s.order.is_empty() {
                        // Wake another worker for the rest.
                        self.inner.notify.notify_one();
                    }
                    return key;
                }
            }
            notified.await;
        }
    }

    /// How many keys wait.
    pub fn len(&self) -> usize {
        self.inner.state.lock().expect("queue poisoned").order.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn coalesces_and_keeps_order() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, "a");
        q.add("a");
        assert_eq!(q.next().await, "b");
        assert_eq!(q.next().await, "a");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn wakes_a_waiting_worker() {
        let q = WorkQueue::new();
        let w = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        tokio::task::yield_now().await;
        q.add(7);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .unwrap()
                .unwrap(),
            7
        );
    }
}
