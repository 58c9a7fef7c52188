//! Provider messages that arrive before what they are about is known on this session.
//!
//! When a session starts, the remote agent sends every pod's status, every bound volume and
//! the events it holds at once, while this agent's producers are still sending (or resuming)
//! the objects, its claim watch may not have listed yet, and the twin namespaces may not be
//! extended yet. Such a message cannot be checked yet against what this agent sent. The remote
//! agent sends each of them once per session unless it changes, so dropping it would lose it:
//! an origin pod would keep its old restart count, a claim would never get its PV. They wait
//! here and go through the same checks again each second. What a provider can park here is
//! bounded in count, bytes and age; what is pushed out or waits too long is dropped and given
//! back to the caller, which counts it refused and names it in its log.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::inbound::excerpt;
use refract_core::lock::Locked;
use refract_wire::proto;

/// How long a message may wait for what it is about: as long as a resuming session may hold
/// a bucket before sending it in full (`resume::HOLD_LIMIT`).
pub const MAX_WAIT: Duration = crate::resume::HOLD_LIMIT;
/// How often messages waiting for no particular answer are checked again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// A provider message that may wait here.
pub trait Holdable {
    /// Bytes of the message's payload: what it counts for against the byte cap.
    fn weight(&self) -> usize;
    /// What the message is about, as the provider named it, for the log when it is dropped.
    fn subject(&self) -> String;
}

impl Holdable for proto::PodStatus {
    fn weight(&self) -> usize {
        self.status_json.len()
    }
    fn subject(&self) -> String {
        named(&self.namespace, &self.name)
    }
}

impl Holdable for proto::PersistentVolume {
    fn weight(&self) -> usize {
        self.volume_json.len()
    }
    fn subject(&self) -> String {
        named(&self.claim_namespace, &self.claim_name)
    }
}

impl Holdable for proto::Event {
    fn weight(&self) -> usize {
        self.event_json.len()
    }
    fn subject(&self) -> String {
        match &self.involved {
            Some(o) => format!("{} {}", excerpt(&o.kind), named(&o.namespace, &o.name)),
            None => "nothing named".into(),
        }
    }
}

/// `namespace/name` of untrusted names, cut short for the log.
fn named(namespace: &str, name: &str) -> String {
    format!("{}/{}", excerpt(namespace), excerpt(name))
}

/// How many dropped messages a log line names; the count says how many there were.
const NAMED_IN_LOG: usize = 3;

/// The subjects of the first few `dropped` messages, for a log line.
pub fn some_subjects<T: Holdable>(dropped: &[T]) -> Vec<String> {
    dropped.iter().take(NAMED_IN_LOG).map(T::subject).collect()
}

/// Messages waiting, the latest per key.
pub struct Early<K, T> {
    held: HashMap<K, (Instant, T)>,
    bytes: usize,
    max_held: usize,
    max_bytes: usize,
}

impl<K: Hash + Eq + Clone, T: Holdable> Early<K, T> {
    /// Holds at most `max_held` messages of at most `max_bytes` in all.
    pub fn new(max_held: usize, max_bytes: usize) -> Self {
        Self {
            held: HashMap::new(),
            bytes: 0,
            max_held,
            max_bytes,
        }
    }

    /// Holds `value` under `key` (replacing an older one); returns the messages dropped
    /// to make room or because they waited too long (`value` itself when it alone is over
    /// the byte cap).
    pub fn hold(&mut self, key: K, value: T, now: Instant) -> Vec<T> {
        let mut dropped = self.expire(now);
        dropped.extend(self.hold_since(key, value, now));
        dropped
    }

    /// Holds `value` as having come at `since`, making room by dropping the oldest; returns
    /// what was dropped.
    fn hold_since(&mut self, key: K, value: T, since: Instant) -> Vec<T> {
        self.remove(&key);
        if value.weight() > self.max_bytes {
            return vec![value];
        }
        let mut dropped = Vec::new();
        while self.held.len() >= self.max_held || self.bytes + value.weight() > self.max_bytes {
            let Some(oldest) = self
                .held
                .iter()
                .min_by_key(|(_, (since, _))| *since)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            dropped.extend(self.remove(&oldest).map(|(_, value)| value));
        }
        self.bytes += value.weight();
        self.held.insert(key, (since, value));
        dropped
    }

