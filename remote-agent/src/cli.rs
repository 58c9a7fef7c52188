//! Command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use refract_shared::telemetry::TelemetryArgs;
use refract_shared::tls::ClusterId;

use crate::policy::Level;

/// Refract's provider-side agent.
///
/// Serves the `refract.v1.Reflection` stream over mutual TLS. Every origin cluster (tenant) is
/// identified by the cluster id in its client certificate (`spiffe://refract/cluster/<id>`),
/// signed by a CA in `--client-ca`; the remote agent writes that tenant's objects into the
/// tenant's own namespaces only, with its own Kubernetes identity. Also serves
/// `grpc.health.v1.Health`, gRPC server reflection and the read-only `refract.v1.Inspect`.
///
/// Run with the agent's flags to serve; the commands below are tools beside it.
#[derive(Debug, clap::Parser)]
#[command(
    name = "remote-agent",
    version,
    about,
    long_about,
    // `remote-agent --tls-cert ...` runs the agent; `remote-agent crd` runs a tool, whose
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

/// The tools `remote-agent` runs instead of the agent.
#[derive(Debug, clap::Subcommand)]
// A tool's help is its arguments' documentation, which a doc comment here would replace.
#[allow(missing_docs)]
pub enum Command {
    /// Prints the ShadowPod CustomResourceDefinition as YAML, for `kubectl apply -f -`.
    Crd,
    RemoveTenant(refract_admin::tenant::RemoveTenantArgs),
}

