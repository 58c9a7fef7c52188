//! `local-agent unpeer`: the operator's side of unpeering. It needs the origin cluster only.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use refract_core::keys::{
    REMOTE_CLUSTER_ID_LABEL, UNPEER_ANNOTATION, UNPEER_PROGRESS_ANNOTATION, VIRTUAL_NODE_TYPE,
    VIRTUAL_NODE_TYPE_LABEL,
};
use refract_shared::tls::ClusterId;

use super::{origin, Mode};

/// How long a forced unpeer waits for a running local agent to stop its link before it cleans
/// up the origin without it.
const AGENT_ACK_WAIT: Duration = Duration::from_secs(10);
/// How long the node must stay gone after a forced clean-up: a local agent that never saw the
/// request would have written it again by then (it writes every health check).
const STAYS_GONE: Duration = Duration::from_secs(3);
/// How often the node is read while waiting for the agent's answer.
const POLL: Duration = Duration::from_millis(500);

/// Ends a peering from the origin.
///
/// Graceful (the default): the running local agent of the peering cordons its virtual node,
/// evicts the pods on it (each ends on the provider first; PodDisruptionBudgets are respected),
/// stops its link, asks the provider to remove everything it holds for this origin (twin
/// namespaces with the reflected objects, ShadowPods and pods in them), then removes this
/// peer's NamespaceOffloading status, the node's Lease and the virtual node. This command
/// shows its progress until the node is gone.
///
/// --force, for a provider that is dead or unreachable: the provider is not called. The local
/// agent (if it runs) stops its link; then this command itself deletes the pods bound to the
/// virtual node at once, this peer's status, the Lease and the node. What the provider still
/// holds goes with its --tenant-expiry, or `remote-agent remove-tenant` there.
///
/// Either way the local agent then idles; remove its Deployment (started again, it peers
/// again). The command needs the origin cluster only: `--kubeconfig` or the usual defaults.
#[derive(Debug, Clone, clap::Parser)]
pub struct UnpeerArgs {
    /// The provider's cluster id, as given to the local agent's --remote-cluster-id.
    #[arg(long)]
    pub remote_cluster_id: ClusterId,

    /// The virtual node's name, if the local agent was given --node-name (default:
    /// `refract-<remote-cluster-id>`).
    #[arg(long)]
    pub node_name: Option<String>,

    /// Kubeconfig of the origin cluster; else the in-cluster service account, else
    /// $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Do not ask the provider: clean up the origin only, within seconds. Also turns a
    /// graceful unpeer that is waiting (for a provider gone mid-way) into a forced one.
    #[arg(long)]
    pub force: bool,

    /// How long a graceful unpeer may take before this command gives up waiting (the agent
    /// goes on).
    #[arg(long, default_value = "10m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,
}

impl UnpeerArgs {
    fn node(&self) -> String {
        self.node_name
            .clone()
            .unwrap_or_else(|| format!("refract-{}", self.remote_cluster_id))
    }
}

/// Runs the command; each step is printed as it happens.
pub async fn run(args: UnpeerArgs) -> anyhow::Result<()> {
    let client = refract_shared::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    run_with(client, args).await
}

