//! The virtual node: the provider as one Node the origin's scheduler can place pods on.
//!
//! Capacity and allocatable are `--sharing-percentage` of what the provider reports free
//! (integer resources rounded down). Ready follows the stream and the provider's API server;
//! after the link has been down for `--node-not-ready-grace` the node turns NotReady and the
//! origin's node lifecycle controller applies its usual eviction rules. A Lease in
//! `kube-node-lease` is renewed while the agent runs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use prometheus_client::metrics::counter::Counter;
use refract_shared::forge::pod::VIRTUAL_NODE_TAINT_KEY;
use refract_shared::inbound::{capacity, labels as node_labels};
use refract_shared::keys::{LOCAL_FIELD_MANAGER, LOCAL_STATUS_FIELD_MANAGER};
use refract_shared::offloading;
use refract_shared::proto::Capacity;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::link::SessionTx;

/// How often the node's status and lease are refreshed.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Settings of the virtual node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// The provider's cluster id.
    pub remote_cluster_id: String,
    /// The address shown as the node's (and offloaded pods') host IP.
    pub node_ip: String,
    /// Share of the provider's free resources, in percent.
    pub sharing_percentage: u32,
    /// How long the link may be down before the node turns NotReady.
    pub not_ready_grace: Duration,
    /// Extra labels set by the operator.
    pub extra_labels: BTreeMap<String, String>,
    /// The port of the node's kubelet API, when served.
    pub kubelet_port: Option<u16>,
    /// Counts node labels the provider suggested and this agent left out.
    pub refused_labels: Counter,
    /// Counts capacity entries the provider reported and this agent left out or capped.
    pub refused_capacity: Counter,
}

