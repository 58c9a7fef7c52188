//! Keeps exactly one pod per ShadowPod, whether or not its tenant is connected.
//!
//! A deleted pod (eviction, node loss, a person) is re-created from the ShadowPod and the
//! re-creation counted in its status, so the origin can raise its restart counts. A pod that
//! finished (`Succeeded`/`Failed`), here or at the origin, is never re-created. Deleting the
//! ShadowPod removes the pod through its owner reference. A running pod's spec never changes;
//! its labels and annotations follow the ShadowPod's ([`metadata`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::backoff::PerKey;
use refract_core::keys::{
    DESTINATION_LABEL, MANAGED_BY_LABEL, ORIGIN_FINISHED_ANNOTATION, ORIGIN_LABEL,
    SHADOWPOD_FIELD_MANAGER,
};
use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_shared::work_queue::WorkQueue;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::apply::desired::DesiredStore;
use crate::identity::Identities;
use crate::objects::Feed;
use crate::packed_strs::Pairs;
use crate::shadowpod::{ShadowPodStatus, FAILED_CREATE};
use status_writer::{OwnWrites, StatusWriter};

pub mod kept_meta;
pub mod kept_shadow;
pub mod metadata;
mod projection;
pub mod provider_pod;
mod status_writer;
#[cfg(test)]
mod tests;

pub use kept_shadow::{KeptShadowPod, WatchedShadowPod};
pub use provider_pod::ProviderPod;

/// The value of [`MANAGED_BY_LABEL`] on the pods the controller created.
pub const MANAGED_BY_SHADOWPOD: &str = "shadowpod";

/// The stores the controller keeps, shared with the status stream, capacity and the kubelet
/// calls: the provider's one watch of ShadowPods and its one watch of pods.
#[derive(Clone)]
pub struct Stores {
    /// ShadowPods destined to this provider, as much of each as is read ([`KeptShadowPod`]).
    pub shadows: Store<KeptShadowPod>,
    /// Every pod of the provider, as much of it as is read ([`ProviderPod`]): capacity
    /// subtracts every pod's requests, so the pods of ShadowPods (labelled
    /// [`MANAGED_BY_LABEL`] = [`MANAGED_BY_SHADOWPOD`], owned by their ShadowPod) are read from
    /// the same store rather than watched a second time.
    pub pods: Store<ProviderPod>,
    /// `(namespace, name)` of every ShadowPod or pod of a ShadowPod that changed, for the
    /// status stream.
    pub changed: ChangedKeys,
    /// Woken when any pod changes, for capacity.
    pub pods_changed: Arc<Notify>,
    /// True once both stores have listed (see [`Stores::listed`]).
    pub ready: watch::Receiver<bool>,
    /// True once the pod store has listed (see [`Stores::pods_listed`]).
    pub pods_ready: watch::Receiver<bool>,
}

impl Stores {
    /// Waits until both stores have listed. Readers wait here, never on a store itself: a
    /// store's readiness wakes only the last of several tasks waiting on it at once (kube's
    /// `Store::wait_until_ready` keeps one waker), so one task waits on each store and tells
    /// the others.
    pub async fn listed(&self) {
        let _ = self.ready.clone().wait_for(|listed| *listed).await;
    }

    /// Waits until the pod store has listed, whatever becomes of the ShadowPods' watch: capacity
    /// needs the pods only, and must not wait on a ShadowPod CRD the provider may lack.
    pub async fn pods_listed(&self) {
        let _ = self.pods_ready.clone().wait_for(|listed| *listed).await;
    }
}

/// Keys of objects that changed since they were last taken, and a wake-up for whoever takes
/// them; clones share them. Memory is bounded by the number of distinct objects.
#[derive(Clone, Default)]
pub struct ChangedKeys {
    keys: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>,
    notify: std::sync::Arc<tokio::sync::Notify>,
}

impl ChangedKeys {
    fn mark(&self, key: (String, String)) {
        self.keys.locked().insert(key);
        self.notify.notify_one();
    }

    /// Waits until something changed.
    pub async fn changed(&self) {
        self.notify.notified().await
    }