/// The agent's flags (see [`Cli`]).
// `clap::Args`, not `Parser`: only an `Args` has the group id by which [`Cli`] tells whether
// the agent's flags were given.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to serve gRPC on.
    #[arg(long, default_value = "0.0.0.0:6443")]
    pub listen: SocketAddr,

    /// This provider's serving certificate chain (PEM). Re-read when it changes.
    #[arg(long)]
    pub tls_cert: PathBuf,

    /// The serving certificate's private key (PEM). Re-read when it changes.
    #[arg(long)]
    pub tls_key: PathBuf,

    /// CA bundle (PEM) that origin client certificates must chain to. Re-read when it changes.
    #[arg(long)]
    pub client_ca: PathBuf,

    /// This provider's cluster id; must match the SAN URI of --tls-cert.
    #[arg(long)]
    pub cluster_id: ClusterId,

    /// Kubeconfig of the provider cluster; else the in-cluster service account, else $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Pod Security Standards level tenants' pods must meet, checked by the remote agent and set
    /// as the Pod Security Admission label of tenant namespaces. The default for every tenant;
    /// a --policy file can set it per tenant.
    #[arg(long, value_enum, default_value = "baseline")]
    pub pod_security_level: Level,

    /// YAML file of what tenants may have written: `defaults` for every tenant and `tenants:
    /// {<cluster-id>: ...}` overriding them field by field (pod security level, priority
    /// classes, tolerated taints, Service types and addresses, endpoint ranges, Ingress
    /// annotations and classes, storage classes, twin namespace names, quotas, network fences,
    /// and the custom resource kinds each tenant may write, `customKinds`, each watched from
    /// the moment the policy names it). See the README,
    /// "Provider policy". An invalid file stops the agent at start; afterwards the file is read
    /// again every second, a valid change is in force at once (and objects already written are
    /// judged again), and an invalid one is refused with the last good policy kept
    /// (`refract_remote_policy_file_valid` 0).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,

    /// The namespace this agent runs in (from the pod's `POD_NAMESPACE`, which `deploy/` sets):
    /// no tenant may have a twin namespace of that name, as none may have `default` or
    /// `kube-*`.
    #[arg(long, env = "POD_NAMESPACE", default_value = "refract-system")]
    pub own_namespace: String,

    /// The Secret in --own-namespace with the peering CA (`tls.crt`, `tls.key`; cert-manager's
    /// CA issuer layout) that signs tenants' client certificates: Kubernetes
    /// CertificateSigningRequests with signerName `refract.io/tenant-client`, once an admin
    /// has approved them (`kubectl certificate approve`). Only what the request's key proves
    /// and its one Refract identity are taken from it. Empty: the agent signs nothing.
    #[arg(long, value_name = "SECRET", default_value = "refract-peering-ca")]
    pub tenant_ca_secret: String,

    /// How long a tenant certificate the agent signs is valid, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(i64).range(1..=3650))]
    pub tenant_certificate_days: i64,

    /// The provider's own pod and Service ranges (repeatable): no tenant EndpointSlice may
    /// point into them, and each twin namespace's NetworkPolicy keeps tenants' pods from
    /// reaching them. Node addresses, the pod ranges nodes publish (spec.podCIDR) and the API
    /// server's Service address are found without it; the Service range never is.
    #[arg(long = "provider-cidr", value_name = "CIDR")]
    pub provider_cidrs: Vec<IpNet>,

    /// How long held-back deletions wait: a twin namespace that holds PersistentVolumeClaims,
    /// and an orphan collection removing more than --max-orphan-share of a tenant's objects.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub deletion_grace: Duration,

    /// Remove a tenant (its namespaces, with the ShadowPods, pods and reflected objects in
    /// them) once its origin has not connected for this long. Unset (the default), a tenant is
    /// never removed for being away; a dropped link alone never removes anything. Counted from
    /// the tenant's last disconnect, and never from before this agent started.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub tenant_expiry: Option<Duration>,

    /// The share (percent) of a tenant's objects of a kind in a namespace that one orphan
    /// collection may remove without waiting --deletion-grace (collections of fewer than 10
    /// objects never wait).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub max_orphan_share: u8,

    /// The largest object a tenant may send, in bytes of JSON; larger ones are refused with
    /// the outcome INVALID, and the stream goes on.
    #[arg(long, default_value_t = refract_core::limits::MAX_OBJECT_BYTES)]
    pub max_object_bytes: usize,

    /// Label suggested for tenants' virtual nodes, KEY=VALUE (repeatable), e.g.
    /// `topology.kubernetes.io/region=eu-west`.
    #[arg(long = "node-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub node_labels: Vec<(String, String)>,

    /// Client identities (cluster ids) allowed to see every tenant through Inspect. Any other
    /// client sees only itself.
    #[arg(long = "inspect-admin")]
    pub inspect_admins: Vec<ClusterId>,

    /// A file of tenants cut off from this provider: one cluster id, or `serial:<hex>` for a
    /// single client certificate, per line (`#` comments). Re-read every second: a tenant
    /// added is disconnected at once and refused until removed; its objects and pods stay.
    /// Without it, every certificate the client CA signed is let in.
    #[arg(long, value_name = "FILE")]
    pub tenant_deny_list: Option<std::path::PathBuf>,

    /// Close connections older than this (after a grace period) so long-lived streams move
    /// onto rotated certificates.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub max_connection_age: Duration,

    /// How long a connection past --max-connection-age keeps its open streams before it is
    /// closed.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub max_connection_age_grace: Duration,

    /// HTTP/2 keepalive ping interval; a peer silent for this plus the timeout is dropped.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,

    /// How long to wait for a keepalive answer.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,

    /// HTTP/2 streams one connection may have open at once: the Sync stream, Inspect, health
    /// and reflection calls, and every open kubelet call (each `logs -f`, exec, attach and
    /// forwarded connection is one).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_concurrent_streams: u32,

    /// Connections one source address may have at once, handshaking or open; more are closed
    /// at once. Origins behind one NAT address share it: raise it for them.
    #[arg(long, default_value_t = crate::access::sources::MAX_PER_SOURCE as u32, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub max_connections_per_source: u32,

    /// Kubelet calls (logs, exec, attach, port-forward connections) one tenant may have open
    /// at once; more are refused with RESOURCE_EXHAUSTED. At most 60: each call may fill its
    /// 256 KiB window of the link's 16 MiB, and the reflection stream must still move.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=refract_core::limits::MAX_KUBELET_SESSIONS as i64))]
    pub max_kubelet_sessions: u32,

    /// Where the CPU and memory of offloaded pods come from, for the origin's `kubectl top`:
    /// `metrics-api` reads `metrics.k8s.io` (metrics-server) as each tenant, in its namespaces
    /// only; `kubelet-summary` reads every node's `/stats/summary` through `nodes/proxy`, a
    /// right that reaches every kubelet API of every node (exec included), granted only by
    /// applying deploy/remote-agent/rbac-kubelet-stats.yaml; `off` shares none.
    #[arg(long, value_enum, default_value = "metrics-api")]
    pub pod_stats: crate::kubelet::stats::StatsSource,

    /// Requests of one tenant applied to the provider at the same time, when no other tenant
    /// is writing (see --apply-concurrency-total). Requests for the same object are always
    /// applied in the order they were sent.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub apply_concurrency: u16,

    /// Requests applied at the same time shared evenly among the tenants writing (those that
    /// started a write in the last 2s): each may have this divided by their number in flight,
    /// at least 1 and at most --apply-concurrency. One tenant's burst then cannot fill the
    /// provider API server's queue ahead of every other tenant's writes; a tenant writing
    /// alone keeps its whole --apply-concurrency.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub apply_concurrency_total: u16,

    /// Writes a second one tenant may start while other tenants are writing too (a write
    /// started in the last 2s). Seats bound what a tenant holds in flight, not how fast it
    /// goes: one seat kept busy still loads the provider API server and etcd, and near their
    /// capacity every other tenant's write queues behind it. A tenant writing now and then
    /// never meets the limit (a quarter second of it may start at once); a tenant writing
    /// alone is held by --apply-concurrency only. Raise it with the provider API server's
    /// capacity; 0 turns the limit off.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub tenant_write_rate: u32,

    /// ShadowPods the controller reconciles at the same time, across all tenants (each one's
    /// changes in order), so that one tenant's slow pod creates (a provider admission webhook
    /// timing out, say) do not hold up every other tenant's pods. A new pod takes four
    /// provider API calls (the ShadowPod's status, a read, the create, the status again).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub pod_workers: u16,

    /// How long an acknowledgement of a write waits for others before it is sent, so that
    /// several leave in one write and wake the local agent once: at a steady 200 changes/s,
    /// 100ms sends about twenty together. Refusals, answers the origin waits on (twin
    /// namespaces), pod status and events never wait; an object only shows unacknowledged
    /// (`refractctl status`) up to this much longer. 0 sends each at once. At most 1s.
    #[arg(long, default_value = "100ms", env = "REFRACT_ACK_LINGER", value_parser = parse_ack_linger)]
    pub ack_linger: Duration,

    /// How often certificate files are checked for changes.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub cert_poll_interval: Duration,

    /// How many times a tenant's copy may be restored within --drift-quarantine-window after
    /// someone else on the provider changed or deleted it (only restores that change it back
    /// count: a status written there does not). One more quarantines it: something there (a
    /// controller, a GitOps tool) keeps rewriting it, and restoring it would fight that writer
    /// for ever. A quarantined copy is left as that writer made it, the origin object gets a
    /// ReflectionQuarantined Warning event, and Inspect and `refractctl status` show it. 0
    /// never quarantines.
    #[arg(long, default_value_t = 5)]
    pub drift_quarantine_restores: u32,

    /// How far back restores count towards --drift-quarantine-restores. The origin is told
    /// of a fight's first restore (a ReflectionDrifted event), then at most once per window.
    #[arg(long, default_value = "1m", value_parser = parse_positive_duration)]
    pub drift_quarantine_window: Duration,

    /// How long a quarantined copy must go without anyone else writing it before it is
    /// restored again. A provider operator may end a quarantine sooner with
    /// `refract.v1.Inspect/ClearQuarantine`.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration)]
    pub drift_quarantine_quiet: Duration,

    /// Logging and admin endpoint.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    /// The async runtime.
    #[command(flatten)]
    pub runtime: refract_shared::runtime::RuntimeArgs,

    /// Replicas: each tenant is served by one replica at a time, the holder of Lease
    /// `refract-tenant-<tenant>` (a tenant's new connection to another replica asks for it);
    /// the work that spans tenants (ShadowPods, expiry, fences) runs on the holder of Lease
    /// `refract-remote-agent`. Leases live in `--own-namespace` unless
    /// `--leader-election-namespace` says otherwise.
    #[command(flatten)]
    pub leader_election: refract_shared::leader::LeaderElectionArgs,
}

