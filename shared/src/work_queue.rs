//! A coalescing work queue: a key is queued at most once however often it changes, so a burst
//! of updates to one object costs one reconcile, and memory is bounded by the number of
//! distinct objects, not the number of events.
//!
//! A key is handed to one worker at a time: while it is being reconciled ([`Claimed`] alive),
//! adding it again only marks it dirty, and it is queued once more when the claim ends. Two
//! workers reconciling one object at once could otherwise send an older version after a newer
//! one. A resync that reconciles a key outside the queue takes the same claim ([`WorkQueue::claim`]).
//!
//! A claim says when the oldest change it covers was queued ([`Claimed::noticed`]): the start
//! of the origin-change-to-applied latency, which a burst coalesced into one reconcile must not
//! shorten to its last change.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use refract_core::lock::Locked;

use tokio::sync::Notify;

/// The queue; clones share it.
pub struct WorkQueue<K: Clone + Eq + Hash> {
    inner: Arc<Inner<K>>,
}

impl<K: Clone + Eq + Hash> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    /// A key was queued.
    queued: Notify,
    /// A claim ended.
    released: Notify,
}

struct State<K> {
    /// Keys in the order they wait; never one that is being processed, except one a resync
    /// claimed while it waited (skipped when popped, queued again at release).
    order: VecDeque<K>,
    /// Keys that need a reconcile: waiting in `order`, or added while being processed.
    dirty: HashSet<K>,
    /// Keys a worker or a resync holds now.
    processing: HashSet<K>,
    /// When each dirty key was first queued since it was last handed out.
    noticed: HashMap<K, Instant>,
}

impl<K> State<K> {
    fn lock(m: &Mutex<State<K>>) -> std::sync::MutexGuard<'_, State<K>> {
        // The state stays consistent between statements; a panic elsewhere cannot break it.
        m.locked()
    }
}

/// A key held by one worker; dropping it ends the claim.
pub struct Claimed<K: Clone + Eq + Hash> {
    key: K,
    noticed: Instant,
    inner: Arc<Inner<K>>,
}

impl<K: Clone + Eq + Hash> Claimed<K> {
    /// When the oldest change this claim covers was queued; for a resync's claim, when it
    /// was taken.
    pub fn noticed(&self) -> Instant {
        self.noticed
    }
}

impl<K: Clone + Eq + Hash> std::ops::Deref for Claimed<K> {
    type Target = K;
    fn deref(&self) -> &K {
        &self.key
    }
}