    /// Takes the keys that changed.
    pub fn take(&self) -> std::collections::HashSet<(String, String)> {
        std::mem::take(&mut *self.keys.locked())
    }
}

/// Starts the controller; returns its stores. Its watch of ShadowPods also feeds the tenant
/// objects' store of them (`feed`), and its status writes are recorded in `desired` as the
/// agent's own (see `status_writer`). The stores are kept on every replica; pods are created
/// and ShadowPods' status written only while `leading` (one replica runs the work that spans
/// tenants), and everything is checked again when it starts leading. A tenant served by
/// another replica has its desired store there, which this record does not reach: that
/// replica's restorer still answers these status writes with a no-op apply.
pub fn spawn(
    identities: Identities,
    provider: &ClusterId,
    workers: usize,
    feed: Feed,
    desired: DesiredStore,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) -> Stores {
    // Both stores are kept as `reflect` would keep them, which asks for a whole `Resource`
    // where a store needs only the identity its projection gives it (`Lookup`).
    let (shadows, mut shadows_writer) = reflector::store::<KeptShadowPod>();
    let (pods, mut pods_writer) = reflector::store::<ProviderPod>();
    let (key_tx, mut key_rx) = mpsc::channel::<(String, String)>(1024);
    let client = identities.own().clone();

    let own_writes = OwnWrites {
        desired,
        restorer: feed.clone(),
    };
    let shadow_events = feed
        .feeding(
            // Every pod is kept twice, as its ShadowPod and as itself: only what is read of
            // each stays (memory per pod), and the ShadowPod is decoded as that directly.
            watcher(
                Api::<WatchedShadowPod>::all(client.clone()),
                watcher::Config::default().labels(&format!("{DESTINATION_LABEL}={provider}")),
            )
            .default_backoff(),
        )
        .map_ok(kept_shadow::kept)
        .inspect_ok(move |event| shadows_writer.apply_watcher_event(event))
        .touched_objects();
    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .map_ok(provider_pod::kept)
        .inspect_ok(move |event| pods_writer.apply_watcher_event(event))
        .touched_objects();
    let pods_changed = Arc::new(Notify::new());
    let changed = ChangedKeys::default();
    let feed = |tx: mpsc::Sender<(String, String)>| {
        let changed = changed.clone();
        move |r: Result<(String, String), watcher::Error>| {
            let tx = tx.clone();
            let changed = changed.clone();
            async move {
                match r {
                    Ok(key) => {
                        changed.mark(key.clone());
                        let _ = tx.send(key).await;
                    }
                    Err(error) => tracing::debug!(%error, "shadowpod controller watch error"),
                }
            }
        }
    };
    let shadow_feed = shadow_events
        .map(|r| r.map(|o: KeptShadowPod| (o.meta().namespace().into(), o.meta().name().into())))
        .for_each(feed(key_tx.clone()));
    // Every pod change wakes capacity; only those of ShadowPods go on to the controller.
    let pod_feed = {
        let pods_changed = pods_changed.clone();
        pod_events
            .filter(move |r| {
                pods_changed.notify_one();
                futures::future::ready(r.as_ref().map_or(true, ProviderPod::of_shadowpod))
            })
            .map(|r| r.map(|o: ProviderPod| (o.meta().namespace().into(), o.meta().name().into())))
            .for_each(feed(key_tx.clone()))
    };

    let (ready_tx, ready) = watch::channel(false);
    let (pods_ready_tx, pods_ready) = watch::channel(false);
    let stores = Stores {
        shadows,
        pods,
        changed,
        pods_changed,
        ready,
        pods_ready,
    };
    // The one waiter on the pod store's readiness (see `Stores::listed`).
    let pods_listing = {
        let pods = stores.pods.clone();
        async move {
            let _ = pods.wait_until_ready().await;
            pods_ready_tx.send_replace(true);
            // Readers wait on the channel, which closes with this task.
            futures::future::pending::<()>().await
        }
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "refract-remote-agent".into(),
            instance: Some(provider.to_string()),
        },
    );
    let controller = {
        let stores = stores.clone();
        async move {
            let _ = stores.shadows.wait_until_ready().await;
            stores.pods_listed().await;
            ready_tx.send_replace(true);
            // Each ShadowPod's changes coalesce in the queue and reach one worker at a time;
            // different ShadowPods are reconciled side by side.
            let queue = WorkQueue::<(String, String)>::new();
            let retries = Arc::new(std::sync::Mutex::new(Retries::default()));
            // Retries come back on their own channel, so the intake knows a key's retry is due.
            let (due_tx, mut due_rx) = mpsc::channel::<(String, String)>(1024);
            let workers = (0..workers.max(1)).map(|_| Worker {
                queue: queue.clone(),
                retries: retries.clone(),
                due: due_tx.clone(),
                leading: leading.clone(),
                identities: identities.clone(),
                recorder: recorder.clone(),
                stores: stores.clone(),
                own_writes: own_writes.clone(),
            });
            let workers = futures::future::join_all(workers.map(Worker::run));
            let intake = async move {
                // Level-triggered: re-check everything now and then, in case an event was missed.
                let mut resync = tokio::time::interval(RESYNC);
                let mut leading_open = true;
                loop {
                    tokio::select! {
                        changed = leading.changed(), if leading_open => {
                            leading_open = changed.is_ok();
                            if leading_open && *leading.borrow_and_update() {
                                // Whatever changed while another replica led is looked at now.
                                resync.reset_immediately();
                            }
                        }
                        k = key_rx.recv() => match k { Some(k) => queue.add(k), None => return },
                        Some(k) = due_rx.recv() => {
                            retries.locked().scheduled.remove(&k);
                            queue.add(k);
                        }
                        _ = resync.tick() => {
                            // A ShadowPod waiting for its retry is left to it: a resync must not
                            // start a second chain of attempts.
                            let retries = retries.locked();
                            for s in stores.shadows.state() {
                                let key = (s.meta().namespace().into(), s.meta().name().into());
                                if !retries.scheduled.contains(&key) {
                                    queue.add(key);
                                }
                            }
                        }
                    }
                }
            };
            tokio::select! {
                () = intake => {}
                _ = workers => {}
            }
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = shadow_feed => {}
            _ = pod_feed => {}
            _ = pods_listing => {}
            _ = controller => {}
        }
    });
    stores
}