impl Args {
    /// The policy every tenant gets before the --policy file: the defaults, at
    /// --pod-security-level.
    pub fn base_policy(&self) -> crate::policy::TenantPolicy {
        crate::policy::TenantPolicy {
            pod_security: self.pod_security_level,
            ..Default::default()
        }
    }

    /// What tenants may have written: the --policy file over the flags' defaults.
    pub fn limits(&self) -> Result<crate::apply::Limits, crate::policy::PolicyError> {
        let base = self.base_policy();
        let policies = match &self.policy {
            Some(path) => crate::policy::Policies::load(path, base)?,
            None => crate::policy::Policies::uniform(base),
        };
        Ok(crate::apply::Limits {
            policies,
            networks: crate::policy::ProviderNetworks {
                cidrs: self.provider_cidrs.clone(),
            },
            max_object_bytes: self.max_object_bytes,
            safety: crate::apply::DeletionSafety {
                grace: self.deletion_grace,
                max_share_percent: self.max_orphan_share,
                ..Default::default()
            },
            own_namespace: self.own_namespace.clone(),
        })
    }

    /// When a fight over a tenant's copy becomes a quarantine, and when it ends.
    pub fn fight_rule(&self) -> crate::restore::fights::FightRule {
        crate::restore::fights::FightRule {
            restores: self.drift_quarantine_restores,
            window: self.drift_quarantine_window,
            quiet: self.drift_quarantine_quiet,
        }
    }

