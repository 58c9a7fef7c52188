//! Unpeering: ending this peering when an operator asks (`local-agent unpeer`, which sets
//! `refract.io/unpeer` on the virtual node).
//!
//! Graceful: the node is cordoned and its pods evicted, each ending on the provider before it
//! leaves the origin, as any deleted offloaded pod does. Once none is left, the agent stops its
//! link (nothing more is sent) and asks the provider to remove the tenant
//! (`refract.v1.Reflection/Unpeer`: twin namespaces with the reflected objects in them); then
//! it removes the peering from the origin ([`origin::clean_up`]). Forced: the link stops at
//! once and `local-agent unpeer --force` cleans up the origin; the provider is not called (it
//! may be dead), and its leftovers go with its `--tenant-expiry` or `remote-agent
//! remove-tenant`. A graceful unpeer
//! that hangs (a provider gone mid-way) is turned forced by asking again with `--force`.
//!
//! Progress is written to the node ([`UNPEER_PROGRESS_ANNOTATION`]) for the command to show.
//! Once unpeered, the agent idles until it is stopped: started again, it would peer again.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_wire::proto::reflection_client::ReflectionClient;
use refract_wire::proto::UnpeerRequest;
use tokio_util::sync::CancellationToken;

pub use refract_admin::unpeer::{origin, Mode};

use crate::connector::Connector;

pub use refract_core::keys::UNPEER_PROGRESS_ANNOTATION;

/// How often a drain looks at what is left, and a failed Unpeer call is retried.
const RETRY: Duration = Duration::from_secs(2);
/// How long one Unpeer call may take: deleting a tenant's namespaces is a few API calls.
const UNPEER_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What unpeering needs.
pub struct Unpeering {
    /// The origin cluster.
    pub client: kube::Client,
    /// The virtual node.
    pub node: String,
    /// The provider's cluster id.
    pub remote_cluster_id: String,
    /// Dials the remote agent for the Unpeer call.
    pub connector: Connector,
    /// Everything the agent runs but its admin endpoint: cancelled to stop the link, the
    /// virtual node's heartbeat and the reflectors.
    pub work: CancellationToken,
}

