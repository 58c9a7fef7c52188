//! Starting every kind's reflector, and the Node and Service stores EndpointSlices depend on.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::forge::Forgeable;
use refract_core::options::Kind;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The reflectors other parts look objects up in.
pub struct Reflectors {
    /// Claims, for the volume intake (none when claims are not reflected).
    pub claims:
        Option<Arc<crate::reflect::Reflector<k8s_openapi::api::core::v1::PersistentVolumeClaim>>>,
}

/// What starting a reflector needs; its kind is its object type's.
#[derive(Clone, Copy)]
struct Start<'a> {
    client: &'a kube::Client,
    shared: &'a crate::reflect::Shared,
    outbox: &'a crate::outbox::Outbox,
    token: &'a CancellationToken,
}

/// A built-in kind, as [`crate::reflect::spawn`] names it: by its type.
fn typed<K: Forgeable + kube::Resource<DynamicType = ()>>() -> (Kind, ()) {
    (K::KIND, ())
}

impl Start<'_> {
    /// Starts the reflector of a built-in kind (none when its workers are 0).
    fn spawn<K>(self) -> Option<Arc<crate::reflect::Reflector<K>>>
    where
        K: crate::reflect::Reflectable + Forgeable + kube::Resource<DynamicType = ()>,
    {
        self.spawn_into(None)
    }

    /// Like [`Start::spawn`], the watch filling `store`.
    fn spawn_into<K>(
        self,
        store: Option<(reflector::Store<K>, reflector::store::Writer<K>)>,
    ) -> Option<Arc<crate::reflect::Reflector<K>>>
    where
        K: crate::reflect::Reflectable + Forgeable + kube::Resource<DynamicType = ()>,
    {
        crate::reflect::spawn::<K>(
            self.client.clone(),
            typed::<K>(),
            self.shared.clone(),
            self.outbox,
            store,
            self.token.clone(),
        )
    }
}

/// Starts one reflector per enabled kind, plus the Node and Service stores EndpointSlices need.
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
    use k8s_openapi::api::{core::v1, discovery, networking};
    let (nodes, nodes_writer) = reflector::store::<v1::Node>();
    let (nodes_listed_tx, nodes_listed) = watch::channel(false);
    let (services, services_writer) = reflector::store::<v1::Service>();
    let (services_listed_tx, services_listed) = watch::channel(ServicesListed::default());
    let shared = crate::reflect::Shared {
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
        client: &client,
        shared: &shared,
        outbox,
        token: &token,
    };
    switchable::<v1::ConfigMap>(start, typed::<v1::ConfigMap>());
    switchable::<v1::Secret>(start, typed::<v1::Secret>());
    // Custom kinds, each watched as JSON; the values file names them, at start.
    for custom in &shared.options.current().custom_kinds {
        let kind = custom.kind;
        let api = refract_shared::custom_kind::api_resource(kind);
        switchable::<kube::api::DynamicObject>(start, (Kind::Custom(kind), api));
    }
    // The Service reflector's watch fills the store EndpointSlices read; without Service
    // reflection, a watch of its own does.
    let mut services_writer = Some(services_writer);
    let service_reflector = if shared.options.current().kind(Kind::Service).workers > 0 {
        let store = services_writer.take().map(|w| (shared.services.clone(), w));
        start.spawn_into::<v1::Service>(store)
    } else {
        None
    };
    switchable::<networking::v1::Ingress>(start, typed::<networking::v1::Ingress>());
    let claims = start.spawn::<v1::PersistentVolumeClaim>();
    let Some(slices) = start.spawn::<discovery::v1::EndpointSlice>() else {
        return Reflectors { claims };
    };
    // A slice's reflection depends on its Service's annotations and on the nodes.
    let slices_of_nodes = slices.clone();
    let requeue_slices = move |svc: &v1::Service| {
        if let Some(namespace) = &svc.metadata.namespace {
            slices.enqueue_following(namespace, &svc.name_any());
        }
    };
    match (service_reflector, services_writer) {
        (Some(services), _) => {
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
        }
        // The Service reflector returns itself whenever it took the writer: never both.
        (None, None) => {}
        (None, Some(writer)) => {
            let watch_services = watcher(
                Api::<v1::Service>::all(client.clone()),
                watcher::Config::default(),
            )
            .backoff(crate::watch_backoff::watch_backoff())
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)) => {
                        requeue_slices(&svc)
                    }
                    Ok(watcher::Event::InitDone) => {
                        services_listed_tx.send_replace(ServicesListed::Everywhere);
                    }
                    _ => {}
                }
                futures::future::ready(())
            });
            let token = token.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = watch_services => {}
                }
            });
        }
    }
    let mut sites = crate::reflect::origin_nodes::NodeSites::default();
    let watch_nodes = watcher(Api::<v1::Node>::all(client), watcher::Config::default())
        .backoff(crate::watch_backoff::watch_backoff())
        .reflect(nodes_writer)
        .for_each(move |event| {
            if let Ok(event) = event {
                if matches!(event, watcher::Event::InitDone) {
                    // Before the slices are queued: they are not forged until it is set.
                    nodes_listed_tx.send_replace(true);
                }
                for node in sites.changed(&event) {
                    slices_of_nodes.enqueue_on_node(&node);
                }
            }
            futures::future::ready(())
        });
    tokio::spawn(async move {
        tokio::select! {
            _ = token.cancelled() => {}
            _ = watch_nodes => {}
        }
    });
    Reflectors { claims }
}

