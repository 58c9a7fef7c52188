//! Command-line flags.

use std::path::PathBuf;
use std::time::Duration;

use refract_shared::telemetry::TelemetryArgs;
use refract_shared::tls::ClusterId;

/// Refract's origin-side agent.
///
/// Connects to one provider's remote agent over mutual TLS (`refract.v1.Reflection/Sync`),
/// identifying itself with the cluster id in its client certificate, and streams the desired
/// state of the objects it reflects. It holds no credential for the provider's Kubernetes API.
/// When the stream drops it reconnects with jittered exponential backoff; a dead link is
/// detected with HTTP/2 keepalive.
///
/// Run with the agent's flags to connect; the commands below are tools beside it.
#[derive(Debug, clap::Parser)]
#[command(
    name = "local-agent",
    version,
    about,
    long_about,
    args_override_self = true,
    // `local-agent --remote ...` runs the agent; `local-agent preview ...` runs a tool, whose
    // flags are its own, and the agent's required flags are not asked for.
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// A tool to run instead of the agent.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Declares the agent's flags, used when no tool is named. Always `None` once parsed
    /// (see `refract_shared::cli`): read the flags through [`Invocation`].
    #[command(flatten)]
    pub agent: Option<Args>,
}

/// What the command line asks for: the agent's flags, or a tool.
pub type Invocation = refract_shared::cli::Invocation<Args, Command>;

/// The tools `local-agent` runs instead of the agent.
#[derive(Debug, clap::Subcommand)]
// A tool's help is its arguments' documentation, which a doc comment here would replace.
#[allow(missing_docs)]
pub enum Command {
    Preview(Box<crate::preview::PreviewArgs>),
    Unpeer(refract_admin::unpeer::command::UnpeerArgs),
    /// Prints the NamespaceOffloading CustomResourceDefinition as YAML, for `kubectl apply -f -`.
    Crd,
}

/// The agent's flags (see [`Cli`]).
// `clap::Args`, not `Parser`: only an `Args` has the group id by which [`Cli`] tells whether
// the agent's flags were given.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The remote agent's address: `host:port`, `[ipv6]:port` or `https://host:port`. The
    /// host must be a DNS name or IP in the remote agent's serving certificate (or see
    /// --tls-server-name).
    #[arg(long, value_name = "HOST:PORT")]
    pub remote: crate::connector::RemoteAddress,

    /// Name to verify the remote agent's certificate against, when it differs from the host in
    /// --remote.
    #[arg(long)]
    pub tls_server_name: Option<String>,

    /// This origin's client certificate chain (PEM). Re-read when it changes.
    #[arg(long)]
    pub tls_cert: PathBuf,

    /// The client certificate's private key (PEM). Re-read when it changes.
    #[arg(long)]
    pub tls_key: PathBuf,

    /// CA bundle (PEM) the remote agent's serving certificate must chain to.
    #[arg(long)]
    pub server_ca: PathBuf,

    /// This origin's cluster id; must match the SAN URI of --tls-cert.
    #[arg(long)]
    pub cluster_id: ClusterId,

    /// The provider's cluster id; the remote agent's certificate must carry it.
    #[arg(long)]
    pub remote_cluster_id: ClusterId,

    /// Kubeconfig of the origin cluster; else the in-cluster service account, else $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// HTTP/2 keepalive ping interval on the stream.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,

    /// How long to wait for a keepalive answer before declaring the link dead.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,

    /// How long a message may wait on the stream for others to share its write; 0ms sends each
    /// at once. A few milliseconds put several changes in one write, which the remote agent
    /// reads in one wake-up: at a steady 300 changes/s (BENCHMARKS.md, "Send window"), 5ms cut
    /// the agents' CPU per change by 13 % and 20ms by 25 %, and the provider's API server's by
    /// 13 % and 28 %, each adding about that much latency to every change. A burst fills a
    /// write at once and waits for nothing. At most 1s.
    #[arg(long, default_value = "0ms", env = "REFRACT_SEND_WINDOW", value_parser = parse_send_window)]
    pub send_window: Duration,

    /// First reconnect delay; doubles on each failure (with jitter) up to --max-backoff.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub min_backoff: Duration,

    /// Longest reconnect delay.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub max_backoff: Duration,

    /// How often certificate files are checked for changes.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub cert_poll_interval: Duration,

    /// Name of the virtual node standing for the provider (default `refract-<remote cluster id>`).
    #[arg(long)]
    pub node_name: Option<String>,

    /// The IP shown as the virtual node's address and as offloaded pods' host IP: the local
    /// agent's own pod IP.
    #[arg(long, env = "POD_IP", default_value = "127.0.0.1")]
    pub node_ip: String,

    /// Share of the provider's free resources the virtual node offers, in percent (integer
    /// resources such as GPUs are rounded down). Default 90, or the --reflection-config file's
    /// `controllerManager.config.resourceSharingPercentage`, which can change while the agent
    /// runs; this flag, when given, wins over the file.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub sharing_percentage: Option<u32>,

    /// How often the virtual node's health is checked (the link to the remote agent, and the
    /// provider's API server as the remote agent reports it), and its status and lease renewed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub health_check_interval: Duration,

    /// Failed health checks in a row before the virtual node turns NotReady (the origin then
    /// taints it and evicts pods as their tolerations say); the first passing check makes it
    /// Ready again.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub health_failure_threshold: u32,

    /// Rewrite provider pod IPs for the origin: FROM_CIDR=TO_CIDR (repeatable).
    #[arg(long = "remote-pod-remap", value_name = "FROM=TO")]
    pub remote_pod_remap: Vec<refract_core::remap::Rule>,

    /// Provider pod ranges used as they are, without remapping (repeatable; a flat network).
    /// With this or --remote-pod-remap, a provider pod IP outside every named range is left
    /// out of the origin pod's status, so origin Services never send traffic there. Loopback,
    /// link-local, multicast and unspecified addresses are refused always.
    #[arg(long = "remote-pod-cidr", value_name = "CIDR")]
    pub remote_pod_cidr: Vec<ipnet::IpNet>,

    /// The most provider events recorded at the origin per second; events beyond it are
    /// aggregated (repeats of one event raise its count) or, past the backlog, dropped and
    /// counted.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub event_rate: u32,

    /// Renew an offloaded pod's ServiceAccount token once this share of its lifetime has
    /// passed, in percent.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub token_refresh_percentage: u32,

    /// Pod offloading workers.
    #[arg(long, default_value_t = 10)]
    pub pod_reflection_workers: u32,

    /// Serve the pod admission webhook (HTTPS, `/mutate-pods`) on this address.
    #[arg(long, requires_all = ["webhook_cert", "webhook_key"])]
    pub webhook_listen: Option<std::net::SocketAddr>,

    /// The webhook's serving certificate (PEM).
    #[arg(long)]
    pub webhook_cert: Option<PathBuf>,

    /// The webhook's private key (PEM).
    #[arg(long)]
    pub webhook_key: Option<PathBuf>,

    /// Serve the virtual node's kubelet API (HTTPS: `kubectl logs`, `exec`, `attach`,
    /// `port-forward`, `/stats/summary`, `/metrics/resource`) on this address. The node
    /// advertises `--node-ip` and this port, so the origin's API server must reach that address.
    /// Without it, those commands fail for offloaded pods.
    #[arg(long, requires_all = ["kubelet_cert", "kubelet_key"])]
    pub kubelet_listen: Option<std::net::SocketAddr>,

    /// The kubelet API's serving certificate (PEM), re-read when it changes.
    #[arg(long)]
    pub kubelet_cert: Option<PathBuf>,

    /// The kubelet API's private key (PEM).
    #[arg(long)]
    pub kubelet_key: Option<PathBuf>,

    /// CA bundle that signs the origin API server's kubelet client certificate
    /// (kube-apiserver `--kubelet-client-certificate`). Callers with a certificate it signed are
    /// the certificate's subject; without this flag only bearer tokens (checked by TokenReview)
    /// are accepted. Either way, the origin's SubjectAccessReview must allow the caller
    /// `nodes/proxy` (or `nodes/stats`, `nodes/metrics`) on the virtual node.
    #[arg(long, requires = "kubelet_listen")]
    pub kubelet_client_ca: Option<PathBuf>,

    /// What is reflected, and how.
    #[command(flatten)]
    pub reflection: crate::config::ReflectionFlags,

    /// Logging and admin endpoint.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    /// The async runtime.
    #[command(flatten)]
    pub runtime: refract_shared::runtime::RuntimeArgs,

    /// Replicas: one leads the peering (the stream, the virtual node and its kubelet API,
    /// origin status), elected on the Lease `refract-local-agent-<remote cluster id>`; every
    /// replica serves the webhook.
    #[command(flatten)]
    pub leader_election: refract_shared::leader::LeaderElectionArgs,
}