impl Unpeering {
    /// Waits for an unpeer request on the virtual node and does the agent's part: returns the
    /// mode once the peering is gone from the origin (graceful), or once the link is stopped
    /// and the request answered (forced: the command cleans up). Never returns if no request
    /// comes.
    pub async fn run(self) -> Mode {
        let mode = match self.requested().await {
            Mode::Graceful => self.graceful().await,
            Mode::Forced => Mode::Forced,
        };
        if mode == Mode::Forced {
            // `local-agent unpeer --force` cleans up the origin once it reads this: it works
            // the same whether or not an agent is there to answer.
            self.work.cancel();
            origin::report(
                &self.client,
                &self.node,
                "forced: the local agent stopped its link and leaves the clean-up to the unpeer command",
            )
            .await;
            return mode;
        }
        loop {
            match origin::clean_up(&self.client, &self.node, &self.remote_cluster_id).await {
                Ok(_) => return mode,
                Err(error) => {
                    tracing::warn!(%error, "failed to remove the peering from the origin; retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// The first unpeer mode the virtual node asks for.
    async fn requested(&self) -> Mode {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let mut stream = watcher(nodes, config)
            .backoff(crate::watch_backoff::watch_backoff())
            .applied_objects()
            .boxed();
        let mut said = None;
        while let Some(event) = stream.next().await {
            let Ok(node) = event else { continue };
            match Mode::requested(&node) {
                Ok(Some(mode)) => {
                    tracing::info!(node = %self.node, mode = mode.as_str(), "unpeering requested");
                    return mode;
                }
                Ok(None) => {}
                Err(why) if said.as_ref() != Some(&why) => {
                    tracing::warn!(node = %self.node, %why, "ignored an unpeer request");
                    said = Some(why);
                }
                Err(_) => {}
            }
        }
        std::future::pending().await
    }

    /// Whether the node now asks for a forced unpeer (a node already gone asks nothing).
    async fn forced_meanwhile(&self) -> bool {
        let nodes: Api<Node> = Api::all(self.client.clone());
        matches!(nodes.get_opt(&self.node).await, Ok(Some(n)) if Mode::requested(&n) == Ok(Some(Mode::Forced)))
    }

    /// Drains and has the provider remove the tenant; returns `Forced` when asked to give up
    /// on the provider meanwhile, `Graceful` when the provider confirmed.
    async fn graceful(&self) -> Mode {
        self.cordon().await;
        if !self.drain().await {
            return Mode::Forced;
        }
        self.work.cancel();
        let report = |p: String| async move { origin::report(&self.client, &self.node, &p).await };
        report("drained; the link is stopped; asking the provider to remove this tenant".into())
            .await;
        loop {
            match self.call_unpeer().await {
                Ok(removed) => {
                    tracing::info!(removed = ?removed, "the provider removed this tenant");
                    report(format!(
                        "the provider removed {} namespace(s): {}; removing the peering from the origin",
                        removed.len(),
                        removed.join(", ")
                    ))
                    .await;
                    return Mode::Graceful;
                }
                Err(error) => {
                    report(format!("waiting for the provider to remove this tenant: {error} (`local-agent unpeer --force` stops waiting)")).await;
                }
            }
            tokio::time::sleep(RETRY).await;
            if self.forced_meanwhile().await {
                return Mode::Forced;
            }
        }
    }

    async fn cordon(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({"spec": {"unschedulable": true}});
        if let Err(error) = nodes
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(node = %self.node, %error, "failed to cordon the virtual node");
        }
    }

    /// Evicts the node's pods until none is left; `false` when a forced unpeer was asked
    /// meanwhile.
    async fn drain(&self) -> bool {
        let mut last = String::new();
        loop {
            let pods = match origin::pods_on(&self.client, &self.node).await {
                Ok(p) => p,
                Err(error) => {
                    tracing::warn!(%error, "failed to list the virtual node's pods");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if pods.is_empty() {
                return true;
            }
            let mut blocked = Vec::new();
            for pod in pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                if let Err(why) = evict(&self.client, pod).await {
                    blocked.push(why);
                }
            }
            let mut progress = format!("cordoned; draining: {} pod(s) left", pods.len());
            if !blocked.is_empty() {
                progress.push_str(&format!("; {}", blocked.join("; ")));
            }
            if progress != last {
                origin::report(&self.client, &self.node, &progress).await;
                last = progress;
            }
            tokio::time::sleep(RETRY).await;
            if self.forced_meanwhile().await {
                return false;
            }
        }
    }

    async fn call_unpeer(&self) -> Result<Vec<String>, String> {
        let connector = self.connector.clone();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", connector.addr))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(10))
            .timeout(UNPEER_CALL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_| {
                let connector = connector.clone();
                async move { connector.connect().await }
            }))
            .await
            .map_err(|e| format!("cannot reach the remote agent: {e}"))?;
        let response = ReflectionClient::new(channel)
            .unpeer(UnpeerRequest {})
            .await
            .map_err(|s| format!("{}: {}", s.code(), s.message()))?;
        Ok(response.into_inner().removed_namespaces)
    }
}

/// Evicts `pod` (PodDisruptionBudgets are respected); where the API server refuses the eviction
/// otherwise (older servers know no `policy/v1` Eviction), deletes it. `Err` says why it must
/// wait.
async fn evict(client: &kube::Client, pod: &Pod) -> Result<(), String> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.evict(&name, &EvictParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 429 => Err(format!(
            "{ns}/{name} waits for its PodDisruptionBudget: {}",
            s.message
        )),
        Err(error) => {
            tracing::info!(pod = %format!("{ns}/{name}"), %error, "eviction refused; deleting the pod instead");
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(format!("{ns}/{name} could not be deleted: {e}")),
            }
        }
    }
}