/// One of the controller's workers (`--pod-workers`): each reconciles one ShadowPod at a time.
struct Worker {
    queue: WorkQueue<(String, String)>,
    retries: Arc<std::sync::Mutex<Retries>>,
    due: mpsc::Sender<(String, String)>,
    leading: watch::Receiver<bool>,
    identities: Identities,
    recorder: Recorder,
    stores: Stores,
    own_writes: OwnWrites,
}

impl Worker {
    async fn run(self) {
        loop {
            let key = self.queue.next().await;
            if !*self.leading.borrow() {
                // Another replica keeps the pods; this one looks at everything once it leads.
                continue;
            }
            let (ns, name) = &*key;
            let reconciled = reconcile(
                &self.identities,
                &self.recorder,
                &self.stores,
                &self.own_writes,
                ns,
                name,
            );
            match reconciled.await {
                Ok(()) => self.retries.locked().succeeded(&key),
                Err(error) => {
                    let Some(delay) = self.retries.locked().failed(&key) else {
                        continue; // a retry is already scheduled
                    };
                    tracing::warn!(namespace = %ns, name = %name, %error, retry_in = ?delay, "failed to reconcile ShadowPod");
                    let due = self.due.clone();
                    let key = (*key).clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = due.send(key).await;
                    });
                }
            }
        }
    }
}

/// How often every ShadowPod is checked again.
const RESYNC: Duration = Duration::from_secs(30);
/// The first retry of a failing ShadowPod comes after 5 to 10 s, doubling up to 1 min: at most
/// 12 attempts a minute under steady failure, however many events arrive, and a pod that can be
/// created again is within a minute.
const RETRY_MIN: Duration = Duration::from_secs(10);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Per-ShadowPod retry state: its backoff, and whether a retry is already on its way.
struct Retries {
    backoffs: PerKey<(String, String)>,
    scheduled: HashSet<(String, String)>,
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            backoffs: PerKey::new(RETRY_MIN, RETRY_MAX),
            scheduled: HashSet::new(),
        }
    }
}

