//! Aggregation of provider events: one origin event per object, type, reason and message,
//! its count rising with repeats, and a bounded backlog of events waiting to be written.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use refract_core::lock::Locked;

use k8s_openapi::api::core::v1::Event;
use tokio::sync::Notify;

use super::origin::Target;

/// Distinct provider events counted separately within one aggregate; repeats of further
/// provider events add one each.
const MAX_NAMES_PER_EVENT: usize = 16;

/// What makes two provider events the same origin event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AggregateKey {
    kind: &'static str,
    namespace: String,
    name: String,
    type_: String,
    reason: String,
    message: String,
}

struct Entry {
    target: Target,
    latest: Event,
    /// The latest count of each provider event folded in, by its name.
    counts: HashMap<String, i32>,
    /// Repeats of provider events beyond [`MAX_NAMES_PER_EVENT`].
    extra: i64,
    dirty: bool,
    written: bool,
    last_seen: Instant,
    origin_name: String,
}

impl Entry {
    fn count(&self) -> i32 {
        let total = self.counts.values().map(|c| i64::from(*c)).sum::<i64>() + self.extra;
        i32::try_from(total).unwrap_or(i32::MAX)
    }

    fn fold(&mut self, event: Event) {
        let name = event.metadata.name.clone().unwrap_or_default();
        let count = event.count.unwrap_or(1).max(1);
        if let Some(seen) = self.counts.get_mut(&name) {
            *seen = (*seen).max(count);
        } else if self.counts.len() < MAX_NAMES_PER_EVENT {
            self.counts.insert(name, count);
        } else {
            self.extra = self.extra.saturating_add(1);
        }
        self.latest = event;
        self.last_seen = Instant::now();
    }
}

/// One origin event to write.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The origin event's name (stable for the aggregate).
    pub origin_name: String,
    /// The origin object it is about.
    pub target: Target,
    /// The latest provider event folded in.
    pub latest: Event,
    /// How many times it happened on the provider.
    pub count: i32,
    /// Whether this is the aggregate's first write (create rather than update).
    pub first: bool,
}

/// What an offered event became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// A new origin event, waiting to be written.
    New,
    /// Folded into an origin event waiting or written.
    Aggregated,
    /// The backlog is full of events not yet written.
    Dropped,
}

/// The aggregates and the order in which changed ones are written.
pub struct Aggregator {
    state: Mutex<State>,
    notify: Notify,
    max: usize,
}

#[derive(Default)]
struct State {
    entries: HashMap<AggregateKey, Entry>,
    dirty: VecDeque<AggregateKey>,
}

impl Aggregator {
    /// An aggregator keeping at most `max` aggregates.
    pub fn new(max: usize) -> Self {
        Self {
            state: Mutex::default(),
            notify: Notify::new(),
            max,
        }
    }

    /// Folds in one provider event about `target`.
    pub fn offer(&self, target: Target, event: Event) -> Offer {
        let key = AggregateKey {
            kind: target.kind,
            namespace: target.key.namespace.clone(),
            name: target.key.name.clone(),
            type_: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            message: event.message.clone().unwrap_or_default(),
        };
        let mut s = self.state.locked();
        let offer = if let Some(entry) = s.entries.get_mut(&key) {
            entry.target = target;
            entry.fold(event);
            if entry.dirty {
                return Offer::Aggregated;
            }
            entry.dirty = true;
            Offer::Aggregated
        } else {
            if s.entries.len() >= self.max && !s.evict_oldest_written() {
                return Offer::Dropped;
            }
            let origin_name = origin_name(&key);
            let mut entry = Entry {
                target,
                latest: event.clone(),
                counts: HashMap::new(),
                extra: 0,
                dirty: true,
                written: false,
                last_seen: Instant::now(),
                origin_name,
            };
            entry.fold(event);
            s.entries.insert(key.clone(), entry);
            Offer::New
        };
        s.dirty.push_back(key);
        drop(s);
        self.notify.notify_one();
        offer
    }

    /// Waits for the next changed aggregate.
    pub async fn next(&self) -> Pending {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.state.locked();
                while let Some(key) = s.dirty.pop_front() {
                    let Some(entry) = s.entries.get_mut(&key) else {
                        continue;
                    };
                    entry.dirty = false;
                    let first = !entry.written;
                    entry.written = true;
                    return Pending {
                        origin_name: entry.origin_name.clone(),
                        target: entry.target.clone(),
                        latest: entry.latest.clone(),
                        count: entry.count(),
                        first,
                    };
                }
            }
            notified.await;
        }
    }

    /// Aggregates waiting to be written.
    pub fn dirty_len(&self) -> usize {
        self.state.locked().dirty.len()
    }
}

impl State {
    /// Forgets the written aggregate seen longest ago; false when every one still waits.
    fn evict_oldest_written(&mut self) -> bool {
        let oldest = self
            .entries
            .iter()
            .filter(|(_, e)| !e.dirty)
            .min_by_key(|(_, e)| e.last_seen)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(key) => {
                self.entries.remove(&key);
                true
            }
            None => false,
        }
    }
}

/// A stable origin event name for an aggregate: the object's name and a digest of the rest.
fn origin_name(key: &AggregateKey) -> String {
    let digest = refract_core::hash::bytes_hash(
        format!(
            "{}\0{}\0{}\0{}\0{}\0{}",
            key.kind, key.namespace, key.name, key.type_, key.reason, key.message
        )
        .as_bytes(),
    );
    let object: String = key.name.chars().take(200).collect();
    let object = object.trim_end_matches(['-', '.']);
    format!("{object}.{}", &digest[..16.min(digest.len())])
}
