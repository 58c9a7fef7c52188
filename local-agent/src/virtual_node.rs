//! The virtual node: the provider as one Node the origin's scheduler can place pods on.
//!
//! Capacity and allocatable are `--sharing-percentage` of what the provider reports free
//! (integer resources rounded down). Ready follows periodic health checks of the link and of
//! the provider's API server ([`health`]); after repeated failures the node turns NotReady and
//! the origin's node lifecycle controller applies its usual eviction rules. A Lease in
//! `kube-node-lease` is renewed at every check while the agent runs.
//!
//! The node's taints are shared: the lifecycle controller adds and removes
//! `node.kubernetes.io/not-ready` and `unreachable`, and the list is atomic for server-side
//! apply, so applying it whole would drop theirs. The agent creates the node with its taint,
//! applies everything but the taints, and adds its own taint to the list it reads back only
//! when it is missing, guarded by the node's resourceVersion.

pub mod health;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use prometheus_client::metrics::counter::Counter;
use refract_core::inbound::{capacity, labels as node_labels};
use refract_core::json;
use refract_core::keys::{LOCAL_FIELD_MANAGER, LOCAL_STATUS_FIELD_MANAGER, VIRTUAL_NODE_TAINT_KEY};
use refract_core::offloading;
use refract_wire::proto::Capacity;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::link::SessionTx;