impl<K: Clone + Eq + Hash> Drop for Claimed<K> {
    fn drop(&mut self) {
        let mut s = State::lock(&self.inner.state);
        s.processing.remove(&self.key);
        let requeue = s.dirty.contains(&self.key);
        if requeue {
            s.order.push_back(self.key.clone());
        }
        drop(s);
        if requeue {
            self.inner.queued.notify_one();
        }
        self.inner.released.notify_waiters();
    }
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
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    noticed: HashMap::new(),
                }),
                queued: Notify::new(),
                released: Notify::new(),
            }),
        }
    }

    /// Queues `key` unless it is queued already; a key being processed is queued again when
    /// its claim ends.
    pub fn add(&self, key: K) {
        let mut s = State::lock(&self.inner.state);
        s.noticed.entry(key.clone()).or_insert_with(Instant::now);
        if !s.dirty.insert(key.clone()) || s.processing.contains(&key) {
            return;
        }
        s.order.push_back(key);
        drop(s);
        self.inner.queued.notify_one();
    }

    /// Queues `key` after `delay` (a retry).
    pub fn add_after(&self, key: K, delay: Duration) {
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    /// Waits for the next key no one else holds, and holds it.
    pub async fn next(&self) -> Claimed<K> {
        loop {
            let notified = self.inner.queued.notified();
            {
                let mut s = State::lock(&self.inner.state);
                while let Some(key) = s.order.pop_front() {
                    if s.processing.contains(&key) {
                        // Claimed by a resync while it waited: stays dirty, queued at release.
                        continue;
                    }
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    let noticed = s.noticed.remove(&key).unwrap_or_else(Instant::now);
                    if !s.order.is_empty() {
                        // Wake another worker for the rest.
                        self.inner.queued.notify_one();
                    }
                    return self.claimed(key, noticed);
                }
            }
            notified.await;
        }
    }

    /// Holds `key` outside the queue's order (a resync reconciling it now), once no worker
    /// holds it. If it also waits in the queue, it is still reconciled once more afterwards.
    pub async fn claim(&self, key: K) -> Claimed<K> {
        loop {
            let released = self.inner.released.notified();
            {
                let mut s = State::lock(&self.inner.state);
                if s.processing.insert(key.clone()) {
                    // A change waiting in the queue keeps its own time for its own reconcile.
                    return self.claimed(key, Instant::now());
                }
            }
            released.await;
        }
    }

    fn claimed(&self, key: K, noticed: Instant) -> Claimed<K> {
        Claimed {
            key,
            noticed,
            inner: self.inner.clone(),
        }
    }

    /// How many keys wait.
    pub fn len(&self) -> usize {
        State::lock(&self.inner.state).order.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The latest value per key, handed out one key at a time: a newer value replaces one not yet
/// taken, so a burst of updates to one key costs one write, and memory is bounded by the
/// number of keys admitted.
pub struct Latest<K: Clone + Eq + Hash, V> {
    values: Mutex<std::collections::HashMap<K, V>>,
    queue: WorkQueue<K>,
}

impl<K: Clone + Eq + Hash + Send + 'static, V> Default for Latest<K, V> {
    fn default() -> Self {
        Self {
            values: Mutex::default(),
            queue: WorkQueue::new(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static, V> Latest<K, V> {
    /// Replaces the value of `key` and queues it.
    pub fn put(&self, key: K, value: V) {
        self.values.locked().insert(key.clone(), value);
        self.queue.add(key);
    }

    /// Queues `value` for `key` unless a value waits there already (a newer one).
    pub fn put_unless_waiting(&self, key: K, value: V) {
        let mut values = self.values.locked();
        if values.contains_key(&key) {
            return;
        }
        values.insert(key.clone(), value);
        drop(values);
        self.queue.add(key);
    }

    /// Waits for the next key no one else holds, and takes its latest value.
    pub async fn next(&self) -> (Claimed<K>, Option<V>) {
        let key = self.queue.next().await;
        let value = self.values.locked().remove(&*key);
        (key, value)
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
        assert_eq!(*q.next().await, "a");
        q.add("a");
        assert_eq!(*q.next().await, "b");
        assert_eq!(*q.next().await, "a");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn an_older_value_queued_again_loses_to_one_waiting() {
        let latest = Latest::default();
        latest.put("a", 2);
        latest.put_unless_waiting("a", 1);
        latest.put_unless_waiting("b", 3);
        let (key, value) = latest.next().await;
        assert_eq!((*key, value), ("a", Some(2)));
        drop(key);
        let (key, value) = latest.next().await;
        assert_eq!((*key, value), ("b", Some(3)));
    }

    #[tokio::test]
    async fn wakes_a_waiting_worker() {
        let q = WorkQueue::new();
        let w = {
            let q = q.clone();
            tokio::spawn(async move { *q.next().await })
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

    #[tokio::test]
    async fn a_key_being_processed_is_not_handed_to_a_second_worker() {
        let q = WorkQueue::new();
        q.add("a");
        let first = q.next().await;
        // Changed again while the first worker reconciles it.
        q.add("a");
        q.add("b");
        assert_eq!(*q.next().await, "b", "a is held: the next worker gets b");
        let second = {
            let q = q.clone();
            tokio::spawn(async move { *q.next().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "a must wait for the first claim");
        drop(first);
        let again = tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again, "a", "the change seen while held is reconciled after");
    }

    #[tokio::test]
    async fn a_claim_counts_from_the_oldest_change_it_covers() {
        let q = WorkQueue::new();
        let before = Instant::now();
        q.add("a");
        tokio::time::sleep(Duration::from_millis(30)).await;
        q.add("a");
        let first = q.next().await;
        assert!(
            first.noticed() < before + Duration::from_millis(20),
            "the burst is timed from its first change"
        );
        // Changed while held: the next round is timed from that change, not the first.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let changed = Instant::now();
        q.add("a");
        drop(first);
        let second = q.next().await;
        assert!(second.noticed() >= changed);
    }

    #[tokio::test]
    async fn latest_keeps_only_the_newest_value_per_key() {
        let latest = Latest::default();
        for v in 0..100 {
            latest.put("pod", v);
        }
        latest.put("other", -1);
        let (key, value) = latest.next().await;
        assert_eq!((*key, value), ("pod", Some(99)));
        let (key, value) = latest.next().await;
        assert_eq!((*key, value), ("other", Some(-1)));
    }

    #[tokio::test]
    async fn a_resync_claim_waits_for_the_worker_and_keeps_the_key_dirty() {
        let q = WorkQueue::new();
        q.add("a");
        let worker = q.next().await;
        let resync = {
            let q = q.clone();
            tokio::spawn(async move {
                let held = q.claim("a").await;
                *held
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!resync.is_finished(), "the resync waits for the worker");
        drop(worker);
        assert_eq!(resync.await.unwrap(), "a");

        // Claimed while queued: a worker skips it until the claim ends, then gets it.
        q.add("b");
        let held = q.claim("b").await;
        let w = {
            let q = q.clone();
            tokio::spawn(async move { *q.next().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!w.is_finished());
        drop(held);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .unwrap()
                .unwrap(),
            "b"
        );
    }
}
