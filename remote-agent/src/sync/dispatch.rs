//! Applying one session's requests concurrently, each object's in the order they were sent.
//!
//! A request starts as soon as the session holds fewer writes than its share of the provider
//! ([`share`](super::share)), unless a request for the same object is under way: then it
//! waits behind it, without holding a seat, and then runs on that request's seat once the
//! tenant's rate allows (see [`Seat::pace`](super::share::Seat::pace)). What waits is
//! coalesced per object (see [`coalesce`]): at most two requests per object under way. The reader waits for
//! a seat, so a busy provider slows the tenant's stream down instead of queueing without
//! bound.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use refract_core::lock::Locked;
use refract_wire::proto::{local_message, Delete, LocalMessage, Upsert};

use super::share::Seats;
use tracing::Instrument;

/// An object's identity on the wire: kind, namespace, name.
pub type Key = (String, String, String);

/// Runs requests concurrently, in order per object.
pub struct Dispatcher {
    seats: Arc<Seats>,
    waiting: Arc<Mutex<HashMap<Key, VecDeque<LocalMessage>>>>,
}

/// The object a message is about, whose requests run in order: an Upsert's or a Delete's.
/// Other messages (SnapshotComplete, InventoryRequest, ...) and requests naming no object run
/// aside, off the reader.
pub fn object_of(message: &LocalMessage) -> Option<Key> {
    let object = match &message.kind {
        Some(local_message::Kind::Upsert(Upsert { object, .. }))
        | Some(local_message::Kind::Delete(Delete { object, .. })) => object.as_ref(),
        _ => None,
    }?;
    Some((
        object.kind.clone(),
        object.namespace.clone(),
        object.name.clone(),
    ))
}

fn is_upsert(m: &LocalMessage) -> bool {
    matches!(m.kind, Some(local_message::Kind::Upsert(_)))
}

/// Queues `message` behind the object's waiting requests, keeping only what still matters:
/// a Delete supersedes everything waiting (the object goes whatever it was to become), an
/// Upsert supersedes a waiting Upsert (each is the whole desired state) but stays behind a
/// waiting Delete (a new object of the same name comes after the old one is gone). So at most
/// a Delete and an Upsert wait per object, however fast a tenant alternates them.
fn coalesce(queue: &mut VecDeque<LocalMessage>, message: LocalMessage) {
    if !is_upsert(&message) {
        queue.clear();
    } else if queue.back().is_some_and(is_upsert) {
        queue.pop_back();
    }
    queue.push_back(message);
}

impl Dispatcher {
    /// A dispatcher running as many requests at once as `seats` allows.
    pub fn new(seats: Seats) -> Self {
        Self {
            seats: Arc::new(seats),
            waiting: Arc::default(),
        }
    }