    /// Holds `value` under `key` unless a message waits there already, which is newer
    /// (a status sent by the provider since); returns what was dropped.
    pub fn hold_unless_held(&mut self, key: K, value: T, now: Instant) -> Vec<T> {
        let mut dropped = self.expire(now);
        if !self.held.contains_key(&key) {
            dropped.extend(self.hold_since(key, value, now));
        }
        dropped
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Takes every message that has not waited too long, to be checked again; returns them
    /// and those that had waited too long (dropped). Give back what still cannot be taken
    /// with [`Early::put_back`].
    pub fn take_all(&mut self, now: Instant) -> (Vec<Waiting<K, T>>, Vec<T>) {
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
    /// newer message held under the same key meanwhile wins. Returns what was dropped to make
    /// room. Age is not checked here: `take_all` just dropped what waited too long, and the
    /// next round checks again (checking at every put-back would scan everything held once
    /// per message).
    pub fn put_back(&mut self, waiting: Waiting<K, T>) -> Vec<T> {
        if self.held.contains_key(&waiting.key) {
            return Vec::new();
        }
        self.hold_since(waiting.key, waiting.value, waiting.since)
    }

    /// Drops the messages that waited too long; returns them.
    fn expire(&mut self, now: Instant) -> Vec<T> {
        let old: Vec<K> = self
            .held
            .iter()
            .filter(|(_, (since, _))| now.duration_since(*since) > MAX_WAIT)
            .map(|(key, _)| key.clone())
            .collect();
        old.iter()
            .filter_map(|key| self.remove(key))
            .map(|(_, value)| value)
            .collect()
    }

    fn remove(&mut self, key: &K) -> Option<(Instant, T)> {
        let removed = self.held.remove(key)?;
        self.bytes -= removed.1.weight();
        Some(removed)
    }
}

/// Checks the messages held in `early` again each second, for ever: `settle` takes each one
/// and gives back those that must still wait; `dropped` is given what was dropped (waited too
/// long or pushed out) in each round.
pub async fn retry_each_second<K: Hash + Eq + Clone, T: Holdable>(
    early: &Mutex<Early<K, T>>,
    mut settle: impl FnMut(T) -> Option<T>,
    mut dropped: impl FnMut(Vec<T>),
) {
    let lock = || early.locked();
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
            lost.extend(lock().put_back(w));
        }
        if !lost.is_empty() {
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

    impl Holdable for Blob {
        fn weight(&self) -> usize {
            self.0
        }
        fn subject(&self) -> String {
            format!("blob of {}", self.0)
        }
    }

    fn weights(blobs: &[Blob]) -> Vec<usize> {
        blobs.iter().map(|b| b.0).collect()
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
        assert!(early.hold("a".into(), Blob(10), now).is_empty());
        assert!(early.hold("a".into(), Blob(20), now).is_empty());
        assert!(early.hold("b".into(), Blob(5), now).is_empty());
        assert_eq!(early.bytes, 25);
        let (waiting, expired) = early.take_all(now);
        assert!(expired.is_empty());
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
        early.hold("b".into(), Blob(11), then + Duration::from_secs(5));
        let later = then + MAX_WAIT + Duration::from_secs(1);
        let dropped = early.hold("c".into(), Blob(12), later);
        assert_eq!(weights(&dropped), [10], "a expired");
        assert_eq!(weight_of(&early, "a"), None);
        let (waiting, expired) = early.take_all(later + Duration::from_secs(5));
        assert_eq!(weights(&expired), [11], "b expired");
        assert_eq!(waiting.len(), 1, "c waits");
        assert_eq!(waiting[0].value.0, 12);
    }

    #[test]
    fn the_oldest_make_room_when_the_bytes_are_used_up() {
        let mut early = early();
        let t = Instant::now();
        let ms = Duration::from_millis;
        early.hold("a".into(), Blob(MAX_BYTES / 2), t);
        early.hold("b".into(), Blob(MAX_BYTES / 2 - 1), t + ms(1));
        let dropped = early.hold("c".into(), Blob(2), t + ms(2));
        assert_eq!(weights(&dropped), [MAX_BYTES / 2], "the oldest went");
        assert_eq!(weight_of(&early, "a"), None);
        assert_eq!(weight_of(&early, "b"), Some(MAX_BYTES / 2 - 1));
        assert_eq!(weight_of(&early, "c"), Some(2));
        let dropped = early.hold("d".into(), Blob(MAX_BYTES + 1), t + ms(3));
        assert_eq!(weights(&dropped), [MAX_BYTES + 1], "too large to hold");
        assert_eq!(early.bytes, MAX_BYTES / 2 + 1);
    }

    #[test]
    fn dropped_messages_are_named_by_what_they_are_about_cut_short() {
        let status = proto::PodStatus {
            namespace: "apps-origin".into(),
            name: "x".repeat(200),
            ..Default::default()
        };
        let event = proto::Event {
            involved: Some(proto::ObjectRef {
                kind: "ConfigMap".into(),
                namespace: "apps-origin".into(),
                name: "settings".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let named = some_subjects(&[status.clone(), status.clone(), status.clone(), status]);
        assert_eq!(named.len(), NAMED_IN_LOG);
        assert!(named[0].starts_with("apps-origin/xxx") && named[0].ends_with('…'));
        assert!(named[0].len() < 100, "{}", named[0]);
        assert_eq!(event.subject(), "ConfigMap apps-origin/settings");
        let nameless = proto::Event::default();
        assert_eq!(nameless.subject(), "nothing named");
    }

    #[test]
    fn the_count_is_bounded() {
        let mut early = early();
        let t = Instant::now();
        let mut dropped = Vec::new();
        for i in 0..MAX_HELD + 10 {
            dropped.extend(early.hold(i.to_string(), Blob(1), t + Duration::from_micros(i as u64)));
        }
        assert_eq!(dropped.len(), 10);
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
        assert_eq!((waiting.len(), expired.len()), (2, 0));
        assert!(early.is_empty());
        early.hold("b".into(), Blob(3), second);
        for w in waiting {
            early.put_back(w);
        }
        assert_eq!(weight_of(&early, "b"), Some(3), "the newer one stays");
        assert_eq!(early.bytes, 4);
        let (waiting, expired) = early.take_all(t + MAX_WAIT + Duration::from_millis(500));
        assert_eq!(weights(&expired), [1], "a kept the time it first came");
        assert_eq!(waiting[0].value.0, 3);
    }

    #[test]
    fn an_older_message_held_again_loses_to_one_waiting_already() {
        let mut early = early();
        let t = Instant::now();
        early.hold("a".into(), Blob(7), t);
        assert!(early.hold_unless_held("a".into(), Blob(1), t).is_empty());
        assert_eq!(weight_of(&early, "a"), Some(7), "the one waiting stays");
        assert!(early.hold_unless_held("b".into(), Blob(2), t).is_empty());
        assert_eq!(weight_of(&early, "b"), Some(2), "nothing waited: held");
        assert_eq!(early.bytes, 9);
    }
}
