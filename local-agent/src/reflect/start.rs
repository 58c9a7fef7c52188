//! Starting every kind's reflector when the settings turn it on, and the Node and Service
//! stores EndpointSlices depend on.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use k8s_openapi::api::{core::v1, discovery, networking};
use kube::api::{Api, DynamicObject};
use kube::runtime::events::Recorder;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::forge::Forgeable;
use refract_core::options::{Kind, ReflectionOptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Reflectable, Reflector, Shared};

/// The reflectors other parts look objects up in.
pub struct Reflectors {
    /// Claims, for the volume intake: `None` until claims are reflected (they may be turned
    /// on while the agent runs).
    pub claims: watch::Receiver<Option<Arc<Reflector<v1::PersistentVolumeClaim>>>>,
}

/// What starting a reflector needs; its kind is its object type's.
#[derive(Clone)]
struct Start {
    client: kube::Client,
    shared: Shared,
    outbox: crate::outbox::Outbox,
    token: CancellationToken,
}

/// A built-in kind, as [`crate::reflect::spawn`] names it: by its type.
fn typed<K: Forgeable + kube::Resource<DynamicType = ()>>() -> (Kind, ()) {
    (K::KIND, ())
}

/// What a kind's reflector does while the settings have the kind off (0 workers).
#[derive(Clone, Copy, PartialEq, Eq)]
enum WhenOff {
    /// It stops: nothing else reads it (ConfigMaps, Secrets, Ingresses, custom kinds).
    Stops,
    /// It keeps running, its workers withdrawing every copy (a claim's stays), because others
    /// read its store or follow its watch (Services, EndpointSlices, claims).
    KeepsRunning,
}

/// Starts the reflector of every kind the settings have on, and of every other one the first
/// time they turn it on; also the Node and Service stores EndpointSlices need.
pub fn spawn_all(
    client: kube::Client,
    options: crate::settings::LiveOptions,
    extension: watch::Receiver<crate::extension::Extension>,
    outbox: &crate::outbox::Outbox,
    recorder: Recorder,
    relists: prometheus_client::metrics::family::Family<
        Vec<(&'static str, &'static str)>,
        prometheus_client::metrics::counter::Counter,
    >,
    token: CancellationToken,
) -> Reflectors {
    use crate::reflect::dependencies::ServicesListed;
    let (nodes, nodes_writer) = reflector::store::<v1::Node>();
    let (nodes_listed_tx, nodes_listed) = watch::channel(false);
    let (services, services_writer) = reflector::store::<v1::Service>();
    let (services_listed_tx, services_listed) = watch::channel(ServicesListed::default());
    let shared = Shared {
        options,
        extension,
        nodes,
        nodes_listed,
        services,
        services_listed,
        recorder,
        relists,
    };
    let start = Start {
        client: client.clone(),
        shared: shared.clone(),
        outbox: outbox.clone(),
        token: token.clone(),
    };
    start.reflect_while_on::<v1::ConfigMap>(typed::<v1::ConfigMap>());
    start.reflect_while_on::<v1::Secret>(typed::<v1::Secret>());
    start.reflect_while_on::<networking::v1::Ingress>(typed::<networking::v1::Ingress>());
    start.clone().follow_custom_kinds();

    // EndpointSlices read the Services of their namespace and the origin nodes. The Service
    // reflector's watch fills that Service store when Services are reflected at start (it
    // keeps running if they are turned off); otherwise a watch of its own does, started with
    // the slices. A Service reflector started later keeps a store of its own.
    let slices_slot: Arc<OnceLock<Arc<Reflector<discovery::v1::EndpointSlice>>>> = Arc::default();
    let requeue_slices = {
        let slot = slices_slot.clone();
        move |svc: &v1::Service| {
            if let (Some(slices), Some(namespace)) = (slot.get(), &svc.metadata.namespace) {
                slices.enqueue_following(namespace, &svc.name_any());
            }
        }
    };
    let services_on = shared.options.current().kind(Kind::Service).workers > 0;
    let mut own_service_watch = None;
    if services_on {
        let store = Some((shared.services.clone(), services_writer));
        let token = token.clone();
        let requeue_slices = requeue_slices.clone();
        start.keep_reflecting::<v1::Service>(store, move |services| {
            services.follow(requeue_slices);
            // The slices of a namespace wait for its Services, which the Service reflector
            // lists as it extends the namespace.
            let mut listed = services.listed();
            let token = token.clone();
            tokio::spawn(async move {
                loop {
                    let namespaces = listed.borrow_and_update().clone();
                    services_listed_tx.send_replace(ServicesListed::In(namespaces));
                    tokio::select! {
                        _ = token.cancelled() => return,
                        changed = listed.changed() => if changed.is_err() { return },
                    }
                }
            });
        });
    } else {
        own_service_watch = Some((services_writer, services_listed_tx));
        start.keep_reflecting::<v1::Service>(None, |_| {});
    }
    start.keep_reflecting::<discovery::v1::EndpointSlice>(None, move |slices| {
        let _ = slices_slot.set(slices.clone());
        if let Some((writer, listed_tx)) = own_service_watch {
            spawn_service_watch(&client, writer, listed_tx, requeue_slices, &token);
        }
        spawn_node_watch(
            &client,
            nodes_writer,
            nodes_listed_tx,
            slices.clone(),
            &token,
        );
    });
    let (claims_tx, claims) = watch::channel(None);
    start.keep_reflecting::<v1::PersistentVolumeClaim>(None, move |claims| {
        claims_tx.send_replace(Some(claims.clone()));
    });
    Reflectors { claims }
}