    /// Has `handle` process `message` (for object `key`) now, or after the object's requests
    /// under way. Returns once it is started or queued.
    pub async fn dispatch<F, Fut>(&self, key: Key, message: LocalMessage, handle: F)
    where
        F: Fn(LocalMessage) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        {
            let mut waiting = self.waiting.locked();
            if let Some(queue) = waiting.get_mut(&key) {
                coalesce(queue, message);
                return;
            }
            waiting.insert(key.clone(), VecDeque::new());
        }
        let seat = self.seats.take().await;
        let waiting = self.waiting.clone();
        tokio::spawn(
            async move {
                let mut next = Some(message);
                while let Some(m) = next.take() {
                    handle(m).await;
                    let more = waiting.locked().get(&key).is_some_and(|q| !q.is_empty());
                    if more {
                        seat.pace().await;
                    }
                    let mut w = waiting.locked();
                    next = w.get_mut(&key).and_then(VecDeque::pop_front);
                    if next.is_none() {
                        w.remove(&key);
                    }
                }
                drop(seat);
            }
            .in_current_span(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_wire::proto::{ObjectRef, SnapshotComplete};
    use std::time::Duration;

    fn upsert(name: &str, revision: &str) -> LocalMessage {
        LocalMessage {
            kind: Some(local_message::Kind::Upsert(Upsert {
                object: Some(ObjectRef {
                    name: name.into(),
                    ..Default::default()
                }),
                revision: revision.into(),
                ..Default::default()
            })),
        }
    }

    fn revision(m: &LocalMessage) -> String {
        match &m.kind {
            Some(local_message::Kind::Upsert(u)) => u.revision.clone(),
            _ => String::new(),
        }
    }

    fn delete(name: &str, revision: &str) -> LocalMessage {
        LocalMessage {
            kind: Some(local_message::Kind::Delete(refract_wire::proto::Delete {
                object: Some(ObjectRef {
                    name: name.into(),
                    ..Default::default()
                }),
                revision: revision.into(),
                ..Default::default()
            })),
        }
    }

    fn revision_of(m: &LocalMessage) -> String {
        match &m.kind {
            Some(local_message::Kind::Upsert(u)) => u.revision.clone(),
            Some(local_message::Kind::Delete(d)) => d.revision.clone(),
            _ => String::new(),
        }
    }

    #[test]
    fn upserts_and_deletes_are_ordered_by_their_object_and_the_rest_runs_aside() {
        let named = |kind: &str, namespace: &str, name: &str| ObjectRef {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        };
        let mut m = upsert("a", "1");
        if let Some(local_message::Kind::Upsert(u)) = &mut m.kind {
            u.object = Some(named("ConfigMap", "shop", "a"));
        }
        let key = ("ConfigMap".to_string(), "shop".to_string(), "a".to_string());
        assert_eq!(object_of(&m), Some(key.clone()));
        let mut d = delete("a", "2");
        if let Some(local_message::Kind::Delete(del)) = &mut d.kind {
            del.object = Some(named("ConfigMap", "shop", "a"));
        }
        assert_eq!(
            object_of(&d),
            Some(key),
            "an object's delete queues behind its upsert"
        );
        let snapshot = LocalMessage {
            kind: Some(local_message::Kind::SnapshotComplete(
                SnapshotComplete::default(),
            )),
        };
        assert_eq!(object_of(&snapshot), None);
        let nameless = LocalMessage {
            kind: Some(local_message::Kind::Upsert(Upsert::default())),
        };
        assert_eq!(object_of(&nameless), None, "refused aside, as malformed");
    }

    #[test]
    fn alternating_upserts_and_deletes_coalesce_to_at_most_two() {
        let mut q = VecDeque::new();
        for i in 0..1000 {
            coalesce(&mut q, upsert("a", &format!("u{i}")));
            coalesce(&mut q, delete("a", &format!("d{i}")));
        }
        let kept: Vec<String> = q.iter().map(revision_of).collect();
        assert_eq!(kept, ["d999"]);
        coalesce(&mut q, upsert("a", "u-last"));
        coalesce(&mut q, upsert("a", "u-later"));
        let kept: Vec<String> = q.iter().map(revision_of).collect();
        assert_eq!(
            kept,
            ["d999", "u-later"],
            "the new object comes after the delete"
        );
    }

    #[tokio::test]
    async fn one_object_in_order_others_alongside_newest_upsert_wins() {
        let d = Dispatcher::new(super::super::share::WriteShare::new(4, 4, 0).session());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handle = |seen: Arc<Mutex<Vec<String>>>| {
            move |m: LocalMessage| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    seen.lock().unwrap().push(revision(&m));
                }
            }
        };
        let key = |n: &str| (String::new(), String::new(), n.to_string());
        d.dispatch(key("a"), upsert("a", "a1"), handle(seen.clone()))
            .await;
        d.dispatch(key("a"), upsert("a", "a2"), handle(seen.clone()))
            .await;
        d.dispatch(key("a"), upsert("a", "a3"), handle(seen.clone()))
            .await;
        d.dispatch(key("b"), upsert("b", "b1"), handle(seen.clone()))
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let seen = seen.lock().unwrap().clone();
        // b ran alongside a1 (not after it); a2 was replaced by a3 while a1 ran.
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.iter().position(|r| r == "b1") < seen.iter().position(|r| r == "a3"));
        assert!(seen.iter().position(|r| r == "a1") < seen.iter().position(|r| r == "a3"));
        assert!(!seen.contains(&"a2".to_string()));
    }
}