/// [`run`] with a client built by the caller (`refractctl`'s, which honours its context);
/// `args.kubeconfig` is not read.
pub async fn run_with(client: kube::Client, args: UnpeerArgs) -> anyhow::Result<()> {
    let name = args.node();
    let nodes: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    let say = |what: &str| println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let Some(node) = nodes
        .get_opt(&name)
        .await
        .with_context(|| format!("failed to read node {name}"))?
    else {
        say(&format!("virtual node {name} does not exist: the peering is already gone from the origin; removing what may be left"));
        return clean_up(&client, &args, &name, &say).await;
    };
    // A destructive command on a node name someone typed: only a virtual node of this
    // peering is ever touched.
    let labels = node.labels();
    let is_ours = labels.get(VIRTUAL_NODE_TYPE_LABEL).map(String::as_str)
        == Some(VIRTUAL_NODE_TYPE)
        && labels.get(REMOTE_CLUSTER_ID_LABEL).map(String::as_str)
            == Some(args.remote_cluster_id.as_str());
    if !is_ours {
        bail!("node {name} is not the virtual node of provider {} (labels {VIRTUAL_NODE_TYPE_LABEL}={VIRTUAL_NODE_TYPE} and {REMOTE_CLUSTER_ID_LABEL}={} expected); nothing was changed", args.remote_cluster_id, args.remote_cluster_id);
    }
    let mode = match (args.force, Mode::requested(&node)) {
        (true, _) => Mode::Forced,
        (false, Ok(Some(Mode::Forced))) => {
            say("a forced unpeer was already requested; going on with it");
            Mode::Forced
        }
        (false, _) => Mode::Graceful,
    };
    let patch =
        serde_json::json!({"metadata": {"annotations": {UNPEER_ANNOTATION: mode.as_str()}}});
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("failed to ask for unpeering on node {name}"))?;
    say(&format!(
        "asked the local agent for a {} unpeer of provider {} (node {name})",
        mode.as_str(),
        args.remote_cluster_id
    ));
    match mode {
        Mode::Graceful => follow(&nodes, &name, args.timeout, &say).await,
        Mode::Forced => {
            match wait_for_agent(&nodes, &name).await? {
                Some(answer) => say(&answer),
                None => say("no local agent answered within 10s; cleaning up without it"),
            }
            clean_up(&client, &args, &name, &say).await?;
            tokio::time::sleep(STAYS_GONE).await;
            if nodes.get_opt(&name).await?.is_some() {
                bail!("node {name} was written again after its removal: a local agent for this peering still runs without seeing the request; stop it (scale its Deployment to 0) and run this again");
            }
            say("unpeered (forced): the provider was not called");
            Ok(())
        }
    }
}

/// Shows each step of the agent's progress (a watch, so none is missed) until the node is
/// gone.
async fn follow(
    nodes: &Api<Node>,
    name: &str,
    timeout: Duration,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(nodes.clone(), config).boxed();
    let mut shown = String::new();
    let mut listed = false;
    let followed = tokio::time::timeout(timeout, async {
        while let Some(event) = events.next().await {
            let node = match event {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                    listed = true;
                    n
                }
                Ok(watcher::Event::Delete(_)) => return Ok(()),
                // A (re)list that finds no node: it is gone.
                Ok(watcher::Event::InitDone) if !listed => return Ok(()),
                Ok(watcher::Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(_) => continue,
                Err(error) => {
                    tracing::debug!(%error, "node watch failed; retrying");
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            if let Some(p) = node.annotations().get(UNPEER_PROGRESS_ANNOTATION) {
                if *p != shown {
                    say(p);
                    shown.clone_from(p);
                }
            }
        }
        anyhow::Ok(())
    })
    .await;
    match followed {
        Ok(result) => {
            result?;
            say(&format!("unpeered: virtual node {name} removed"));
            Ok(())
        }
        Err(_) => bail!("the unpeer is not done after {timeout:?} (last progress: {shown:?}); is the local agent of this peering running? `local-agent unpeer --force` removes the peering from the origin without the provider"),
    }
}

/// The local agent's answer to a forced unpeer, if it gives one in time.
async fn wait_for_agent(nodes: &Api<Node>, name: &str) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + AGENT_ACK_WAIT;
    while Instant::now() < deadline {
        let Some(node) = nodes.get_opt(name).await? else {
            return Ok(Some(format!("virtual node {name} is gone already")));
        };
        let progress = node.annotations().get(UNPEER_PROGRESS_ANNOTATION);
        if let Some(p) = progress.filter(|p| p.starts_with("forced")) {
            return Ok(Some(p.clone()));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(None)
}

async fn clean_up(
    client: &kube::Client,
    args: &UnpeerArgs,
    name: &str,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let cleaned = origin::clean_up(client, name, args.remote_cluster_id.as_str())
        .await
        .context("failed to remove the peering from the origin")?;
    for pod in &cleaned.pods {
        say(&format!("deleted pod {pod}"));
    }
    for ns in &cleaned.statuses {
        say(&format!(
            "removed provider {} from the NamespaceOffloading status in {ns}",
            args.remote_cluster_id
        ));
    }
    if cleaned.node {
        say(&format!("deleted virtual node {name} and its Lease"));
    }
    Ok(())
}
