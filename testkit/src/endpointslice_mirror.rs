//! EndpointSlices made from Endpoints, standing in for the EndpointSlice controller of
//! Kubernetes 1.21 and later on testkit's 1.20 clusters ([`crate::Options::with_endpoint_slices`]).
//!
//! The 1.20 controller cannot run against the EndpointSlice shim: when it fills a Service's
//! first, empty slice it updates it without a resourceVersion, which a built-in type allows and
//! a custom resource refuses, so the slice stays empty for good. The endpoints controller fills
//! Endpoints reliably; this mirror writes each Endpoints object's subsets as `discovery.k8s.io/v1`
//! slices with the controller's managed-by label, the Service's name and, as the controller
//! does, the Service's own labels, owned by the Endpoints (the garbage collector removes them
//! with it). Slice names carry the cluster's
//! name, so a slice reflected from another testkit cluster never takes the name of one made
//! here.

use std::collections::HashMap;
use std::thread::JoinHandle;

use futures::StreamExt;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The field manager of the mirror's writes.
const MANAGER: &str = "refract-testkit-endpointslices";
/// The managed-by label value of the Kubernetes EndpointSlice controller.
const CONTROLLER: &str = "endpointslice-controller.k8s.io";

/// The running mirror. Dropping it stops it.
pub struct Mirror {
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl Mirror {
    /// Starts mirroring every Endpoints object of the cluster `client` reaches, naming slices
    /// after `cluster`. It runs on a thread and runtime of its own: a test blocks its runtime
    /// on `kubectl`.
    pub fn start(client: kube::Client, cluster: &str) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (cluster, token) = (cluster.to_string(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("endpointslice-mirror".into())
            .spawn(move || runtime.block_on(run(client, cluster, token)))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run(client: kube::Client, cluster: String, stop: CancellationToken) {
    let endpoints: Api<Endpoints> = Api::all(client.clone());
    let mut events = watcher(endpoints, watcher::Config::default())
        .default_backoff()
        .boxed();
    // How many slices each Endpoints object has, so that fewer subsets delete the rest.
    let mut written: HashMap<(String, String), usize> = HashMap::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "endpointslice mirror: watch error");
                    continue;
                }
                None => return,
            },
        };
        let (ep, slices) = match event {
            watcher::Event::Apply(ep) | watcher::Event::InitApply(ep) => {
                let services: Api<Service> =
                    Api::namespaced(client.clone(), &ep.namespace().unwrap_or_default());
                let labels = match services.get_opt(&ep.name_any()).await {
                    Ok(Some(service)) => service.metadata.labels.unwrap_or_default(),
                    _ => BTreeMap::new(),
                };
                let slices = slices_of(&ep, &labels, &cluster);
                (ep, slices)
            }
            watcher::Event::Delete(ep) => (ep, Vec::new()),
            _ => continue,
        };
        let namespace = ep.namespace().unwrap_or_default();
        let key = (namespace.clone(), ep.name_any());
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource());
        for slice in &slices {
            let name = slice["metadata"]["name"].as_str().unwrap_or_default();
            if let Err(e) = api
                .patch(
                    name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(slice),
                )
                .await
            {
                tracing::warn!(error = %e, namespace, name, "endpointslice mirror: write failed");
            }
        }
        let before = written.insert(key.clone(), slices.len()).unwrap_or(0);
        for index in slices.len()..before {
            let _ = api
                .delete(
                    &slice_name(&key.1, &cluster, index),
                    &DeleteParams::default(),
                )
                .await;
        }
        if slices.is_empty() {
            written.remove(&key);
        }
    }
}

fn resource() -> ApiResource {
    ApiResource {
        group: "discovery.k8s.io".into(),
        version: "v1".into(),
        api_version: "discovery.k8s.io/v1".into(),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    }
}

fn slice_name(endpoints: &str, cluster: &str, index: usize) -> String {
    format!("{endpoints}-{cluster}-{index}")
}

/// One slice per subset of `ep` (its ready and not-ready addresses, its ports), labelled with
/// its Service's `service_labels`.
fn slices_of(
    ep: &Endpoints,
    service_labels: &BTreeMap<String, String>,
    cluster: &str,
) -> Vec<Value> {
    let name = ep.name_any();
    let mut labels = service_labels.clone();
    labels.insert("kubernetes.io/service-name".into(), name.clone());
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".into(),
        CONTROLLER.into(),
    );
    let endpoint = |address: &EndpointAddress, ready: bool| {
        let mut e = json!({"addresses": [address.ip], "conditions": {"ready": ready}});
        if let Some(node) = &address.node_name {
            e["nodeName"] = json!(node);
        }
        if let Some(target) = &address.target_ref {
            e["targetRef"] = json!(target);
        }
        e
    };
    ep.subsets
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, subset)| {
            let endpoints: Vec<Value> = subset
                .addresses
                .iter()
                .flatten()
                .map(|a| endpoint(a, true))
                .chain(
                    subset
                        .not_ready_addresses
                        .iter()
                        .flatten()
                        .map(|a| endpoint(a, false)),
                )
                .collect();
            let ports: Vec<Value> = subset
                .ports
                .iter()
                .flatten()
                .map(|p| json!({"name": p.name.clone().unwrap_or_default(), "port": p.port, "protocol": p.protocol}))
                .collect();
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": slice_name(&name, cluster, index),
                    "namespace": ep.namespace(),
                    "labels": labels,
                    "ownerReferences": [{
                        "apiVersion": "v1",
                        "kind": "Endpoints",
                        "name": name,
                        "uid": ep.metadata.uid,
                    }],
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": ports,
            })
        })
        .collect()
}
