//! The origin watch of one kind, scoped to the namespaces selected for this peer: one watch per
//! namespace, merged into one store.
//!
//! A cluster-wide watch would make the agent decode and keep every object of the kind in the
//! origin, extended or not (every Secret of the cluster included), and with several peerings
//! on one origin, every agent every object: 20 local agents on one origin with 1,000
//! ConfigMaps each held 87 MiB each that way, 31 MiB each watching their own namespace
//! (BENCHMARKS.md, run 21).
//!
//! kube-runtime's store writer replaces its whole content when a watch has listed, which would
//! drop the other namespaces' objects; here each namespace's list is applied as changes: its
//! objects as they come, then, once it has listed, a deletion of each object of that namespace
//! the list no longer had. The store is ready at once; whether a namespace's objects are in it
//! is told by [`Scoped::listed`]. The selection is followed as it changes, and a namespace stays
//! watched while the link is down, so a reconnect lists nothing again.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::keys::LAST_APPLIED_ANNOTATION;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::Reflectable;
use crate::extension::Extension;

/// What the scoped watch saw, in order.
#[derive(Debug)]
pub enum Seen<K> {
    /// An object was created or changed (or listed).
    Applied(K),
    /// An object was deleted, or was missing from its namespace's list.
    Deleted(K),
    /// A namespace is no longer selected: its objects have left the store, none of them
    /// reported as deleted (its twin goes whole). Only what indexes the store cares.
    Unwatched {
        /// The namespace.
        namespace: String,
    },
    /// A namespace's watch has listed it; `again` when it had listed before (a relist: its
    /// resourceVersion expired, and only the relist tells what changed in the gap).
    Listed {
        /// The namespace.
        namespace: String,
        /// Whether it had listed before.
        again: bool,
    },
    /// A watch failed; it retries with backoff.
    Error(watcher::Error),
}

/// The running scoped watch.
pub struct Scoped<K> {
    /// What it sees.
    pub seen: mpsc::Receiver<Seen<K>>,
    /// The namespaces whose objects are in the store: listed at least once and still watched.
    pub listed: watch::Receiver<BTreeSet<String>>,
}

/// One namespace's event, tagged with the watch that produced it.
type Tagged<K> = (String, u64, Result<watcher::Event<K>, watcher::Error>);

/// Starts watching the namespaces `extension` selects, filling `writer`'s store.
pub fn spawn<K: Reflectable>(
    client: kube::Client,
    api: K::DynamicType,
    extension: watch::Receiver<Extension>,
    writer: Writer<K>,
    shutdown: CancellationToken,
) -> Scoped<K> {
    let (seen_tx, seen) = mpsc::channel(1024);
    let (listed_tx, listed) = watch::channel(BTreeSet::new());
    let merger = Merger {
        client,
        api,
        writer,
        seen: seen_tx,
        listed: listed_tx,
        watches: BTreeMap::new(),
        listing: HashMap::new(),
        listed_once: HashSet::new(),
        next_id: 0,
    };
    tokio::spawn(merger.run(extension, shutdown));
    Scoped { seen, listed }
}

/// What the forge never reads need not be kept for every object.
fn strip<K: Reflectable>(obj: &mut K) {
    refract_shared::stored::without_managed_fields(obj);
    obj.annotations_mut().remove(LAST_APPLIED_ANNOTATION);
}

struct Merger<K: Reflectable> {
    client: kube::Client,
    /// How the API names the kind.
    api: K::DynamicType,
    writer: Writer<K>,
    seen: mpsc::Sender<Seen<K>>,
    listed: watch::Sender<BTreeSet<String>>,
    /// Watched namespaces: the id of their current watch, and its stop.
    watches: BTreeMap<String, (u64, CancellationToken)>,
    /// Names a namespace's list has given so far, while it lists.
    listing: HashMap<String, HashSet<String>>,
    /// Namespaces that have listed at least once since they were last selected.
    listed_once: HashSet<String>,
    next_id: u64,
}

