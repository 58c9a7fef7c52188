//! Pods bound to the virtual node: offloaded as ShadowPods, their status written back
//! ([`status`]).
//!
//! A pod in an extended namespace is sent as a ShadowPod; the provider's status comes back and
//! is written to the pod's status (IP remapped, host IP replaced, restarts raised by the
//! provider's re-creations), but only for a pod this agent sent, matched by UID. Deleting the
//! pod deletes the ShadowPod with the pod's grace period, and the local pod is finalized once
//! the provider confirms (there is no kubelet to do it). A pod bound to the virtual node in a
//! namespace that is not extended stays Pending with reason `OffloadingBackOff` if it never
//! started, and is marked Failed with reason `OffloadingAborted` if it had ([`stray`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef as StoreRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use refract_core::backoff::PerKey;
use refract_core::forge::pod::{shadow_pod, SHADOWPOD_API_VERSION};
use refract_core::forge::{Context, ForgeError};
use refract_core::inbound::address::PodAddresses;
use refract_core::json;
use refract_core::keys::LOCAL_STATUS_FIELD_MANAGER;
use refract_core::lock::Locked;
use refract_wire::proto::{ObjectRef, Outcome, PodStatus, Upsert};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::early::Early;
use crate::extension::Extension;
use crate::key::Key;
use crate::outbox::{Answer, Origin, Outbox, Producer, Recipient, Request};
use crate::recorder::{publish_drift, publish_event, QUOTA_REASON};
use crate::reflect::followers::Followers;
use crate::reflect::queue::{Claimed, Latest, WorkQueue};
use crate::settings::LiveOptions;
use crate::throttle::Throttle;
use tracing::Instrument as _;

/// Reason shown on pods the provider refused.
pub const DENIED_REASON: &str = "OffloadingDenied";
/// The longest a pod refused for quota waits before it is sent again.
const QUOTA_RETRY_MAX: Duration = Duration::from_secs(30);
/// Retries after a transient failure on the provider wait 2.5–5 s, doubling up to 5 min: fewer
/// than 12 attempts a minute per pod under steady failure.
const RETRY_MIN: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Settings of pod offloading.
#[derive(Clone)]
pub struct PodConfig {
    /// The virtual node's name.
    pub node_name: String,
    /// The host IP shown on offloaded pods.
    pub node_ip: String,
    /// Which provider pod addresses are accepted, and how they are remapped.
    pub pod_addresses: PodAddresses,
    /// Workers.
    pub workers: u32,
    /// Counts provider statuses (or parts of them) refused.
    pub refused: prometheus_client::metrics::counter::Counter,
    /// Observes creation to Running at the origin.
    pub running_latency: crate::metrics::PodRunningLatency,
    /// Observes a provider status's send to its write at the origin.
    pub status_latency: crate::metrics::PodStatusLatency,
}