/// Runs the virtual node until `shutdown`.
pub async fn run(
    client: kube::Client,
    config: NodeConfig,
    mut sessions: watch::Receiver<Option<SessionTx>>,
    mut capacity: watch::Receiver<Option<Capacity>>,
    shutdown: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let params = PatchParams::apply(LOCAL_FIELD_MANAGER).force();
    let mut down_since: Option<Instant> = Some(Instant::now());
    let mut last_ready: Option<bool> = None;
    let mut last_transition = Time(k8s_openapi::jiff::Timestamp::now());
    let mut tick = tokio::time::interval(HEARTBEAT);
    let mut last_refused: (Vec<String>, Vec<String>) = Default::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            r = sessions.changed() => if r.is_err() { return },
            r = capacity.changed() => if r.is_err() { return },
        }
        let connected = sessions.borrow().is_some();
        let cap = capacity.borrow().clone();
        down_since = match (connected, down_since) {
            (true, _) => None,
            (false, None) => Some(Instant::now()),
            (false, since) => since,
        };
        let (ready, reason, message) = match (&cap, down_since) {
            (None, _) => (
                false,
                "WaitingForProvider",
                "no capacity received from the remote agent yet".to_string(),
            ),
            (Some(c), None) if !c.api_server_ready => (
                false,
                "ProviderAPIServerDown",
                "the provider's API server does not answer the remote agent".to_string(),
            ),
            (Some(_), None) => (
                true,
                "KubeletReady",
                "connected to the remote agent".to_string(),
            ),
            (Some(_), Some(since)) if since.elapsed() < config.not_ready_grace => (
                last_ready.unwrap_or(false),
                "LinkDown",
                format!(
                    "link to the remote agent down for {}s (grace {}s)",
                    since.elapsed().as_secs(),
                    config.not_ready_grace.as_secs()
                ),
            ),
            (Some(_), Some(since)) => (
                false,
                "LinkDown",
                format!(
                    "link to the remote agent down for {}s",
                    since.elapsed().as_secs()
                ),
            ),
        };
        if last_ready != Some(ready) {
            last_transition = Time(k8s_openapi::jiff::Timestamp::now());
            tracing::info!(node = %config.name, ready, reason, %message, "virtual node readiness");
        }
        last_ready = Some(ready);

        let mut labels = config.extra_labels.clone();
        let suggested = cap
            .as_ref()
            .map(|c| node_labels::node_labels(&c.node_labels))
            .unwrap_or_default();
        labels.extend(suggested.kept);
        let labels = base_labels(&config, labels);
        let resources = cap
            .as_ref()
            .map(|c| capacity::node_resources(&c.free, config.sharing_percentage))
            .unwrap_or_default();
        // Said once per change, not on every heartbeat.
        let refused = (suggested.refused, resources.refused);
        if refused != last_refused {
            if !refused.0.is_empty() {
                config.refused_labels.inc_by(refused.0.len() as u64);
                tracing::warn!(node = %config.name, refused = ?refused.0, "left out node labels the provider suggested");
            }
            if !refused.1.is_empty() {
                config.refused_capacity.inc_by(refused.1.len() as u64);
                tracing::warn!(node = %config.name, refused = ?refused.1, "left out or capped resources the provider reported");
            }
            last_refused = refused;
        }
        let node = Node {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: VIRTUAL_NODE_TAINT_KEY.into(),
                    value: Some("true".into()),
                    effect: "NoExecute".into(),
                    time_added: None,
                }]),
                ..Default::default()
            }),
            status: None,
        };
        if let Err(error) = nodes
            .patch(&config.name, &params, &Patch::Apply(with_kind(&node)))
            .await
        {
            tracing::warn!(node = %config.name, %error, "failed to apply the virtual node");
            continue;
        }
        let resources = resources.resources;
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let status = Node {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                capacity: Some(resources.clone()),
                allocatable: Some(resources),
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: config.node_ip.clone(),
                }]),
                // Where the API server sends logs, exec, attach, port-forward and stats.
                daemon_endpoints: config.kubelet_port.map(|port| NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint {
                        port: i32::from(port),
                    }),
                }),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    reason: Some(reason.into()),
                    message: Some(message),
                    last_heartbeat_time: Some(now),
                    last_transition_time: Some(last_transition.clone()),
                }]),
                node_info: Some(NodeSystemInfo {
                    kubelet_version: format!("v1.20.2-refract-{}", refract_shared::AGENT_VERSION),
                    operating_system: "linux".into(),
                    architecture: "amd64".into(),
                    os_image: format!("Refract virtual node for {}", config.remote_cluster_id),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let status_params = PatchParams::apply(LOCAL_STATUS_FIELD_MANAGER).force();
        if let Err(error) = nodes
            .patch_status(
                &config.name,
                &status_params,
                &Patch::Apply(with_kind(&status)),
            )
            .await
        {
            tracing::warn!(node = %config.name, %error, "failed to update the virtual node's status");
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some("kube-node-lease".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.name.clone()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                ..Default::default()
            }),
        };
        if let Err(error) = leases
            .patch(&config.name, &params, &Patch::Apply(with_kind(&lease)))
            .await
        {
            tracing::debug!(node = %config.name, %error, "failed to renew the node lease");
        }
    }
}

fn base_labels(
    config: &NodeConfig,
    mut labels: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    labels.extend(offloading::virtual_node_labels(
        &config.remote_cluster_id,
        &BTreeMap::new(),
    ));
    labels.insert("kubernetes.io/hostname".into(), config.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/role".into(), "agent".into());
    labels.insert("type".into(), "virtual-kubelet".into());
    labels.insert(
        "node.kubernetes.io/exclude-from-external-load-balancers".into(),
        "true".into(),
    );
    labels
}

/// Serializes a typed object with its apiVersion and kind, as server-side apply needs.
fn with_kind<K: kube::Resource<DynamicType = ()> + serde::Serialize>(obj: &K) -> serde_json::Value {
    let mut v = serde_json::to_value(obj).expect("Kubernetes objects serialize");
    v["apiVersion"] = K::api_version(&()).into();
    v["kind"] = K::kind(&()).into();
    v
}