impl Retries {
    fn succeeded(&mut self, key: &(String, String)) {
        self.backoffs.succeeded(key);
    }

    /// The delay before the next attempt, or `None` when one is already scheduled.
    fn failed(&mut self, key: &(String, String)) -> Option<Duration> {
        if !self.scheduled.insert(key.clone()) {
            return None;
        }
        Some(self.backoffs.failed(key))
    }
}

async fn reconcile(
    identities: &Identities,
    recorder: &Recorder,
    stores: &Stores,
    own_writes: &OwnWrites,
    ns: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let Some(shadow) = stores.shadows.get(&ObjectRef::new(name).within(ns)) else {
        return Ok(()); // gone: the pod follows through its owner reference
    };
    if shadow.meta().deleting() {
        return Ok(());
    }
    let status = shadow.status.clone().unwrap_or_default();
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Ok(()); // a finished pod is never re-created
    }
    // The pod is the tenant's: written as the tenant, so the API server itself keeps it in the
    // tenant's namespaces. The ShadowPod's status is the controller's own.
    let Some(tenant) = shadow
        .meta()
        .label(ORIGIN_LABEL)
        .and_then(|t| ClusterId::parse(t).ok())
    else {
        tracing::warn!(namespace = %ns, %name, "ShadowPod without a valid {ORIGIN_LABEL} label; no pod for it");
        return Ok(());
    };
    let pods: Api<Pod> = Api::namespaced(identities.client(&tenant)?, ns);
    let shadows = StatusWriter {
        api: Api::namespaced(identities.own().clone(), ns),
        own: own_writes,
        tenant: &tenant,
        namespace: ns,
        name,
    };
    // The pod as the watch has it: every change of it (its deletion too) reconciles its
    // ShadowPod again, so a resync of every ShadowPod costs the API server nothing. Only a pod
    // the ShadowPod's status names and the store lacks is read: one created a moment ago may
    // not have reached the watch yet, and must not be counted as gone and re-created.
    let mut pod = stores.pods.get(&ObjectRef::new(name).within(ns));
    if pod.is_none() && status.pod_uid.is_some() {
        pod = pods
            .get_opt(name)
            .await?
            .map(|pod| Arc::new(ProviderPod::new(pod)));
    }
    match pod.as_deref() {
        Some(pod) if !pod.meta().deleting() => {
            if let Some(patch) = metadata::metadata_patch(pod, &pod_metadata_for(&shadow)) {
                tracing::debug!(namespace = %ns, %name, "pod labels or annotations follow the ShadowPod");
                pods.patch(name, &shadowpod_params(), &Patch::Merge(patch))
                    .await?;
            }
            let next = ShadowPodStatus {
                phase: pod.phase.clone(),
                recreations: recreations_with(&status, pod),
                pod_uid: pod.meta().uid().map(Into::into),
                ..Default::default()
            };
            if next != status {
                shadows.write(&next).await?;
            }
        }
        Some(_) => {} // terminating: re-created once it is gone
        None if shadow
            .meta()
            .annotation(ORIGIN_FINISHED_ANNOTATION)
            .is_some() =>
        {
            // The origin pod finished: whatever became of its provider pod, it never runs again.
            tracing::debug!(namespace = %ns, %name, "origin pod finished; not starting a pod");
        }
        None => {
            let recreations = status.recreations + u32::from(status.pod_uid.is_some());
            if status.pod_uid.is_some() {
                tracing::info!(namespace = %ns, %name, recreations, "pod of ShadowPod is gone; re-creating it");
            }
            // The status until a pod exists: the recreation counted, no pod named. It is
            // written with the create's outcome, not before it: a write before the create
            // held every pod back by one more round trip to the API server (2,000 pods were
            // all created 25-29 % sooner without it, measured). Should the store not have that
            // write when the pod's event comes, `recreations_with` counts it again.
            let pending = ShadowPodStatus {
                phase: Some("Pending".into()),
                recreations,
                pod_uid: None,
                ..status.clone()
            };
            // The ShadowPod's store may lag behind the status naming a pod created a moment
            // ago: a create of a pod that exists is refused, but only after the API server's
            // quota admission counted it, and the tenant's pod count stays too high until the
            // quota controller recounts (minutes). One read first.
            if status.pod_uid.is_none() && pods.get_opt(name).await?.is_some() {
                return Ok(());
            }
            let create = PostParams {
                field_manager: Some(SHADOWPOD_FIELD_MANAGER.into()),
                ..Default::default()
            };
            let created = match pods.create(&create, &pod_for(&shadow)?).await {
                Ok(p) => p,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // Someone else's pod of that name, or ours the store has not seen: the
                    // next reconcile takes it. The count must not wait for that.
                    if pending != status {
                        shadows.write(&pending).await?;
                    }
                    return Ok(());
                }
                Err(e) => {
                    // The origin pod shows why (the status goes back as a condition, the
                    // event to the pod's events), once per distinct failure.
                    let message = format!("the provider could not create the pod: {e}");
                    if pending.message.as_deref() != Some(message.as_str()) {
                        let failed = ShadowPodStatus {
                            reason: Some(FAILED_CREATE.into()),
                            message: Some(message.clone()),
                            ..pending
                        };
                        shadows.write(&failed).await?;
                        let reference = shadow.object_reference();
                        let event = Event {
                            type_: EventType::Warning,
                            reason: FAILED_CREATE.into(),
                            note: Some(message.chars().take(1000).collect()),
                            action: "CreatePod".into(),
                            secondary: None,
                        };
                        if let Err(error) = recorder.publish(&event, &reference).await {
                            tracing::warn!(%error, "failed to record event");
                        }
                    }
                    return Err(e);
                }
            };
            shadows
                .write(&ShadowPodStatus {
                    phase: Some("Pending".into()),
                    recreations,
                    pod_uid: created.uid(),
                    ..Default::default()
                })
                .await?;
        }
    }
    Ok(())
}

