//! Provider messages that arrive before what they are about is known on this session.
//!
//! When a session starts, the remote agent sends every pod's status, every bound volume and
//! the events it holds at once, while this agent's producers are still sending (or resuming)
//! the objects, its claim watch may not have listed yet, and the twin namespaces may not be
//! extended yet. Such a message cannot be checked yet against what this agent sent. The remote
//! agent sends each of them once per session unless it changes, so dropping it would lose it:
//! an origin pod would keep its old restart count, a claim would never get its PV. They wait
//! here and go through the same checks again each second. What a provider can park here is
//! bounded in count, bytes and age; what is pushed out or waits too long is dropped, and the
//! caller counts it refused.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_shared::proto;

/// How long a message may wait for what it is about: as long as a resuming session may hold
/// a bucket before sending it in full (`resume::HOLD_LIMIT`).
pub const MAX_WAIT: Duration = crate::resume::HOLD_LIMIT;
/// How often messages waiting for no particular answer are checked again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The size a held message counts for.
pub trait Weighed {
    /// Bytes of the message's payload.
    fn weight(&self) -> usize;
}

impl Weighed for proto::PodStatus {
    fn weight(&self) -> usize {
        self.status_json.len()
    }
}

impl Weighed for proto::PersistentVolume {
    fn weight(&self) -> usize {
        self.volume_json.len()
    }
}

impl Weighed for proto::Event {
    fn weight(&self) -> usize {
        self.event_json.len()
    }
}

/// Messages waiting, the latest per key.
pub struct Early<K, T> {
    held: HashMap<K, (Instant, T)>,
    bytes: usize,
    max_held: usize,
    max_bytes: usize,
}

impl<K: Hash + Eq + Clone, T: Weighed> Early<K, T> {
    /// Holds at most `max_held` messages of at most `max_bytes` in all.
    pub fn new(max_held: usize, max_bytes: usize) -> Self {
        Self {
            held: HashMap::new(),
            bytes: 0,
            max_held,
            max_bytes,
        }
    }

    /// Holds `value` under `key` (replacing an older one); returns how many held messages
    /// were dropped to make room or because they waited too long.
    pub fn hold(&mut self, key: K, value: T, now: Instant) -> usize {
        self.hold_since(key, value, now, now)
    }

    fn hold_since(&mut self, key: K, value: T, since: Instant, now: Instant) -> usize {
        let mut dropped = self.expire(now);
        self.remove(&key);
        if value.weight() > self.max_bytes {
            return dropped + 1;
        }
        while !self.held.is_empty()
            && (self.held.len() >= self.max_held || self.bytes + value.weight() > self.max_bytes)
        {
            let oldest = self
                .held
                .iter()
                .min_by_key(|(_, (since, _))| *since)
                .map(|(key, _)| key.clone())
                .expect("not empty");
            self.remove(&oldest);
            dropped += 1;
        }
        self.bytes += value.weight();
        self.held.insert(key, (since, value));
        dropped
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Takes every message that has not waited too long, to be checked again; returns them
    /// and how many had waited too long (dropped). Give back what still cannot be taken
    /// with [`Early::put_back`].
    pub fn take_all(&mut self, now: Instant) -> (Vec<Waiting<K, T>>, usize) {
        let expired = self.expire(now);
        self.bytes = 0;
        let waiting = self
            .held
            .drain()
            .map(|(key, (since, value))| Waiting { key, since, value })
            .collect();
        (waiting, expired)
    }

    /// Holds again a message [`Early::take_all`] gave out, keeping when it first came; a
    /// newer message held under the same key meanwhile wins. Returns how many were dropped.
    pub fn put_back(&mut self, waiting: Waiting<K, T>, now: Instant) -> usize {
        if self.held.contains_key(&waiting.key) {
            return 0;
        }
        self.hold_since(waiting.key, waiting.value, waiting.since, now)
    }

    /// Drops the messages that waited too long; returns how many.
    fn expire(&mut self, now: Instant) -> usize {
        let old: Vec<K> = self
            .held
            .iter()
            .filter(|(_, (since, _))| now.duration_since(*since) > MAX_WAIT)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &old {
            self.remove(key);
        }
        old.len()
    }

    fn remove(&mut self, key: &K) -> Option<(Instant, T)> {
        let removed = self.held.remove(key)?;
        self.bytes -= removed.1.weight();
        Some(removed)
    }
}

/// Checks the messages held in `early` again each second, for ever: `settle` takes each one
/// and gives back those that must still wait; `dropped` is told how many were dropped (waited
/// too long or pushed out) in each round.
pub async fn retry_each_second<K: Hash + Eq + Clone, T: Weighed>(
    early: &Mutex<Early<K, T>>,
    mut settle: impl FnMut(T) -> Option<T>,
    mut dropped: impl FnMut(usize),
) {
    let lock = || early.lock().expect("held provider messages poisoned");
    let mut tick = tokio::time::interval(RETRY_EVERY);
    loop {
        tick.tick().await;
        if lock().is_empty() {
            continue;
        }
        let (waiting, mut lost) = lock().take_all(Instant::now());
        for mut w in waiting {
            // Taken out of the lock: settling may take other locks (the outbox's ledger).
            let Some(value) = settle(w.value) else {
                continue;
            };
            w.value = value;
            lost += lock().put_back(w, Instant::now());
        }
        if lost > 0 {
            dropped(lost);
        }
    }
}

/// A message given out by [`Early::take_all`].
pub struct Waiting<K, T> {
    key: K,
    since: Instant,
    /// The message.
    pub value: T,
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Blob(usize);