/// The built-in kinds whose reflector is started and stopped as the settings turn them on and
/// off: nothing else reads their reflectors (custom kinds the agent started with are switched
/// the same way). Services (whose watch EndpointSlices read), EndpointSlices and claims (the
/// volume intake's) keep theirs running when turned off (see `reflect::workers`), so turning
/// one on that was off at start waits for a restart.
pub const SWITCHABLE: [Kind; 3] = [Kind::ConfigMap, Kind::Secret, Kind::Ingress];

/// Runs the reflector of a kind nothing else reads (ConfigMaps, Secrets, Ingresses, custom
/// kinds), turning it on and off as the settings in force say: off, the copies this session
/// sent are deleted from the provider and every later session withdraws what is left; on
/// again, the kind's namespaces are listed and sent anew.
fn switchable<K: crate::reflect::Reflectable>(start: Start<'_>, named: (Kind, K::DynamicType)) {
    let client = start.client.clone();
    let shared = start.shared.clone();
    let outbox = start.outbox.clone();
    let token = start.token.clone();
    let kind = named.0;
    let producer = crate::outbox::Producer::Objects(kind);
    tokio::spawn(async move {
        let mut changes = shared.options.changes();
        let mut on = shared.options.current().kind(kind).workers > 0;
        loop {
            // With 0 workers this withdraws instead of reflecting (see `reflect::spawn`).
            let running = token.child_token();
            let reflector = crate::reflect::spawn::<K>(
                client.clone(),
                named.clone(),
                shared.clone(),
                &outbox,
                None,
                running.clone(),
            );
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
                if (shared.options.current().kind(kind).workers > 0) != on {
                    break;
                }
            }
            running.cancel();
            // A worker that was forging when the kind went off could otherwise send its
            // Upsert after the Deletes below, and the copy would stay on the provider.
            if let Some(reflector) = reflector {
                reflector.stopped().await;
            }
            on = !on;
            tracing::info!(
                kind = kind.kind(),
                on,
                "reflection of the kind turned {}",
                if on { "on" } else { "off" }
            );
            if !on {
                // What this session was sent goes now; later sessions withdraw the rest.
                let session = shared.extension.borrow().session.clone();
                if let Some(session) = session {
                    for key in outbox.keys(producer) {
                        let origin = crate::outbox::Origin::new(producer, key);
                        outbox.delete(&session, &origin, None).await;
                    }
                }
            }
        }
    });
}