/// The recreations to show with `pod`, from a status that may not name it yet.
///
/// The status is written with the create's outcome, and the pod's own event can reach the
/// store before that write does: a status naming another pod (or none) is then the one the
/// create started from, since only this controller writes it. The create counted one more
/// recreation if that status named a pod; written back as it is, the stale count would undo
/// it. The same holds after a crash between a create and its status write.
fn recreations_with(status: &ShadowPodStatus, pod: &ProviderPod) -> u32 {
    match &status.pod_uid {
        Some(uid) if Some(uid.as_str()) != pod.meta().uid() => status.recreations + 1,
        _ => status.recreations,
    }
}

/// Writes of the pods' labels and annotations, under the manager their creation used.
fn shadowpod_params() -> PatchParams {
    PatchParams {
        field_manager: Some(SHADOWPOD_FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// The pod a ShadowPod stands for: its spec, and [`pod_metadata_for`].
pub fn pod_for(shadow: &KeptShadowPod) -> Result<Pod, kube::Error> {
    Ok(Pod {
        metadata: pod_metadata_for(shadow),
        spec: Some(shadow.pod_spec().map_err(kube::Error::SerdeError)?),
        status: None,
    })
}

/// The metadata of the pod a ShadowPod stands for: its labels plus the managed-by label, its
/// annotations, owned by the ShadowPod.
pub fn pod_metadata_for(shadow: &KeptShadowPod) -> kube::api::ObjectMeta {
    let map = |pairs: Pairs<'_>| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let meta = shadow.meta();
    let mut labels = map(meta.labels());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY_SHADOWPOD.into());
    let mut annotations = map(meta.annotations());
    // The ShadowPod's write bookkeeping, which changes with every write of it.
    annotations.remove(refract_core::keys::DESIRED_HASH_ANNOTATION);
    annotations.remove(refract_core::keys::ORIGIN_HASH_ANNOTATION);
    kube::api::ObjectMeta {
        name: Some(meta.name().into()),
        namespace: Some(meta.namespace().into()),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references: shadow.controller_owner_ref().map(|o| vec![o]),
        ..Default::default()
    }
}