/// Watches every origin Service into `writer`, for EndpointSlices when Services are not
/// reflected, requeueing a Service's slices as it changes.
fn spawn_service_watch(
    client: &kube::Client,
    writer: reflector::store::Writer<v1::Service>,
    listed_tx: watch::Sender<crate::reflect::dependencies::ServicesListed>,
    requeue_slices: impl Fn(&v1::Service) + Send + 'static,
    token: &CancellationToken,
) {
    use crate::reflect::dependencies::ServicesListed;
    let watch_services = watcher(
        Api::<v1::Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .backoff(crate::watch_backoff::watch_backoff())
    .reflect(writer)
    .for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)) => requeue_slices(&svc),
            Ok(watcher::Event::InitDone) => {
                listed_tx.send_replace(ServicesListed::Everywhere);
            }
            _ => {}
        }
        futures::future::ready(())
    });
    tokio::spawn(token.clone().run_until_cancelled_owned(watch_services));
}

/// Watches the origin nodes into `writer`, requeueing the slices whose endpoints' site a
/// node's change may move.
fn spawn_node_watch(
    client: &kube::Client,
    writer: reflector::store::Writer<v1::Node>,
    listed_tx: watch::Sender<bool>,
    slices: Arc<Reflector<discovery::v1::EndpointSlice>>,
    token: &CancellationToken,
) {
    let mut sites = crate::reflect::origin_nodes::NodeSites::default();
    let watch_nodes = watcher(
        Api::<v1::Node>::all(client.clone()),
        watcher::Config::default(),
    )
    .backoff(crate::watch_backoff::watch_backoff())
    .reflect(writer)
    .for_each(move |event| {
        if let Ok(event) = event {
            if matches!(event, watcher::Event::InitDone) {
                // Before the slices are queued: they are not forged until it is set.
                listed_tx.send_replace(true);
            }
            for node in sites.changed(&event) {
                slices.enqueue_on_node(&node);
            }
        }
        futures::future::ready(())
    });
    tokio::spawn(token.clone().run_until_cancelled_owned(watch_nodes));
}

impl Start {
    /// Reflects a built-in kind whose reflector others read, from the first time the settings
    /// have it on: then `started` is called with it, and it keeps running whatever the
    /// settings say later. Its watch fills `store` when one is given.
    fn keep_reflecting<K>(
        &self,
        store: Option<(reflector::Store<K>, reflector::store::Writer<K>)>,
        started: impl FnOnce(&Arc<Reflector<K>>) + Send + 'static,
    ) where
        K: Reflectable + Forgeable + kube::Resource<DynamicType = ()>,
    {
        self.run(typed::<K>(), WhenOff::KeepsRunning, store, started);
    }

    /// Reflects a kind nothing else reads whenever the settings have it on, stopping its
    /// reflector while they have it off.
    fn reflect_while_on<K: Reflectable>(&self, named: (Kind, K::DynamicType)) {
        self.run(named, WhenOff::Stops, None, |_: &Arc<Reflector<K>>| {});
    }

