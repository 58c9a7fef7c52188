//! `testkit`: start real control planes for the demo and for manual testing, and run the fake
//! kubelet against one of them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use refract_testkit::fake_kubelet::{self, FakeNode};
use refract_testkit::{ControlPlane, Options};
use tokio_util::sync::CancellationToken;

/// Real Kubernetes 1.20.2 control planes on 127.0.0.1, for Refract's demo and tests.
#[derive(Parser)]
#[command(name = "testkit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start control planes and keep them running until interrupted.
    ///
    /// For each `--cluster NAME` it writes `<dir>/NAME/kubeconfig`, then prints `ready` on
    /// stdout once all of them answer. Ctrl-C or SIGTERM stops them all.
    Up {
        /// Folder to keep the clusters' files in.
        #[arg(long)]
        dir: PathBuf,
        /// A cluster to start (repeatable).
        #[arg(long = "cluster", required = true)]
        clusters: Vec<String>,
        /// Also run kube-scheduler and kube-controller-manager in every cluster.
        #[arg(long)]
        controllers: bool,
        /// Give a cluster a real node (containerd, kubelet, a CNI bridge) whose pod subnet is
        /// a free /24 of RANGE, e.g. `provider=10.200.0.0/16` (repeatable; implies
        /// --controllers for that cluster). Its pods run as real containers from the images of
        /// `scripts/images.sh --base`.
        #[arg(long = "node", value_name = "CLUSTER=RANGE")]
        nodes: Vec<String>,
        /// Give every --node a network namespace of its own with kube-proxy, so that
        /// Services route and pods reach their API server; its InternalIP is the node's end
        /// of a veth pair (10.251.0.0/16), where the machine reaches its NodePorts.
        #[arg(long, requires = "nodes")]
        own_network: bool,
        /// Also start an image registry on loopback, push the agents' images there
        /// (`scripts/images.sh --profile debug --push`) and let every --node pull from it, so
        /// that `refractctl` installs the agents by image reference as on real clusters.
        /// Prints `registry <HOST:PORT>/refract` on stdout before `ready`.
        #[arg(long, requires = "nodes")]
        agent_images: bool,
    },
    /// Provision volumes for claims of the stand-in storage classes (provisioner
    /// `refract.test/fake-provisioner`): each volume is a folder a real kubelet creates.
    FakeProvisioner {
        /// The cluster's kubeconfig.
        #[arg(long)]
        kubeconfig: PathBuf,
    },
    /// Register fake nodes in a cluster and run the pods bound to them.
    FakeKubelet {
        /// The cluster's kubeconfig.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Node name prefix; nodes are `<prefix>-1` .. `<prefix>-<count>`.
        #[arg(long, default_value = "provider-node")]
        prefix: String,
        /// How many nodes.
        #[arg(long, default_value_t = 1)]
        count: u8,
        /// CPU per node.
        #[arg(long, default_value = "8")]
        cpu: String,
        /// Memory per node.
        #[arg(long, default_value = "16Gi")]
        memory: String,
        /// Pod CIDR; each node gets a /24 of it.
        #[arg(long, default_value = "10.200.0.0/16")]
        pod_cidr: ipnet::Ipv4Net,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Up {
            dir,
            clusters,
            controllers,
            nodes,
            own_network,
            agent_images,
        } => {
            let mut ranges = std::collections::BTreeMap::new();
            for node in &nodes {
                let (cluster, range) = node
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--node {node:?}: the form is CLUSTER=RANGE"))?;
                anyhow::ensure!(
                    clusters.iter().any(|c| c == cluster),
                    "--node {node:?}: no --cluster {cluster}"
                );
                ranges.insert(cluster.to_string(), range.to_string());
            }
            let mut started = Vec::new();
            for name in clusters {
                let mut options = Options::named(&name);
                options.dir = Some(dir.join(&name));
                if controllers {
                    options = options.with_controllers();
                }
                let range = ranges.get(&name);
                if let Some(range) = range {
                    let pulled: &[&str] = if agent_images {
                        &["local-agent", "remote-agent", "refractctl"]
                    } else {
                        &[]
                    };
                    options = options.with_node(range, pulled)?;
                    if own_network {
                        options = options.with_own_network();
                    }
                }
                eprintln!(
                    "starting control plane {name} (etcd + kube-apiserver{}{})",
                    if options.controller_manager {
                        " + scheduler + controller-manager"
                    } else {
                        ""
                    },
                    if range.is_some() {
                        " + a real node: containerd, kubelet, CNI bridge"
                    } else {
                        ""
                    }
                );
                let cp = ControlPlane::start(options).await?;
                eprintln!(
                    "{name}: {} kubeconfig {}",
                    cp.server,
                    cp.kubeconfig.display()
                );
                if let Some(node) = &cp.node {
                    eprintln!(
                        "{name}: node {} with pods in {} on bridge {}, logs in {}",
                        refract_testkit::node::NODE_NAME,
                        node.pod_cidr,
                        node.bridge,
                        node.dir.display()
                    );
                }
                started.push(cp);
            }
            if agent_images {
                let registry = refract_testkit::registry::Registry::shared()?;
                println!("registry {}/refract", registry.address);
            }
            println!("ready");
            wait_for_signal().await;
            for cp in started {
                cp.stop().await;
            }
            Ok(())
        }
        Command::FakeProvisioner { kubeconfig } => {
            let client = client_of(&kubeconfig).await?;
            let shutdown = CancellationToken::new();
            let on_signal = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                on_signal.cancel();
            });
            refract_testkit::fake_provisioner::run(client, shutdown).await;
            Ok(())
        }
        Command::FakeKubelet {
            kubeconfig,
            prefix,
            count,
            cpu,
            memory,
            pod_cidr,
        } => {
            let client = client_of(&kubeconfig).await?;
            let subnets: Vec<_> = pod_cidr.subnets(24)?.take(count as usize).collect();
            let nodes = (1..=count)
                .zip(subnets)
                .map(|(i, cidr)| {
                    FakeNode::new(
                        &format!("{prefix}-{i}"),
                        &cpu,
                        &memory,
                        cidr,
                        std::net::Ipv4Addr::new(127, 0, 10, i),
                    )
                })
                .collect();
            let shutdown = CancellationToken::new();
            let on_signal = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                on_signal.cancel();
            });
            fake_kubelet::run(client, nodes, shutdown).await
        }
    }
}

async fn client_of(kubeconfig: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("failed to install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