    /// The suggested virtual node labels as a map.
    pub fn node_labels(&self) -> std::collections::BTreeMap<String, String> {
        self.node_labels.iter().cloned().collect()
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} must be KEY=VALUE"))
}

/// Parses durations such as `500ms`, `20s`, `5m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    refract_core::duration::parse(s)
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(format!("{s} must be longer than 0")),
        d => Ok(d),
    }
}

fn parse_ack_linger(s: &str) -> Result<Duration, String> {
    let linger = parse_duration(s)?;
    let most = crate::sync::coalesce::MAX_ACK_LINGER;
    if linger > most {
        return Err(format!("{s} is longer than {most:?}"));
    }
    Ok(linger)
}

#[cfg(test)]
mod command_line_tests {
    use super::{Cli, Command, Invocation};

    #[test]
    fn the_agents_flags_run_the_agent_and_a_tool_runs_alone() {
        let parsed = Invocation::try_parse_from::<Cli, _, _>([
            "remote-agent",
            "--tls-cert=/c",
            "--tls-key=/k",
            "--client-ca",
            "/ca",
            "--cluster-id=provider",
            "--log-level=debug",
        ]);
        let Ok(Invocation::Agent(agent)) = parsed else {
            panic!("the agent's flags run the agent: {parsed:?}");
        };
        assert_eq!(agent.cluster_id.as_str(), "provider");
        assert_eq!(agent.telemetry.log_level, "debug", "a nested group's flag");

        let tool = Invocation::try_parse_from::<Cli, _, _>([
            "remote-agent",
            "remove-tenant",
            "--cluster-id=o",
        ]);
        assert!(matches!(
            tool,
            Ok(Invocation::Tool(Command::RemoveTenant(_)))
        ));
        assert!(matches!(
            Invocation::try_parse_from::<Cli, _, _>(["remote-agent", "crd"]),
            Ok(Invocation::Tool(Command::Crd))
        ));

        // Neither: the agent's required flags are asked for by name.
        let missing = Invocation::try_parse_from::<Cli, _, _>(["remote-agent"])
            .unwrap_err()
            .to_string();
        assert!(missing.contains("--tls-cert"), "{missing}");
        // A tool does not take the agent's flags.
        assert!(
            Invocation::try_parse_from::<Cli, _, _>(["remote-agent", "crd", "--tls-cert=/c"])
                .is_err()
        );
    }

    #[test]
    fn kubelet_sessions_stay_within_what_the_links_window_holds() {
        let with = |sessions: &str| {
            Invocation::try_parse_from::<Cli, _, _>([
                "remote-agent",
                "--tls-cert=/c",
                "--tls-key=/k",
                "--client-ca=/ca",
                "--cluster-id=provider",
                &format!("--max-kubelet-sessions={sessions}"),
            ])
        };
        assert!(with("60").is_ok());
        let refused = with("61").unwrap_err().to_string();
        assert!(refused.contains("1..=60"), "{refused}");
    }
}
