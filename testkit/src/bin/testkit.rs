//! `testkit`: start real control planes for the demo and for manual testing, and run the fake
//! kubelet against one of them.

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
        } => {
            let mut started = Vec::new();
            for name in clusters {
                let mut options = Options::named(&name);
                options.dir = Some(dir.join(&name));
                if controllers {
                    options = options.with_controllers();
                }
                eprintln!(
                    "starting control plane {name} (etcd + kube-apiserver{})",
                    if controllers {
                        " + scheduler + controller-manager"
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
                started.push(cp);
            }
            println!("ready");
            wait_for_signal().await;
            for cp in started {
                cp.stop().await;
            }
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
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            let client = kube::Client::try_from(config)?;
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

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("failed to install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