#[derive(Default)]
struct State {
    /// Stray pods already marked, with their UID and the reason, so that each reason's event
    /// is recorded once per pod; forgotten with the pod.
    marked: HashMap<Key, (String, &'static str)>,
}

/// Offloads pods bound to the virtual node.
pub struct PodOffloader {
    client: kube::Client,
    config: PodConfig,
    options: LiveOptions,
    extension: watch::Receiver<Extension>,
    recorder: Recorder,
    store: Store<OriginPod>,
    queue: WorkQueue<Key>,
    /// What the current session was sent, shared with every producer.
    outbox: Outbox,
    state: Mutex<State>,
    /// Pods the provider failed to take for now, and how long each waits to retry.
    retries: PerKey<Key>,
    /// The latest provider status of each offloaded pod, by origin UID, waiting to be written.
    statuses: Latest<String, PodStatus>,
    /// The provider status last written to each offloaded pod, by origin UID: written again
    /// when the virtual node is Ready after an outage ([`readiness`]).
    written: Mutex<std::collections::HashMap<String, PodStatus>>,
    /// Statuses for pods the session has not sent yet.
    early: Mutex<Early<String, PodStatus>>,
    /// Told of every pod the watch sees change: the token reflector, so pods are watched once.
    followers: Followers<OriginPod>,
    log: Throttle,
}

mod origin_pod;
pub mod readiness;
mod status;
pub mod stray;

pub use origin_pod::OriginPod;

use status::{EARLY_STATUSES, EARLY_STATUS_BYTES};

/// Tasks writing provider pod statuses to the origin.
const STATUS_WRITERS: usize = 4;

/// Starts pod offloading.
pub fn spawn(
    client: kube::Client,
    config: PodConfig,
    options: LiveOptions,
    extension: watch::Receiver<Extension>,
    recorder: Recorder,
    outbox: &Outbox,
    shutdown: CancellationToken,
) -> Arc<PodOffloader> {
    let (store, writer) = reflector::store();
    let o = Arc::new(PodOffloader {
        client: client.clone(),
        config: config.clone(),
        options,
        extension,
        recorder,
        store,
        queue: WorkQueue::new(),
        outbox: outbox.clone(),
        state: Mutex::new(State::default()),
        retries: PerKey::new(RETRY_MIN, RETRY_MAX),
        statuses: Latest::default(),
        written: Mutex::default(),
        early: Mutex::new(Early::new(EARLY_STATUSES, EARLY_STATUS_BYTES)),
        log: Throttle::new(Duration::from_secs(10)),
        followers: Followers::default(),
    });
    outbox.register(Producer::Pods, o.clone());
    // Decoded straight into what the store keeps (`OriginPod`): the wide `Pod` is built only
    // when a reader needs its spec.
    let api: Api<OriginPod> = Api::all(client);
    let watch_config =
        watcher::Config::default().fields(&format!("spec.nodeName={}", config.node_name));
    let w = o.clone();
    let watch_task = async move {
        let mut events = watcher(api, watch_config)
            .backoff(crate::watch_backoff::watch_backoff())
            .reflect(writer)
            .touched_objects()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(pod) => {
                    w.queue.add(key_of(&pod));
                    w.followers.tell(&pod);
                }
                Err(error) => tracing::warn!(%error, "pod watch error; retrying"),
            }
        }
    };
    let mut tasks: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
        vec![Box::pin(watch_task)];
    for _ in 0..config.workers.max(1) {
        let w = o.clone();
        tasks.push(Box::pin(async move {
            loop {
                let key = w.queue.next().await;
                w.reconcile(&key).await;
                drop(key);
            }
        }));
    }
    let f = o.clone();
    tasks.push(Box::pin(async move { f.follow_extension().await }));
    let s = o.clone();
    tasks.push(Box::pin(async move { s.follow_options().await }));
    let r = o.clone();
    tasks.push(Box::pin(async move { r.retry_early().await }));
    for _ in 0..STATUS_WRITERS {
        let w = o.clone();
        tasks.push(Box::pin(async move { w.write_statuses().await }));
    }
    for task in tasks {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = task => {}
            }
        });
    }
    o
}