impl Args {
    /// The virtual node's name.
    pub fn node_name(&self) -> String {
        self.node_name
            .clone()
            .unwrap_or_else(|| format!("refract-{}", self.remote_cluster_id))
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    refract_core::duration::parse(s)
}

fn parse_send_window(s: &str) -> Result<Duration, String> {
    let window = parse_duration(s)?;
    if window > Duration::from_secs(1) {
        return Err(format!(
            "{s} would hold every change that long; use at most 1s (a few ms is the useful range)"
        ));
    }
    Ok(window)
}

#[cfg(test)]
mod command_line_tests {
    use super::{Cli, Command, Invocation};

    #[test]
    fn the_agents_flags_run_the_agent_and_a_tool_runs_alone() {
        let parsed = Invocation::try_parse_from::<Cli, _, _>([
            "local-agent",
            "--remote=provider.example:6443",
            "--tls-cert=/c",
            "--tls-key=/k",
            "--server-ca=/ca",
            "--cluster-id=origin",
            "--remote-cluster-id",
            "provider",
            "--worker-threads=2",
        ]);
        let Ok(Invocation::Agent(agent)) = parsed else {
            panic!("the agent's flags run the agent: {parsed:?}");
        };
        assert_eq!(agent.remote_cluster_id.as_str(), "provider");
        assert_eq!(agent.runtime.worker_threads, 2, "a nested group's flag");

        for tool in [
            vec!["local-agent", "crd"],
            vec!["local-agent", "unpeer", "--remote-cluster-id=provider"],
            vec![
                "local-agent",
                "preview",
                "--cluster-id=origin",
                "--remote-cluster-id=provider",
            ],
        ] {
            let parsed = Invocation::try_parse_from::<Cli, _, _>(&tool);
            assert!(matches!(parsed, Ok(Invocation::Tool(_))), "{tool:?}");
        }
        assert!(matches!(
            Invocation::try_parse_from::<Cli, _, _>(["local-agent", "crd"]),
            Ok(Invocation::Tool(Command::Crd))
        ));
        let missing = Invocation::try_parse_from::<Cli, _, _>(["local-agent"])
            .unwrap_err()
            .to_string();
        assert!(missing.contains("--remote"), "{missing}");
    }
}
