//! When a watch first saw each object of one kind in one namespace in a state of interest:
//! latencies are measured from a create call to the first sighting.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// First sightings by object name, filled by a background watch.
#[derive(Clone, Default)]
pub struct FirstSeen(Arc<Mutex<HashMap<String, Instant>>>);

impl FirstSeen {
    /// Watches `api` and records each object the first time `wanted` holds for it; returns once
    /// the watch has listed what is already there.
    pub async fn watch<K>(api: Api<K>, wanted: fn(&K) -> bool) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        Self::watch_with(api, watcher::Config::default(), wanted).await
    }

    /// Like [`FirstSeen::watch`], of the objects matching the label selector `labels` only:
    /// the API server filters the others out, so the watch does not decode them.
    pub async fn watch_selected<K>(api: Api<K>, labels: &str, wanted: fn(&K) -> bool) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        Self::watch_with(api, watcher::Config::default().labels(labels), wanted).await
    }

    async fn watch_with<K>(api: Api<K>, config: watcher::Config, wanted: fn(&K) -> bool) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let seen = Self::default();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let map = seen.0.clone();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let now = Instant::now();
                match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) if wanted(&o) => {
                        map.lock()
                            .expect("sightings")
                            .entry(o.name_any())
                            .or_insert(now);
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        let _ = ready_rx.await;
        seen
    }

    /// When `name` was first seen, if it was.
    pub fn of(&self, name: &str) -> Option<Instant> {
        self.0.lock().expect("sightings").get(name).copied()
    }

    /// How many objects whose names start with `prefix` were seen, and when the last of them was.
    pub fn with_prefix(&self, prefix: &str) -> (usize, Option<Instant>) {
        let map = self.0.lock().expect("sightings");
        let times = map
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, at)| *at);
        (times.clone().count(), times.max())
    }
}