    impl Weighed for Blob {
        fn weight(&self) -> usize {
            self.0
        }
    }

    const MAX_HELD: usize = 100;
    const MAX_BYTES: usize = 1000;

    fn early() -> Early<String, Blob> {
        Early::new(MAX_HELD, MAX_BYTES)
    }

    fn weight_of(early: &Early<String, Blob>, key: &str) -> Option<usize> {
        early.held.get(key).map(|(_, blob)| blob.0)
    }

    #[test]
    fn the_latest_message_per_key_is_held_and_taken_all_at_once() {
        let mut early = early();
        let now = Instant::now();
        assert_eq!(early.hold("a".into(), Blob(10), now), 0);
        assert_eq!(early.hold("a".into(), Blob(20), now), 0);
        assert_eq!(early.hold("b".into(), Blob(5), now), 0);
        assert_eq!(early.bytes, 25);
        let (waiting, expired) = early.take_all(now);
        assert_eq!(expired, 0);
        let mut weights: Vec<usize> = waiting.iter().map(|w| w.value.0).collect();
        weights.sort();
        assert_eq!(weights, [5, 20]);
        assert_eq!(early.bytes, 0);
        assert!(early.is_empty());
    }

    #[test]
    fn a_message_that_waited_too_long_is_dropped() {
        let mut early = early();
        let then = Instant::now();
        early.hold("a".into(), Blob(10), then);
        early.hold("b".into(), Blob(10), then + Duration::from_secs(5));
        let later = then + MAX_WAIT + Duration::from_secs(1);
        assert_eq!(early.hold("c".into(), Blob(10), later), 1, "a expired");
        assert_eq!(weight_of(&early, "a"), None);
        let (waiting, expired) = early.take_all(later + Duration::from_secs(5));
        assert_eq!((waiting.len(), expired), (1, 1), "b expired, c waits");
        assert_eq!(waiting[0].value.0, 10);
    }

    #[test]
    fn the_oldest_make_room_when_the_bytes_are_used_up() {
        let mut early = early();
        let t = Instant::now();
        let ms = Duration::from_millis;
        early.hold("a".into(), Blob(MAX_BYTES / 2), t);
        early.hold("b".into(), Blob(MAX_BYTES / 2), t + ms(1));
        assert_eq!(early.hold("c".into(), Blob(1), t + ms(2)), 1);
        assert_eq!(weight_of(&early, "a"), None, "the oldest went");
        assert_eq!(weight_of(&early, "b"), Some(MAX_BYTES / 2));
        assert_eq!(weight_of(&early, "c"), Some(1));
        assert_eq!(
            early.hold("d".into(), Blob(MAX_BYTES + 1), t + ms(3)),
            1,
            "too large to hold"
        );
        assert_eq!(early.bytes, MAX_BYTES / 2 + 1);
    }

    #[test]
    fn the_count_is_bounded() {
        let mut early = early();
        let t = Instant::now();
        let mut dropped = 0;
        for i in 0..MAX_HELD + 10 {
            dropped += early.hold(i.to_string(), Blob(1), t + Duration::from_micros(i as u64));
        }
        assert_eq!(dropped, 10);
        assert_eq!(early.held.len(), MAX_HELD);
        assert_eq!(weight_of(&early, "0"), None);
        assert_eq!(weight_of(&early, "10"), Some(1));
    }

    #[test]
    fn what_is_put_back_keeps_its_age_and_loses_to_a_newer_message() {
        let mut early = early();
        let t = Instant::now();
        let second = t + Duration::from_secs(1);
        early.hold("a".into(), Blob(1), t);
        early.hold("b".into(), Blob(2), t);
        let (waiting, expired) = early.take_all(second);
        assert_eq!((waiting.len(), expired), (2, 0));
        assert!(early.is_empty());
        early.hold("b".into(), Blob(3), second);
        for w in waiting {
            early.put_back(w, second);
        }
        assert_eq!(weight_of(&early, "b"), Some(3), "the newer one stays");
        assert_eq!(early.bytes, 4);
        let (waiting, expired) = early.take_all(t + MAX_WAIT + Duration::from_millis(500));
        assert_eq!(expired, 1, "a kept the time it first came");
        assert_eq!(waiting[0].value.0, 3);
    }
}