/// Every status write of offloaded pods names one field manager, so `managedFields` show
/// which fields the provider's status owns at the origin.
fn status_params() -> PatchParams {
    PatchParams {
        field_manager: Some(LOCAL_STATUS_FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn origin(key: &Key) -> Origin {
    Origin::new(Producer::Pods, key.clone())
}

fn key_of(pod: &OriginPod) -> Key {
    Key {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    }
}

impl PodOffloader {
    /// The pods bound to the virtual node, as the watch sees them.
    pub fn pods(&self) -> Store<OriginPod> {
        self.store.clone()
    }

    /// Calls `follower` with every pod the watch sees change (or go) from now on.
    pub fn follow(&self, follower: impl Fn(&OriginPod) + Send + Sync + 'static) {
        self.followers.add(follower);
    }

    /// On a new session, re-sends every pod of each extended namespace, then SnapshotComplete
    /// so ShadowPods of pods deleted meanwhile are removed; any namespace change re-checks all.
    /// Forges every offloaded pod's ShadowPod again when the settings change what the forge
    /// reads (skip lists, the offloading patch): the ShadowPod takes the change at once, its
    /// provider pod when it is next created (a running pod's placement cannot change).
    async fn follow_options(&self) {
        let mut changes = self.options.changes();
        let mut last = self.options.current();
        while changes.changed().await.is_ok() {
            let now = changes.borrow_and_update().clone();
            if crate::settings::forged_differently(&last, &now) {
                let pods = self.store.state();
                tracing::info!(
                    pods = pods.len(),
                    "settings changed; forging every offloaded pod again"
                );
                for pod in pods {
                    self.queue.add(key_of(&pod));
                }
            }
            last = now;
        }
    }

    async fn follow_extension(&self) {
        let mut rx = self.extension.clone();
        let mut last = Extension::default();
        loop {
            let current = rx.borrow_and_update().clone();
            if self.store.wait_until_ready().await.is_err() {
                return;
            }
            if let Some(session) = &current.session {
                for (ns, remote_ns) in current.to_resend(&last) {
                    let pods: Vec<Key> = self
                        .store
                        .state()
                        .iter()
                        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
                        .map(|p| key_of(p))
                        .collect();
                    for key in pods {
                        let key = self.queue.claim(key).await;
                        self.reconcile(&key).await;
                    }
                    self.outbox
                        .snapshot_complete(
                            session,
                            Producer::Pods,
                            SHADOWPOD_API_VERSION,
                            &remote_ns,
                        )
                        .await;
                }
            }
            // Pods outside the extended namespaces may need OffloadingBackOff now.
            for pod in self.store.state() {
                if !current
                    .namespaces
                    .contains_key(&pod.namespace().unwrap_or_default())
                {
                    self.queue.add(key_of(&pod));
                }
            }
            last = current;
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn reconcile(&self, claim: &Claimed<Key>) {
        let key: &Key = claim;
        let extension = self.extension.borrow().clone();
        let pod = self
            .store
            .get(&StoreRef::new(&key.name).within(&key.namespace));
        if pod.is_none() {
            self.state.locked().marked.remove(key);
        }
        let Some(session) = extension.session.as_ref() else {
            return;
        };
        let Some(pod) = pod else {
            self.outbox.delete(session, &origin(key), None).await;
            return;
        };
        let Some(remote_ns) = extension.namespaces.get(&key.namespace) else {
            if pod.metadata.deletion_timestamp.is_some() {
                self.finalize_local(key, &pod.uid().unwrap_or_default())
                    .await;
            } else {
                self.back_off(key, &pod).await;
            }
            return;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            // Whether or not this session sent it, the provider may hold it from an earlier
            // one: the Delete goes out, and its confirmation finalizes the local pod.
            let grace = pod.metadata.deletion_grace_period_seconds;
            let remote = self.remote_ref(remote_ns, &key.name);
            let uid = pod.uid().unwrap_or_default();
            self.outbox
                .delete_remote(session, origin(key), remote, uid, grace)
                .await;
            return;
        }
        // Read from the kept text once: the stray rule reads its status, the forge all of it.
        let whole = match pod.pod() {
            Ok(whole) => whole,
            Err(source) => {
                let error = ForgeError::Malformed {
                    kind: "Pod",
                    source,
                };
                tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot offload pod");
                return;
            }
        };
        if stray::aborted(whole.status.as_ref()) {
            // Aborted while its namespace was not extended: never offloaded again. Not sent,
            // so the namespace's orphan collection removes a ShadowPod left from before.
            self.outbox.delete(session, &origin(key), None).await;
            return;
        }
        // The pod's journey, exported when tracing is on (see `refract_shared::journey`).
        let journey = tracing::trace_span!(
            target: refract_shared::journey::TARGET,
            parent: None,
            "reflect",
            kind = "Pod",
            namespace = %key.namespace,
            name = %key.name,
            queued_ms = refract_shared::journey::millis_since(claim.noticed()),
        );
        let options = self.options.current();
        let ctx = Context {
            options: &options,
            remote_namespace: remote_ns,
            service: None,
            nodes: &refract_core::forge::NO_NODES,
        };
        let forged = {
            let _forging =
                tracing::trace_span!(target: refract_shared::journey::TARGET, parent: &journey, "forge")
                    .entered();
            shadow_pod(&whole, &self.config.node_name, &ctx)
        };
        let shadow = match forged {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot offload pod");
                return;
            }
        };
        let upsert = Upsert {
            object: Some(self.remote_ref(remote_ns, &key.name)),
            revision: pod.resource_version().unwrap_or_default(),
            object_json: json::to_vec(&shadow),
            origin_uid: pod.uid().unwrap_or_default(),
            awaited: false,
            trace_parent: refract_shared::journey::traceparent(&journey),
        };
        let handing = tracing::trace_span!(target: refract_shared::journey::TARGET, parent: &journey, "outbox");
        self.outbox
            .upsert(session, origin(key), upsert, claim.noticed())
            .instrument(handing)
            .await;
    }

    fn remote_ref(&self, remote_ns: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: SHADOWPOD_API_VERSION.into(),
            kind: "ShadowPod".into(),
            namespace: remote_ns.into(),
            name: name.into(),
        }
    }

    /// Removes a terminating local pod once nothing runs for it on the provider.
    async fn finalize_local(&self, key: &Key, uid: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        match api
            .delete(&key.name, &finalize_params(uid.to_string()))
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(error) => {
                tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "failed to finalize pod")
            }
        }
    }

    /// Marks a pod bound to the virtual node outside an extended namespace ([`stray`]).
    async fn back_off(&self, key: &Key, pod: &OriginPod) {
        let node = &self.config.node_name;
        let ns = pod.namespace().unwrap_or_default();
        let current = pod.status();
        let (reason, status, message) = match stray::judge(current.as_ref()) {
            stray::Stray::Leave => return,
            stray::Stray::BackOff => {
                let message = format!(
                    "pod is bound to virtual node {node} but namespace {ns} is not offloaded to it; it stays Pending. To keep DaemonSets off virtual nodes, give them the node affinity liqo.io/type NotIn [virtual-node]"
                );
                let status = serde_json::json!({"phase": "Pending", "reason": stray::BACKOFF_REASON, "message": message});
                (stray::BACKOFF_REASON, status, message)
            }
            stray::Stray::Abort => {
                let message = format!(
                    "pod had started on virtual node {node} but namespace {ns} is no longer offloaded to it: nothing runs it any more, so it is marked Failed for its controller to replace"
                );
                // Not ready either, so that no Service keeps sending to it. A merge patch
                // replaces the list: the pod's other conditions are written back as they are.
                let conditions = stray::aborted_conditions(
                    current
                        .as_ref()
                        .and_then(|s| s.conditions.as_deref())
                        .unwrap_or_default(),
                    &message,
                    Time(k8s_openapi::jiff::Timestamp::now()),
                );
                let status = serde_json::json!({
                    "phase": "Failed",
                    "reason": stray::ABORTED_REASON,
                    "message": message,
                    "conditions": conditions,
                });
                (stray::ABORTED_REASON, status, message)
            }
        };
        self.write_status(pod, status).await;
        let mark = (pod.uid().unwrap_or_default(), reason);
        let first = self.state.locked().marked.insert(key.clone(), mark.clone()) != Some(mark);
        if first {
            publish_event(
                &self.recorder,
                pod.object_ref(&()),
                EventType::Warning,
                reason,
                message,
            )
            .await;
        }
    }

    async fn write_status(&self, pod: &OriginPod, status: serde_json::Value) {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        if let Err(error) = api
            .patch_status(
                &pod.name_any(),
                &status_params(),
                &Patch::Merge(serde_json::json!({"status": status})),
            )
            .await
        {
            tracing::warn!(pod = %pod.name_any(), %error, "failed to write pod status");
        }
    }
}

impl Recipient for PodOffloader {
    fn on_answer(&self, answer: Answer) {
        let key = answer.origin.key;
        match (answer.request, answer.outcome) {
            (Request::Delete, Outcome::Applied | Outcome::Unchanged) => {
                // Nothing runs for the pod on the provider any more: finalize it here, if it
                // is the pod that was deleted and still terminating.
                let terminating = self
                    .store
                    .get(&StoreRef::new(&key.name).within(&key.namespace))
                    .is_some_and(|pod| {
                        pod.metadata.deletion_timestamp.is_some()
                            && pod.uid().as_deref() == Some(answer.origin_uid.as_str())
                    });
                if terminating {
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
                    tokio::spawn(async move {
                        let _ = api
                            .delete(&key.name, &finalize_params(answer.origin_uid))
                            .await;
                    });
                }
            }
            (Request::Delete, _) => {}
            (Request::Upsert, Outcome::Applied | Outcome::Unchanged) => {
                self.retries.succeeded(&key)
            }
            (Request::Upsert, Outcome::Resend) => {
                // The outbox forgot it: reconciling it now sends it again.
                self.queue.add(key);
            }
            (Request::Upsert, Outcome::Drifted | Outcome::Quarantined) => {
                self.report_drift(&key, answer.outcome, answer.restores, &answer.message)
            }
            (Request::Upsert, Outcome::Transient) => {
                // The outbox forgot it: the retry sends it again.
                let delay = self.retries.failed(&key);
                self.queue.add_after(key, delay);
            }
            (Request::Upsert, Outcome::Denied | Outcome::Invalid | Outcome::Conflict) => {
                let message = format!(
                    "provider {:?} refused the pod: {}",
                    self.options.current().remote_cluster_id,
                    answer.message
                );
                self.show_pending(&key, DENIED_REASON, message);
            }
            (Request::Upsert, Outcome::QuotaExceeded) => {
                // The outbox forgot it: the retry sends it again, and it runs once the tenant
                // holds less. Not longer than a short wait: quota frees when pods end.
                let delay = self.retries.failed(&key).min(QUOTA_RETRY_MAX);
                // The same words every time: writing the status again then changes nothing,
                // so it does not wake this pod's reconcile and send it before the retry.
                let message = format!(
                    "provider {:?} has no room for the pod in this cluster's quota ({}); trying again",
                    self.options.current().remote_cluster_id, answer.message,
                );
                self.show_pending(&key, QUOTA_REASON, message);
                self.queue.add_after(key, delay);
            }
            (Request::Upsert, Outcome::Unspecified) => {}
        }
    }
}

impl PodOffloader {
    /// Records on the origin pod what the provider said of its ShadowPod unasked: restored
    /// after someone there changed it, or quarantined (see [`publish_drift`]).
    fn report_drift(&self, key: &Key, outcome: Outcome, restores: u32, message: &str) {
        let pod = self
            .store
            .get(&StoreRef::new(&key.name).within(&key.namespace));
        let options = self.options.current();
        let remote = options.remote_cluster_id.as_str();
        let reference = pod.map(|pod| pod.object_ref(&()));
        if let Some(reason) = publish_drift(&self.recorder, remote, reference, outcome, message) {
            tracing::warn!(namespace = %key.namespace, name = %key.name, restores, %reason, %message, "someone on the provider rewrote the pod's ShadowPod");
        }
    }

    /// Shows the origin pod `key` Pending for `reason`, with a Warning event saying why.
    fn show_pending(&self, key: &Key, reason: &'static str, message: String) {
        let Some(pod) = self
            .store
            .get(&StoreRef::new(&key.name).within(&key.namespace))
        else {
            return;
        };
        tracing::warn!(namespace = %key.namespace, name = %key.name, %message, reason, "pod not offloaded");
        let client = self.client.clone();
        let recorder = self.recorder.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(client, &key.namespace);
            let status = serde_json::json!({"status": {"phase": "Pending", "reason": reason, "message": message}});
            let _ = api
                .patch_status(&key.name, &status_params(), &Patch::Merge(status))
                .await;
            publish_event(
                &recorder,
                pod.object_ref(&()),
                EventType::Warning,
                reason,
                message,
            )
            .await;
        });
    }
}

/// Deletes a terminating pod at once, and only the one with `uid` (not a new pod of the same
/// name).
fn finalize_params(uid: String) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    }
}
