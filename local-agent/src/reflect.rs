//! One reflector per kind: watch origin objects, forge the provider's desired state, send it.
//!
//! Watch → store → coalescing queue → `workers` tasks, level-triggered: a worker reads the
//! object's current state from the store and sends what the provider should hold (Upsert),
//! or removes it (Delete), through the [`crate::outbox`], which remembers what the current
//! session was sent, so an unchanged object is not re-sent. On each new session the reflector
//! re-sends every object of each extended namespace and then `SnapshotComplete`, after which
//! the remote agent removes that namespace's objects the origin no longer has.

mod answers;
pub mod dependencies;
pub mod followers;
pub mod origin_nodes;
pub use refract_shared::work_queue as queue;
pub mod scoped;
mod snapshot;
pub mod start;
mod workers;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef as StoreRef, Store};
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use refract_core::backoff::PerKey;
use refract_core::forge::{self, Context, Decision};
use refract_core::json;
use refract_core::keys::SERVICE_NAME_LABEL;
use refract_core::options::{Kind, ReflectionOptions};
use refract_shared::journey::TARGET as JOURNEY;
use refract_wire::proto::{ObjectRef, Upsert};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::extension::Extension;
use crate::key::Key;
use crate::outbox::{Origin, Outbox, Producer};
use crate::recorder::publish_event;
use dependencies::{Dependencies, ServicesListed};
use followers::Followers;
use origin_nodes::OriginNodes;
use queue::{Claimed, WorkQueue};

/// How long before a transiently failed object is retried.
/// Retries after a transient failure on the provider wait 2.5–5 s, doubling up to 5 min: fewer
/// than 12 attempts a minute per object under steady failure.
const RETRY_MIN: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// What every reflector shares.
#[derive(Clone)]
pub struct Shared {
    /// The reflection options in force.
    pub options: crate::settings::LiveOptions,
    /// The current session and extended namespaces.
    pub extension: watch::Receiver<Extension>,
    /// Origin nodes (for EndpointSlices).
    pub nodes: Store<Node>,
    /// Whether the origin nodes are all in [`Shared::nodes`]: slices are not forged before,
    /// or their endpoints would be dropped as on unknown nodes.
    pub nodes_listed: watch::Receiver<bool>,
    /// Origin Services (for EndpointSlice policy inheritance).
    pub services: Store<Service>,
    /// Whose Services are all in [`Shared::services`].
    pub services_listed: watch::Receiver<ServicesListed>,
    /// Records events on origin objects.
    pub recorder: Recorder,
    /// Relists of origin watches, by kind (`refract_local_watch_relists`).
    pub relists: Family<Vec<(&'static str, &'static str)>, Counter>,
}

/// A running reflector for origin objects of type `K`.
pub struct Reflector<K: Reflectable> {
    /// The kind reflected.
    kind: Kind,
    /// How the API names it, for `K` whose type does not say (custom kinds).
    api: K::DynamicType,
    store: Store<K>,
    /// The namespaces whose objects are all in the store (see [`scoped`]).
    listed: watch::Receiver<BTreeSet<String>>,
    /// Keys waiting for a worker.
    pub queue: WorkQueue<Key>,
    /// What the current session was sent, shared with every producer.
    outbox: Outbox,
    shared: Shared,
    /// Objects the provider failed to apply for now, and how long each waits to retry.
    retries: PerKey<Key>,
    /// Told of every object the watch applies: other reflectors whose objects depend on these
    /// (EndpointSlices on their Service), so the kind is watched once.
    followers: Followers<K>,
    /// The objects by what their forge reads besides them, for a kind whose forge does
    /// (EndpointSlices: their Service and nodes).
    dependencies: Option<Dependencies>,
    /// The worker tasks, as many as the options in force say.
    workers: workers::Workers,
    /// Every task of this reflector that may send to the provider (watch, workers, snapshot
    /// and options followers): turning the kind off waits for them to end ([`Self::stopped`]).
    tasks: TaskTracker,
}