    /// Starts the reflector of each custom kind the settings name, now and whenever they name
    /// a new one: each is then switched like the built-in kinds nothing else reads.
    fn follow_custom_kinds(self) {
        let mut changes = self.shared.options.changes();
        let mut started = BTreeSet::new();
        tokio::spawn(async move {
            loop {
                let current = changes.borrow_and_update().clone();
                for custom in &current.custom_kinds {
                    if started.insert(custom.kind) {
                        let api = refract_shared::custom_kind::api_resource(custom.kind);
                        self.reflect_while_on::<DynamicObject>((Kind::Custom(custom.kind), api));
                    }
                }
                tokio::select! {
                    _ = self.token.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
        });
    }

    /// Runs the reflector of `named` as the settings in force turn the kind on and off. While
    /// it has no reflector, the kind's copies are withdrawn: on every session, and for every
    /// namespace extended later, the provider is told nothing of the kind is wanted (claims
    /// excepted: their volumes hold data). Turned on, the kind's namespaces are listed and
    /// sent anew. Turned off, a reflector that stops first deletes the copies this session
    /// was sent; one that keeps running withdraws them itself.
    fn run<K: Reflectable>(
        &self,
        named: (Kind, K::DynamicType),
        when_off: WhenOff,
        mut store: Option<(reflector::Store<K>, reflector::store::Writer<K>)>,
        started: impl FnOnce(&Arc<Reflector<K>>) + Send + 'static,
    ) {
        let kind = named.0;
        let is_on = move |o: &ReflectionOptions| o.kind(kind).workers > 0;
        if when_off == WhenOff::KeepsRunning && is_on(&self.shared.options.current()) {
            // Here rather than in a task: what reads it has it as soon as the agent starts.
            let reflector = self.spawn_reflector(named, store, self.token.clone());
            started(&reflector);
            return;
        }
        let this = self.clone();
        // Called with the first reflector started.
        let mut started = Some(started);
        tokio::spawn(async move {
            let mut changes = this.shared.options.changes();
            loop {
                if !is_on(&changes.borrow_and_update()) {
                    tracing::info!(kind = kind.kind(), "reflection disabled (0 workers)");
                    let withdrawing = this.token.child_token();
                    let withdraw = (kind != Kind::PersistentVolumeClaim).then(|| {
                        let task = super::snapshot::withdraw(
                            kind,
                            this.shared.clone(),
                            this.outbox.clone(),
                        );
                        tokio::spawn(super::until(withdrawing.clone(), task))
                    });
                    if !switched(&mut changes, &this.token, |o| is_on(o)).await {
                        return;
                    }
                    withdrawing.cancel();
                    // No withdrawal may follow what the reflector sends.
                    if let Some(withdraw) = withdraw {
                        let _ = withdraw.await;
                    }
                    tracing::info!(kind = kind.kind(), "reflection of the kind turned on");
                }
                let running = match when_off {
                    WhenOff::Stops => this.token.child_token(),
                    WhenOff::KeepsRunning => this.token.clone(),
                };
                let reflector = this.spawn_reflector(named.clone(), store.take(), running.clone());
                if let Some(started) = started.take() {
                    started(&reflector);
                }
                if when_off == WhenOff::KeepsRunning {
                    return;
                }
                if !switched(&mut changes, &this.token, |o| !is_on(o)).await {
                    return;
                }
                running.cancel();
                // A worker that was forging when the kind went off could otherwise send its
                // Upsert after the Deletes below, and the copy would stay on the provider.
                reflector.stopped().await;
                tracing::info!(kind = kind.kind(), "reflection of the kind turned off");
                // What this session was sent goes now; later sessions withdraw the rest.
                let session = this.shared.extension.borrow().session.clone();
                if let Some(session) = session {
                    let producer = crate::outbox::Producer::Objects(kind);
                    for key in this.outbox.keys(producer) {
                        let origin = crate::outbox::Origin::new(producer, key);
                        this.outbox.delete(&session, &origin, None).await;
                    }
                }
            }
        });
    }

    fn spawn_reflector<K: Reflectable>(
        &self,
        named: (Kind, K::DynamicType),
        store: Option<(reflector::Store<K>, reflector::store::Writer<K>)>,
        running: CancellationToken,
    ) -> Arc<Reflector<K>> {
        crate::reflect::spawn::<K>(
            self.client.clone(),
            named,
            self.shared.clone(),
            &self.outbox,
            store,
            running,
        )
    }
}

/// Waits until `now` holds for the settings in force; false when the agent stops first.
async fn switched(
    changes: &mut watch::Receiver<Arc<ReflectionOptions>>,
    token: &CancellationToken,
    now: impl Fn(&ReflectionOptions) -> bool,
) -> bool {
    loop {
        if now(&changes.borrow_and_update()) {
            return true;
        }
        tokio::select! {
            _ = token.cancelled() => return false,
            changed = changes.changed() => if changed.is_err() { return false },
        }
    }
}
