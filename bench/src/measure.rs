//! What the benchmark observes on the provider: writes and first sightings (a watch on the
//! provider, as a user would see the objects arrive). Memory and CPU time are in
//! [`refract_bench::procfs`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

#[derive(Default)]
struct Seen {
    /// `kind/name` → when the provider watch first showed it.
    first: HashMap<String, Instant>,
    /// `kind/name` of objects present now.
    present: std::collections::HashSet<String>,
    /// Every change the watch reported (creations, updates, deletions): provider writes.
    writes: u64,
}

/// A watch of ConfigMaps and Services in one provider namespace.
#[derive(Clone, Default)]
pub struct ProviderWatch {
    seen: Arc<Mutex<Seen>>,
}

impl ProviderWatch {
    /// Starts watching `namespace` on the provider; returns once both watches have listed.
    pub async fn start(client: kube::Client, namespace: &str) -> Self {
        let w = Self::default();
        let (a, b) = (
            w.spawn::<ConfigMap>(client.clone(), namespace),
            w.spawn::<Service>(client, namespace),
        );
        let _ = tokio::join!(a, b);
        w
    }

    fn spawn<K>(&self, client: kube::Client, namespace: &str) -> tokio::sync::oneshot::Receiver<()>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let seen = self.seen.clone();
        let api: Api<K> = Api::namespaced(client, namespace);
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let now = Instant::now();
                let mut s = seen.lock().expect("seen poisoned");
                match event {
                    Ok(watcher::Event::Apply(o)) => {
                        let key = format!("{}/{}", K::kind(&()), o.name_any());
                        s.writes += 1;
                        s.first.entry(key.clone()).or_insert(now);
                        s.present.insert(key);
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        s.writes += 1;
                        s.present
                            .remove(&format!("{}/{}", K::kind(&()), o.name_any()));
                    }
                    Ok(watcher::Event::InitApply(o)) => {
                        s.present
                            .insert(format!("{}/{}", K::kind(&()), o.name_any()));
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Init) | Err(_) => {}
                }
            }
        });
        ready_rx
    }

    /// Provider writes seen so far.
    pub fn writes(&self) -> u64 {
        self.seen.lock().expect("seen poisoned").writes
    }

    /// How many objects of `kind` whose name starts with `prefix` exist now.
    pub fn present(&self, kind: &str, prefix: &str) -> usize {
        let p = format!("{kind}/{prefix}");
        let s = self.seen.lock().expect("seen poisoned");
        s.present.iter().filter(|k| k.starts_with(&p)).count()
    }

    /// When `kind/name` was first seen.
    pub fn first_seen(&self, kind: &str, name: &str) -> Option<Instant> {
        let s = self.seen.lock().expect("seen poisoned");
        s.first.get(&format!("{kind}/{name}")).copied()
    }

    /// Waits until `check` holds, polling; fails after `within`.
    pub async fn until(
        &self,
        within: Duration,
        what: &str,
        check: impl Fn(&Self) -> bool,
    ) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + within;
        loop {
            if check(self) {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                anyhow::bail!("timed out after {within:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