/// Settings of the virtual node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// The provider's cluster id.
    pub remote_cluster_id: String,
    /// The address shown as the node's (and offloaded pods') host IP.
    pub node_ip: String,
    /// Share of the provider's free resources, in percent (the settings file can change it).
    pub sharing_percentage: watch::Receiver<u32>,
    /// How often the link and the provider are checked (and the status and lease written).
    pub health_interval: Duration,
    /// Failed checks in a row before the node turns NotReady.
    pub health_failures: u32,
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
    readiness: watch::Sender<Option<bool>>,
    published_labels: watch::Sender<BTreeMap<String, String>>,
    shutdown: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let params = PatchParams::apply(LOCAL_FIELD_MANAGER).force();
    // A node another replica (or this agent before a restart) kept Ready stays Ready through
    // the takeover unless the checks have failed for `health_failures` intervals counted from
    // its last heartbeat: a failover shorter than that never shows the node NotReady.
    let carried = match nodes.get_opt(&config.name).await {
        Ok(node) => node.as_ref().and_then(|n| {
            still_ready(
                n,
                config.health_interval * config.health_failures,
                k8s_openapi::jiff::Timestamp::now(),
            )
        }),
        Err(error) => {
            tracing::debug!(node = %config.name, %error, "could not read the virtual node at start; its readiness starts anew");
            None
        }
    };
    let mut health = match &carried {
        Some(ready) => {
            let missed =
                ready.heartbeat_age.as_millis() / config.health_interval.as_millis().max(1);
            health::Health::resumed(config.health_failures, missed.min(u32::MAX as u128) as u32)
        }
        None => health::Health::new(config.health_failures),
    };
    let mut last_ready: Option<bool> = carried.as_ref().map(|_| true);
    let mut last_transition = carried
        .map(|ready| ready.since)
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    let mut tick = tokio::time::interval(config.health_interval);
    let mut sharing = config.sharing_percentage.clone();
    let mut last_refused: (Vec<String>, Vec<String>) = Default::default();
    loop {
        // A tick is a health check; a new session or capacity report between ticks is news,
        // shown before the next check only if `Health::shown_between_checks` says so.
        let is_check = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => true,
            r = sessions.changed() => if r.is_err() { return } else { false },
            r = capacity.changed() => if r.is_err() { return } else { false },
            // A new share is shown at once (when healthy), not at the next check.
            Ok(()) = sharing.changed() => false,
        };
        let connected = sessions.borrow().is_some();
        let cap = capacity.borrow().clone();
        let check = match (&cap, connected) {
            (_, false) => health::Check::LinkDown,
            (None, true) => health::Check::WaitingForProvider,
            (Some(c), true) if !c.api_server_ready => health::Check::ProviderApiServerDown,
            (Some(_), true) => health::Check::Healthy,
        };
        if !is_check && !health.shown_between_checks(check) {
            continue;
        }
        let health::Readiness {
            ready,
            reason,
            message,
        } = health.observe(check);
        if last_ready != Some(ready) {
            last_transition = Time(k8s_openapi::jiff::Timestamp::now());
            tracing::info!(node = %config.name, ready, reason, %message, "virtual node readiness");
            readiness.send_replace(Some(ready));
        }
        last_ready = Some(ready);

        let mut labels = config.extra_labels.clone();
        let suggested = cap
            .as_ref()
            .map(|c| node_labels::node_labels(&c.node_labels))
            .unwrap_or_default();
        labels.extend(suggested.kept);
        let labels = base_labels(&config, labels);
        // Cluster selectors match these, the provider's suggestions included.
        published_labels.send_if_modified(|current| {
            let changed = *current != labels;
            if changed {
                current.clone_from(&labels);
            }
            changed
        });
        let resources = cap
            .as_ref()
            .map(|c| {
                let mut offered = capacity::node_resources(&c.free, *sharing.borrow_and_update());
                capacity::cap_by_quota(&mut offered, &c.quota);
                offered
            })
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
            spec: None,
            status: None,
        };
        if let Err(error) = create_tainted_if_absent(&nodes, &config.name).await {
            tracing::warn!(node = %config.name, %error, "failed to create the virtual node; trying again at the next check");
            continue;
        }
        match nodes
            .patch(&config.name, &params, &Patch::Apply(with_kind(&node)))
            .await
        {
            Ok(applied) => {
                // Never Ready without the taint: until it holds, any pod could land here.
                if let Err(error) = ensure_taint(&nodes, applied).await {
                    tracing::warn!(node = %config.name, %error, "failed to add the virtual-node taint; the status waits for the next check");
                    continue;
                }
            }
            Err(error) => {
                tracing::warn!(node = %config.name, %error, "failed to apply the virtual node");
                continue;
            }
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
                    kubelet_version: format!("v1.20.2-refract-{}", refract_core::AGENT_VERSION),
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
                lease_duration_seconds: Some(lease_duration_seconds(config.health_interval)),
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

/// A node found Ready at start.
#[derive(Debug, Clone, PartialEq)]
struct StillReady {
    /// When it turned Ready.
    since: Time,
    /// How old its last heartbeat is.
    heartbeat_age: Duration,
}

/// Whether `node` shows Ready with a heartbeat newer than `within`.
fn still_ready(
    node: &Node,
    within: Duration,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<StillReady> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status != "True" {
        return None;
    }
    let heartbeat = ready.last_heartbeat_time.as_ref()?.0;
    // A heartbeat from the future (another machine's clock) counts as just now.
    let age = Duration::try_from(now.duration_since(heartbeat)).unwrap_or_default();
    if age > within {
        return None;
    }
    Some(StillReady {
        since: ready
            .last_transition_time
            .clone()
            .unwrap_or(Time(heartbeat)),
        heartbeat_age: age,
    })
}

/// How long the node's Lease holds: a kubelet's 40 s, or four health checks when those are
/// rarer, so a slow check interval never lets the Lease lapse between two renewals.
fn lease_duration_seconds(health_interval: Duration) -> i32 {
    let four_checks = health_interval.as_secs().saturating_mul(4);
    i32::try_from(four_checks.max(40)).unwrap_or(i32::MAX)
}

/// The taint that keeps pods off the virtual node unless they tolerate it.
fn virtual_node_taint() -> Taint {
    Taint {
        key: VIRTUAL_NODE_TAINT_KEY.into(),
        value: Some("true".into()),
        effect: "NoExecute".into(),
        time_added: None,
    }
}

/// How many times a taint write that lost a race with another writer (the lifecycle
/// controller tainting a new node not-ready) is tried again with a fresh read.
const TAINT_ATTEMPTS: usize = 5;

/// `taints` with the virtual-node taint added, or `None` when it is already there.
fn with_our_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    let ours = virtual_node_taint();
    if taints
        .iter()
        .any(|t| t.key == ours.key && t.effect == ours.effect)
    {
        return None;
    }
    Some(taints.iter().cloned().chain([ours]).collect())
}