impl<K: Reflectable> Merger<K> {
    async fn run(mut self, mut extension: watch::Receiver<Extension>, shutdown: CancellationToken) {
        // Ready at once, empty: the store holds a namespace's objects once it has listed.
        self.writer.apply_watcher_event(&watcher::Event::Init);
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        let (events_tx, mut events) = mpsc::channel::<Tagged<K>>(1024);
        loop {
            let selected = extension.borrow_and_update().selected.clone();
            for namespace in self.follow(&selected, &events_tx, &shutdown) {
                if self.seen.send(Seen::Unwatched { namespace }).await.is_err() {
                    return;
                }
            }
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = extension.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        break;
                    }
                    Some((ns, id, event)) = events.recv() => {
                        // Events a stopped watch sent before it stopped are of no namespace
                        // the store keeps.
                        if self.watches.get(&ns).map(|(current, _)| *current) != Some(id) {
                            continue;
                        }
                        if self.on_event(ns, event).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Starts watching newly selected namespaces, and stops watching (and forgets the objects
    /// of) those no longer selected, which it returns.
    fn follow(
        &mut self,
        selected: &BTreeSet<String>,
        events: &mpsc::Sender<Tagged<K>>,
        shutdown: &CancellationToken,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .watches
            .keys()
            .filter(|ns| !selected.contains(*ns))
            .cloned()
            .collect();
        for ns in &gone {
            if let Some((_, stop)) = self.watches.remove(ns) {
                stop.cancel();
            }
            self.listing.remove(ns);
            self.listed_once.remove(ns);
            self.listed.send_if_modified(|listed| listed.remove(ns));
            // Out of the store, without telling the reflector: the namespace's twin goes with
            // everything in it, and no object of it is reflected any more.
            for obj in self.objects_in(ns) {
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete((*obj).clone()));
            }
            tracing::debug!(kind = K::kind(&self.api).as_ref(), namespace = %ns, "namespace no longer watched");
        }
        for ns in selected {
            if self.watches.contains_key(ns) {
                continue;
            }
            self.next_id += 1;
            let stop = shutdown.child_token();
            self.watches
                .insert(ns.clone(), (self.next_id, stop.clone()));
            let api = K::api_in(self.client.clone(), ns, &self.api);
            tokio::spawn(watch_one(
                api,
                ns.clone(),
                self.next_id,
                events.clone(),
                stop,
            ));
            tracing::debug!(kind = K::kind(&self.api).as_ref(), namespace = %ns, "watching namespace");
        }
        gone
    }

    /// Applies one namespace's event to the store and tells the reflector. Fails only when the
    /// reflector is gone.
    async fn on_event(
        &mut self,
        ns: String,
        event: Result<watcher::Event<K>, watcher::Error>,
    ) -> Result<(), ()> {
        let seen = match event {
            Err(error) => Seen::Error(error),
            Ok(watcher::Event::Init) => {
                self.listing.insert(ns, HashSet::new());
                return Ok(());
            }
            Ok(watcher::Event::InitApply(obj)) => {
                self.listing.entry(ns).or_default().insert(obj.name_any());
                self.apply(watcher::Event::Apply(obj))
            }
            Ok(event @ (watcher::Event::Apply(_) | watcher::Event::Delete(_))) => self.apply(event),
            Ok(watcher::Event::InitDone) => {
                let names = self.listing.remove(&ns).unwrap_or_default();
                for obj in self.objects_in(&ns) {
                    if !names.contains(&obj.name_any()) {
                        let seen = self.apply(watcher::Event::Delete((*obj).clone()));
                        self.seen.send(seen).await.map_err(drop)?;
                    }
                }
                let again = !self.listed_once.insert(ns.clone());
                self.listed
                    .send_if_modified(|listed| listed.insert(ns.clone()));
                Seen::Listed {
                    namespace: ns,
                    again,
                }
            }
        };
        self.seen.send(seen).await.map_err(drop)
    }

    /// Applies a change to the store; what to tell the reflector of it.
    fn apply(&mut self, event: watcher::Event<K>) -> Seen<K> {
        self.writer.apply_watcher_event(&event);
        match event {
            watcher::Event::Delete(obj) => Seen::Deleted(obj),
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => Seen::Applied(obj),
            watcher::Event::Init | watcher::Event::InitDone => {
                unreachable!("only object events are applied one by one")
            }
        }
    }

    fn objects_in(&self, ns: &str) -> Vec<std::sync::Arc<K>> {
        self.writer
            .as_reader()
            .state()
            .into_iter()
            .filter(|obj| obj.namespace().as_deref() == Some(ns))
            .collect()
    }
}

/// Watches one namespace until `stop`, sending its events tagged with `id`.
async fn watch_one<K: Reflectable>(
    api: Api<K>,
    ns: String,
    id: u64,
    events: mpsc::Sender<Tagged<K>>,
    stop: CancellationToken,
) {
    let mut stream = watcher(api, watcher::Config::default())
        .backoff(crate::watch_backoff::watch_backoff())
        .modify(strip::<K>)
        .boxed();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = stream.next() => match event {
                Some(event) => event,
                None => return,
            },
        };
        if events.send((ns.clone(), id, event)).await.is_err() {
            return;
        }
    }
}
