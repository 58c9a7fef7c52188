//! A stand-in for the provider's kubelets, so pods bound to "real" nodes run without a
//! container runtime.
//!
//! It registers Nodes (Ready, with capacity), renews their heartbeat, moves pods bound to them
//! to `Running` with an IP from the node's pod CIDR, and finishes deletions the way a kubelet
//! does (a bound pod deleted gracefully stays until its kubelet confirms). It also runs the
//! [`crate::fake_provisioner`], the nodes' storage.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use futures::StreamExt;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// One fake node.
#[derive(Debug, Clone)]
pub struct FakeNode {
    /// Node name.
    pub name: String,
    /// Resources it offers (`cpu`, `memory`, `pods`, extended resources), as quantities.
    pub capacity: BTreeMap<String, String>,
    /// Pod IPs are taken from here.
    pub pod_cidr: Ipv4Net,
    /// The node's own InternalIP.
    pub address: Ipv4Addr,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
}

impl FakeNode {
    /// A node with `cpu` cores and `memory` (e.g. `16Gi`), 110 pods.
    pub fn new(name: &str, cpu: &str, memory: &str, pod_cidr: Ipv4Net, address: Ipv4Addr) -> Self {
        let capacity = [("cpu", cpu), ("memory", memory), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self {
            name: name.to_string(),
            capacity,
            pod_cidr,
            address,
            labels: BTreeMap::new(),
        }
    }
}

/// Registers `nodes` and runs their pods until `shutdown`.
pub async fn run(
    client: kube::Client,
    nodes: Vec<FakeNode>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let node_api: Api<Node> = Api::all(client.clone());
    for node in &nodes {
        register(&node_api, node).await?;
    }
    let heartbeat = {
        let node_api = node_api.clone();
        let nodes = nodes.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                for node in &nodes {
                    if let Err(error) = patch_node_status(&node_api, node).await {
                        tracing::warn!(node = %node.name, %error, "heartbeat failed");
                    }
                }
            }
        }
    };
    // The nodes' storage: claims of the fake provisioner's classes get volumes.
    tokio::spawn(crate::fake_provisioner::run(
        client.clone(),
        shutdown.clone(),
    ));
    tokio::select! {
        _ = heartbeat => Ok(()),
        r = run_pods(client, &nodes) => r,
        _ = shutdown.cancelled() => Ok(()),
    }
}

async fn register(api: &Api<Node>, node: &FakeNode) -> anyhow::Result<()> {
    let mut labels = node.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), node.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("refract.io/fake-kubelet".into(), "true".into());
    let obj: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {"podCIDR": node.pod_cidr.to_string()}
    }))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    patch_node_status(api, node).await
}

async fn patch_node_status(api: &Api<Node>, node: &FakeNode) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": node.capacity,
        "allocatable": node.capacity,
        "addresses": [{"type": "InternalIP", "address": node.address.to_string()},
                      {"type": "Hostname", "address": node.name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake kubelet is posting ready status",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": "v1.20.2-fake", "operatingSystem": "linux", "architecture": "amd64",
                     "containerRuntimeVersion": "fake://1", "kernelVersion": "", "osImage": "refract fake kubelet",
                     "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""}
    }});
    api.patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn run_pods(client: kube::Client, nodes: &[FakeNode]) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let by_name: HashMap<&str, &FakeNode> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut next_ip: HashMap<String, u32> = HashMap::new();
    let mut stream = watcher(pods, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod)) | Ok(watcher::Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, "pod watch error; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| by_name.get(n))
        else {
            continue;
        };
        if let Err(error) = sync_pod(&client, node, &pod, &mut next_ip).await {
            tracing::warn!(pod = ?pod.metadata.name, %error, "fake kubelet failed to sync pod");
        }
    }
    Ok(())
}

async fn sync_pod(
    client: &kube::Client,
    node: &FakeNode,
    pod: &Pod,
    next_ip: &mut HashMap<String, u32>,
) -> anyhow::Result<()> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    if pod.metadata.deletion_timestamp.is_some() {
        // A kubelet confirms graceful deletion once containers stopped; ours stop at once.
        let _ = api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
        return Ok(());
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Running" | "Succeeded" | "Failed")) {
        return Ok(());
    }
    let counter = next_ip.entry(node.name.clone()).or_insert(10);
    *counter += 1;
    let base = u32::from(node.pod_cidr.network());
    let ip = Ipv4Addr::from(base + *counter);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let containers: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().collect())
        .unwrap_or_default();
    let statuses: Vec<_> = containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "ready": true, "restartCount": 0, "started": true,
                "image": c.image.clone().unwrap_or_default(), "imageID": "fake://image",
                "containerID": format!("fake://{}-{}", name, c.name),
                "state": {"running": {"startedAt": now}}
            })
        })
        .collect();
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
        "hostIP": node.address.to_string(),
        "startTime": now,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
        ],
        "containerStatuses": statuses
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    tracing::info!(pod = %format!("{ns}/{name}"), node = %node.name, %ip, "fake kubelet started pod");
    Ok(())
}

/// Ends a running pod as a kubelet would when its containers exit: `Succeeded` when
/// `succeeded`, else `Failed`.
pub async fn finish_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    succeeded: bool,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let phase = if succeeded { "Succeeded" } else { "Failed" };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": phase}})),
    )
    .await?;
    Ok(())
}