/// Object types a reflector can watch: the built-in kinds' types, which the forge knows by
/// type, and [`DynamicObject`] for custom kinds, whose API and rules come with their [`Kind`].
pub trait Reflectable:
    Resource<DynamicType: Clone + Eq + std::hash::Hash + Send + Sync + Unpin + 'static>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The API of these objects in `namespace`, named as `api` says.
    fn api_in(client: kube::Client, namespace: &str, api: &Self::DynamicType) -> Api<Self>;

    /// Forges the provider's object of this origin object, of `kind`.
    fn forge_as(&self, kind: Kind, ctx: &Context<'_>) -> Result<Decision, forge::ForgeError>;

    /// The origin nodes the forge of this object reads (see [`forge::Forgeable::nodes_read`]).
    fn nodes_read_by_forge(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// The built-in kinds: typed objects, forged by their type's rules.
macro_rules! typed_reflectable {
    ($($t:ty),* $(,)?) => {$(
        impl Reflectable for $t {
            fn api_in(client: kube::Client, namespace: &str, _: &()) -> Api<Self> {
                Api::namespaced(client, namespace)
            }

            fn forge_as(&self, _: Kind, ctx: &Context<'_>) -> Result<Decision, forge::ForgeError> {
                forge::Forgeable::forge(self, ctx)
            }

            fn nodes_read_by_forge(&self) -> Vec<&str> {
                forge::Forgeable::nodes_read(self)
            }
        }
    )*};
}

typed_reflectable!(
    k8s_openapi::api::core::v1::ConfigMap,
    k8s_openapi::api::core::v1::Secret,
    Service,
    k8s_openapi::api::networking::v1::Ingress,
    k8s_openapi::api::discovery::v1::EndpointSlice,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
);

/// Custom kinds: objects as JSON, forged by the custom kinds' rules.
impl Reflectable for DynamicObject {
    fn api_in(client: kube::Client, namespace: &str, api: &ApiResource) -> Api<Self> {
        Api::namespaced_with(client, namespace, api)
    }

    fn forge_as(&self, kind: Kind, ctx: &Context<'_>) -> Result<Decision, forge::ForgeError> {
        forge::custom::forge(kind, &json::to_value(self), ctx)
    }
}

/// Starts the reflector of `kind`, whose objects the API names as `api` says. Its watch fills
/// `store` (a new one when `None`: pass one that others read too). Started while the settings
/// have the kind off (0 workers), it withdraws every copy instead of reflecting (`reconcile`);
/// `start` decides when a kind gets a reflector at all.
pub fn spawn<K: Reflectable>(
    client: kube::Client,
    (kind, api): (Kind, K::DynamicType),
    shared: Shared,
    outbox: &Outbox,
    store: Option<(Store<K>, reflector::store::Writer<K>)>,
    shutdown: CancellationToken,
) -> Arc<Reflector<K>> {
    let workers = shared.options.current().kind(kind).workers;
    let (store, writer) = store.unwrap_or_else(|| {
        let writer = reflector::store::Writer::new(api.clone());
        (writer.as_reader(), writer)
    });
    let scoped::Scoped {
        seen: mut events,
        listed,
    } = scoped::spawn(
        client,
        api.clone(),
        shared.extension.clone(),
        writer,
        shutdown.clone(),
    );
    let r = Arc::new(Reflector {
        kind,
        api,
        store,
        listed,
        queue: WorkQueue::new(),
        outbox: outbox.clone(),
        shared,
        retries: PerKey::new(RETRY_MIN, RETRY_MAX),
        followers: Followers::default(),
        dependencies: Dependencies::of(kind),
        workers: workers::Workers::default(),
        tasks: TaskTracker::new(),
    });
    outbox.register(Producer::Objects(kind), r.clone());

    let watch_task = {
        let r = r.clone();
        async move {
            while let Some(event) = events.recv().await {
                match event {
                    scoped::Seen::Applied(obj) => {
                        tracing::debug!(target: "refract::trace", name = %obj.name_any(), "seen");
                        if let Some(dependencies) = &r.dependencies {
                            dependencies.applied(&obj);
                        }
                        r.enqueue_object(&obj);
                        r.followers.tell(&obj);
                    }
                    scoped::Seen::Deleted(obj) => {
                        if let Some(dependencies) = &r.dependencies {
                            dependencies.deleted(&obj);
                        }
                        r.enqueue_object(&obj);
                    }
                    scoped::Seen::Unwatched { namespace } => {
                        if let Some(dependencies) = &r.dependencies {
                            dependencies.forget_namespace(&namespace);
                        }
                    }
                    // The scoped watch has reported what the list no longer had as deleted;
                    // everything of the namespace the session was sent is re-checked too.
                    scoped::Seen::Listed { namespace, again } => {
                        if again {
                            r.relisted(&namespace);
                        }
                        r.enqueue_sent(&namespace);
                    }
                    scoped::Seen::Error(error) => {
                        tracing::warn!(kind = r.kind.kind(), %error, "watch error; retrying")
                    }
                }
            }
        }
    };
    r.spawn_until(shutdown.clone(), watch_task);
    r.resize(workers, &shutdown);
    let r2 = r.clone();
    r.spawn_until(shutdown.clone(), async move { r2.follow_extension().await });
    let r3 = r.clone();
    r.spawn_until(shutdown.clone(), async move {
        r3.follow_options(shutdown).await
    });
    r
}

/// `task` until `shutdown` is cancelled: once it is, the task takes no further step (the
/// cancellation is looked at first), so nothing it would send goes after it.
async fn until(shutdown: CancellationToken, task: impl std::future::Future<Output = ()>) {
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {}
        _ = task => {}
    }
}

impl<K: Reflectable> Reflector<K> {
    /// Runs one of this reflector's tasks until `shutdown` is cancelled, counted in
    /// [`Self::stopped`].
    fn spawn_until(
        &self,
        shutdown: CancellationToken,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.spawn(until(shutdown, task));
    }

    /// Returns once every task of this reflector has ended, after its shutdown token was
    /// cancelled: from then on it sends nothing more to the provider.
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Calls `follower` with every object the watch applies from now on.
    pub fn follow(&self, follower: impl Fn(&K) + Send + Sync + 'static) {
        self.followers.add(follower);
    }

    fn enqueue_object(&self, obj: &K) {
        if let Some(namespace) = &obj.meta().namespace {
            self.enqueue(namespace, obj.name_any());
        }
    }

    /// Queues `namespace/name` if the namespace is extended.
    fn enqueue(&self, namespace: &str, name: String) {
        if self
            .shared
            .extension
            .borrow()
            .namespaces
            .contains_key(namespace)
        {
            self.queue.add(Key {
                namespace: namespace.to_string(),
                name,
            });
        }
    }

    /// Queues every object of `namespace` the current session was sent.
    fn enqueue_sent(&self, namespace: &str) {
        for key in self.outbox.keys(self.producer()) {
            if key.namespace == namespace {
                self.queue.add(key);
            }
        }
    }

    /// A namespace's watch listed everything again: its resourceVersion was too old for the API
    /// server (`410 Gone`), so events in the gap are lost and only the relist tells what
    /// changed.
    fn relisted(&self, namespace: &str) {
        tracing::info!(
            kind = self.kind.kind(),
            %namespace,
            "origin watch relisted (its resourceVersion expired); re-checking every object"
        );
        self.shared
            .relists
            .get_or_create(&vec![("kind", self.kind.kind())])
            .inc();
    }

    fn producer(&self) -> Producer {
        Producer::Objects(self.kind)
    }

    /// The store's reference to `namespace/name`.
    fn store_ref(&self, namespace: &str, name: &str) -> StoreRef<K> {
        StoreRef::new_with(name, self.api.clone()).within(namespace)
    }

    fn origin(&self, key: &Key) -> Origin {
        Origin::new(self.producer(), key.clone())
    }

    /// The origin object `namespace/name`, as last seen.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&self.store_ref(namespace, name))
    }

    /// Queues the objects of `namespace` that follow its Service `service` (EndpointSlices);
    /// none for a kind that follows nothing.
    pub fn enqueue_following(&self, namespace: &str, service: &str) {
        let Some(dependencies) = &self.dependencies else {
            return;
        };
        for name in dependencies.following(namespace, service) {
            self.enqueue(namespace, name);
        }
    }

    /// Queues the objects whose endpoints name origin node `node` (EndpointSlices), whose site
    /// may have changed; none for a kind that reads no nodes.
    pub fn enqueue_on_node(&self, node: &str) {
        let Some(dependencies) = &self.dependencies else {
            return;
        };
        for (namespace, name) in dependencies.on_node(node) {
            self.enqueue(&namespace, name);
        }
    }

    /// Whether what the forge of `namespace`'s objects reads besides them is all in: the
    /// origin nodes and the namespace's Services, for a kind whose forge reads them.
    fn inputs_listed(&self, namespace: &str) -> bool {
        self.dependencies.is_none()
            || (*self.shared.nodes_listed.borrow()
                && self.shared.services_listed.borrow().covers(namespace))
    }

    /// The namespaces whose objects are all in the store: listed at least once and still
    /// watched.
    pub fn listed(&self) -> watch::Receiver<BTreeSet<String>> {
        self.listed.clone()
    }

    /// Brings the provider in line with the current state of one object.
    async fn reconcile(&self, claim: &Claimed<Key>) {
        let key: &Key = claim;
        if !self.inputs_listed(&key.namespace) {
            // Neither sent nor deleted: the first snapshot, which waits for the inputs,
            // reconciles every object.
            return;
        }
        let extension = self.shared.extension.borrow().clone();
        let Some(session) = extension.session.as_ref() else {
            return;
        };
        let Some(remote_ns) = extension.namespaces.get(&key.namespace) else {
            self.outbox.forget(&self.origin(key));
            return;
        };
        if !self.listed.borrow().contains(&key.namespace) {
            // Not in the store yet is not deleted: the namespace's list queues every object
            // of it, and every one that was sent, when it is in.
            return;
        }
        // One version of the options for the whole reconcile: the on/off check and the forge.
        let options = self.shared.options.current();
        if options.kind(self.kind).workers == 0 {
            // The kind was turned off while its reflector runs: its copies are withdrawn, but
            // a claim's, whose volume holds data, which stays as it is.
            if self.kind != Kind::PersistentVolumeClaim {
                self.delete_remote(session, key).await;
            }
            return;
        }
        let obj = self.store.get(&self.store_ref(&key.namespace, &key.name));
        // The change's journey, exported when tracing is on (see `refract_shared::journey`).
        let journey = tracing::trace_span!(
            target: JOURNEY,
            parent: None,
            "reflect",
            kind = self.kind.kind(),
            namespace = %key.namespace,
            name = %key.name,
            queued_ms = refract_shared::journey::millis_since(claim.noticed()),
        );
        let forged = obj.as_ref().map(|obj| {
            let _forging =
                tracing::trace_span!(target: JOURNEY, parent: &journey, "forge").entered();
            self.forge(obj, remote_ns, &options)
        });
        let decision = match (&obj, forged) {
            (Some(obj), Some(forged)) => match forged {
                Ok(d) => Some((obj, d)),
                Err(error) => {
                    tracing::warn!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, %error, "cannot reflect object");
                    let note = format!("cannot reflect: {error}");
                    publish_event(
                        &self.shared.recorder,
                        obj.object_ref(&self.api),
                        EventType::Warning,
                        "FailedReflection",
                        note,
                    )
                    .await;
                    return;
                }
            },
            _ => None,
        };
        match decision {
            Some((obj, Decision::Reflect(desired))) => {
                // What was sent is told apart by the hash of the bytes sent.
                let json = json::to_vec(&desired.object);
                if let Err(too_large) = refract_core::limits::check_object_size(json.len()) {
                    // Never sent: the remote agent would refuse it anyway. The copy on the
                    // provider, if any, stays as it was; the object is sent once it shrinks.
                    tracing::warn!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, %too_large, "object not reflected");
                    publish_event(
                        &self.shared.recorder,
                        obj.object_ref(&self.api),
                        EventType::Warning,
                        "FailedReflection",
                        format!("cannot reflect: {too_large}"),
                    )
                    .await;
                    return;
                }
                let remote = ObjectRef {
                    api_version: self.kind.api_version().into(),
                    kind: self.kind.kind().into(),
                    namespace: desired.namespace.clone(),
                    name: desired.name.clone(),
                };
                let upsert = Upsert {
                    object: Some(remote),
                    revision: obj.resource_version().unwrap_or_default(),
                    object_json: json,
                    origin_uid: obj.uid().unwrap_or_default(),
                    awaited: false,
                    trace_parent: refract_shared::journey::traceparent(&journey),
                };
                let handing = tracing::trace_span!(target: JOURNEY, parent: &journey, "outbox");
                if !self
                    .outbox
                    .upsert(session, self.origin(key), upsert, claim.noticed())
                    .instrument(handing)
                    .await
                {
                    return;
                }
                tracing::debug!(target: "refract::trace", name = %key.name, "sent");
            }
            Some((_, Decision::Skip { reason })) => {
                tracing::debug!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, %reason, "not reflected");
                self.delete_remote(session, key).await;
            }
            None => self.delete_remote(session, key).await,
        }
    }

    async fn delete_remote(&self, session: &crate::link::SessionTx, key: &Key) {
        self.outbox.delete(session, &self.origin(key), None).await;
    }

    fn forge(
        &self,
        obj: &K,
        remote_ns: &str,
        options: &ReflectionOptions,
    ) -> Result<Decision, forge::ForgeError> {
        let nodes = OriginNodes {
            store: &self.shared.nodes,
            remote_cluster_id: &options.remote_cluster_id,
        };
        let service = if self.kind == Kind::EndpointSlice {
            obj.labels().get(SERVICE_NAME_LABEL).and_then(|svc| {
                self.shared
                    .services
                    .get(&StoreRef::new(svc).within(&obj.namespace().unwrap_or_default()))
            })
        } else {
            None
        };
        let ctx = Context {
            options,
            remote_namespace: remote_ns,
            service: service.as_deref(),
            nodes: &nodes,
        };
        obj.forge_as(self.kind, &ctx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A task woken by its cancellation must not take one more step first: that step could
    /// send an Upsert after the Deletes of a kind turned off.
    #[tokio::test]
    async fn a_cancelled_task_takes_no_further_step() {
        let steps = Arc::new(AtomicU32::new(0));
        for _ in 0..64 {
            let shutdown = CancellationToken::new();
            shutdown.cancel();
            let counted = steps.clone();
            until(shutdown, async move {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .await;
        }
        assert_eq!(steps.load(Ordering::SeqCst), 0);
    }
}