/// Creates the node with the virtual-node taint when it does not exist, so that no version
/// of it ever lacks the taint. The origin's node lifecycle controller rewrites the whole taint
/// list from the node as its cache last saw it (without a resourceVersion before Kubernetes
/// 1.22); a node created bare and tainted a moment later can lose the taint to that stale
/// rewrite and stand Ready and untainted until the next check. The create is an update-type
/// write, so the apply that follows, which leaves the taints out, never removes it.
async fn create_tainted_if_absent(nodes: &Api<Node>, name: &str) -> Result<(), kube::Error> {
    if nodes.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let skeleton = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![virtual_node_taint()]),
            ..Default::default()
        }),
        status: None,
    };
    let params = PostParams {
        field_manager: Some(LOCAL_FIELD_MANAGER.into()),
        ..Default::default()
    };
    match nodes.create(&params, &skeleton).await {
        Ok(_) => Ok(()),
        // Created by someone else between the read and the write: the apply takes it as is.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Adds the virtual-node taint to `node` when it lacks it, keeping every other taint (the
/// lifecycle controller's). The resourceVersion makes a concurrent change fail the write;
/// a conflict is retried at once on a fresh read, since a node just created always races
/// the controller's not-ready taint.
async fn ensure_taint(nodes: &Api<Node>, mut node: Node) -> Result<(), kube::Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let params = PatchParams {
        field_manager: Some(LOCAL_FIELD_MANAGER.into()),
        ..Default::default()
    };
    let mut attempt = 1;
    loop {
        let current = node.spec.as_ref().and_then(|s| s.taints.as_deref());
        let Some(taints) = with_our_taint(current.unwrap_or_default()) else {
            return Ok(());
        };
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": taints},
        });
        match nodes.patch(&name, &params, &Patch::Merge(patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < TAINT_ATTEMPTS => {
                attempt += 1;
                node = nodes.get(&name).await?;
            }
            Err(error) => return Err(error),
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
    let mut v = json::to_value(obj);
    v["apiVersion"] = K::api_version(&()).into();
    v["kind"] = K::kind(&()).into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_outlasts_four_health_checks_and_never_less_than_a_kubelets() {
        assert_eq!(lease_duration_seconds(Duration::from_secs(1)), 40);
        assert_eq!(lease_duration_seconds(Duration::from_secs(10)), 40);
        assert_eq!(lease_duration_seconds(Duration::from_secs(30)), 120);
    }

    #[test]
    fn a_ready_node_with_a_recent_heartbeat_is_carried_over() {
        let ts = |s: i64| k8s_openapi::jiff::Timestamp::from_second(s).unwrap();
        let node = |status: &str, heartbeat: i64| Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    last_heartbeat_time: Some(Time(ts(heartbeat))),
                    last_transition_time: Some(Time(ts(5))),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let within = Duration::from_secs(30);
        assert_eq!(
            still_ready(&node("True", 100), within, ts(120)),
            Some(StillReady {
                since: Time(ts(5)),
                heartbeat_age: Duration::from_secs(20)
            })
        );
        assert_eq!(
            still_ready(&node("True", 100), within, ts(131)),
            None,
            "a heartbeat older than the failure threshold"
        );
        assert_eq!(still_ready(&node("False", 100), within, ts(101)), None);
        assert_eq!(still_ready(&node("Unknown", 100), within, ts(101)), None);
        assert_eq!(still_ready(&Node::default(), within, ts(101)), None);
    }

    #[test]
    fn our_taint_joins_the_controllers_and_is_never_added_twice() {
        let not_ready = Taint {
            key: "node.kubernetes.io/not-ready".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let added = with_our_taint(std::slice::from_ref(&not_ready)).expect("missing, so added");
        assert_eq!(added, vec![not_ready, virtual_node_taint()]);
        assert_eq!(with_our_taint(&added), None);
        assert_eq!(with_our_taint(&[]), Some(vec![virtual_node_taint()]));
    }
}
