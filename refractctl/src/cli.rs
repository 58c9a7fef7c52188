//! `refractctl`'s command line.

use std::path::PathBuf;
use std::time::Duration;

use refract_shared::tls::ClusterId;

use crate::plan::HostPort;

/// Peers two Kubernetes clusters with Refract and looks after the peering.
///
/// Two admins, each with their own cluster's kubeconfig only, peer in four steps; each step
/// prints the next:
///
///   provider: refractctl install provider --provider-id P --provider-endpoint HOST:PORT --registry R
///   origin:   refractctl join request --origin-id O --provider-id P --out O.csr.yaml
///   provider: kubectl apply -f O.csr.yaml; kubectl certificate approve refract-tenant-O;
///             refractctl tenant export --origin-id O --provider-id P --provider-endpoint HOST:PORT --out O.bundle.yaml
///   origin:   refractctl join complete --bundle O.bundle.yaml --registry R
///
/// The tenant's key is made in the origin and never leaves it; the remote agent signs the
/// approved request with the CA in its own Secret, whose key never leaves the provider; the
/// bundle holds certificates and the endpoint only. No kubeconfig or token of either cluster
/// is stored in the other.
///
/// `peer`, with both kubeconfigs, runs the same steps in a row (approving the request itself);
/// `rotate` does the same for a new key. `status`, `tap` and `unpeer` need the origin's
/// kubeconfig only: they reach the provider's agent with the origin's own certificate, the
/// way the local agent does.
#[derive(Debug, clap::Parser)]
#[command(name = "refractctl", version, about, long_about, verbatim_doc_comment)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,

    /// The namespace the agents run in and keep their Secrets in, in every cluster this
    /// command reaches (deploy/'s is refract-system). Give the same one to every command of a
    /// peering, on both sides.
    #[arg(
        short = 'n',
        long,
        global = true,
        env = "REFRACT_NAMESPACE",
        default_value = crate::manifests::DEFAULT_NAMESPACE,
        value_parser = namespace_name
    )]
    pub namespace: String,
}

/// A namespace's name as Kubernetes takes it: a DNS label (RFC 1123).
fn namespace_name(name: &str) -> Result<String, String> {
    let valid = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a namespace name: 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit"
        ))
    }
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Peers an origin with a provider, holding both kubeconfigs: installs the provider's half,
    /// asks for the tenant's certificate as two admins would (a key made in the origin, a
    /// CertificateSigningRequest approved here and signed by the remote agent), installs the
    /// origin's half and waits until the tenant is connected and the virtual node Ready.
    Peer(PeerArgs),
    /// Shows each peering of an origin: agent, link, certificate, virtual node, offloaded
    /// namespaces, queue and the provider's last refusals.
    Status(StatusArgs),
    /// Ends a peering: graceful (the provider removes the tenant's namespaces) or --force (for a
    /// dead provider), then removes the peering's local agent and Secrets.
    Unpeer(UnpeerArgs),
    /// Makes a new key in the origin and has the remote agent sign a certificate for it (a
    /// CertificateSigningRequest approved here), then puts it in place; the local agent loads
    /// it without a restart.
    Rotate(RotateArgs),
    /// Shows a peering's stream live, one line per message, with Secret data and tokens
    /// redacted by the provider.
    Tap(TapArgs),
    /// Installs or updates the provider's remote agent, once per provider; adding a tenant
    /// never touches it.
    #[command(subcommand)]
    Install(InstallCommand),
    /// The origin admin's steps of a peering made by two admins: `join request`, then (after
    /// the provider's admin ran `tenant export`) `join complete`.
    #[command(subcommand)]
    Join(JoinCommand),
    /// The provider admin's step of a peering made by two admins: `tenant export`.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Prints this client's version and, for each peering of the origin, both agents'.
    Version(VersionArgs),
    /// Prints a shell completion script: `source <(refractctl completion bash)`.
    Completion(CompletionArgs),
}

/// `refractctl install`.
#[derive(Debug, clap::Subcommand)]
pub enum InstallCommand {
    /// The provider's half, with the provider's kubeconfig only: the peering CA (made once,
    /// its key kept in Secret refract-system/refract-peering-ca), the remote agent's serving
    /// certificate and deploy/remote-agent at this version. Run again (to upgrade, or to change
    /// its flags), it keeps the flags an admin added to the Deployment by hand.
    Provider(InstallProviderArgs),
}

/// `refractctl install provider`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallProviderArgs {
    #[command(flatten)]
    pub provider: ProviderArgs,

    /// The provider's cluster id (a DNS label).
    #[arg(long)]
    pub provider_id: ClusterId,

    /// Where origins reach the remote agent (HOST:PORT): the remote agent's serving
    /// certificate is issued for this host. Required unless --single-host.
    #[arg(
        long,
        value_name = "HOST:PORT",
        required_unless_present = "single_host"
    )]
    pub provider_endpoint: Option<HostPort>,

    #[command(flatten)]
    pub images: ImageArgs,

    /// A further remote agent flag, e.g. `--remote-agent-arg=--policy=/etc/refract/policy.yaml`
    /// (repeatable; see `remote-agent --help`). Flags added to the Deployment by hand are kept
    /// when this runs again; these and refractctl's own replace theirs.
    #[arg(
        long = "remote-agent-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    pub remote_agent_args: Vec<String>,

    #[command(flatten)]
    pub single_host: SingleHostArgs,

    /// How long to wait for the remote agent to become available.
    #[arg(long, default_value = "5m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,

    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// `refractctl join`.
#[derive(Debug, clap::Subcommand)]
pub enum JoinCommand {
    /// Step 1, by the origin's admin: makes the tenant's key in the origin (Secret
    /// refract-system/refract-local-agent-<provider>-request; it never leaves) and writes a
    /// CertificateSigningRequest for the provider's admin. Run again, it writes the same
    /// request; after `join complete`, a new key (this is how two admins rotate).
    Request(JoinRequestArgs),
    /// Step 3, by the origin's admin: puts the certificate of the provider admin's bundle next
    /// to the key, installs this peering's local agent and waits until it works.
    Complete(JoinCompleteArgs),
}

/// `refractctl join request`.
#[derive(Debug, Clone, clap::Args)]
pub struct JoinRequestArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// The origin's cluster id (a DNS label): the tenant's name on the provider.
    #[arg(long)]
    pub origin_id: ClusterId,

    /// The provider's cluster id (a DNS label).
    #[arg(long)]
    pub provider_id: ClusterId,

    /// Where to write the CertificateSigningRequest (default: standard output).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// With --dry-run, the Secret that would keep the key (never its data); no key is made and
    /// no request written.
    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// `refractctl join complete`.
#[derive(Debug, Clone, clap::Args)]
pub struct JoinCompleteArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// The bundle the provider's admin wrote with `tenant export` (certificate, CA
    /// certificate, endpoint; nothing secret).
    #[arg(long, value_name = "FILE")]
    pub bundle: PathBuf,

    #[command(flatten)]
    pub local_agent: LocalAgentArgs,

    #[command(flatten)]
    pub images: ImageArgs,

    #[command(flatten)]
    pub single_host: SingleHostArgs,

    /// How long to wait for the local agent, the connection and the virtual node.
    #[arg(long, default_value = "5m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,

    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// `refractctl tenant`.
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Step 2, by the provider's admin, after `kubectl apply -f` of the origin's request and
    /// `kubectl certificate approve refract-tenant-<origin id>`: waits for the remote agent to
    /// sign it, records the tenant, and writes the bundle for the origin's admin.
    Export(TenantExportArgs),
}

/// `refractctl tenant export`.
#[derive(Debug, Clone, clap::Args)]
pub struct TenantExportArgs {
    #[command(flatten)]
    pub provider: ProviderArgs,

    /// The tenant's (origin's) cluster id.
    #[arg(long)]
    pub origin_id: ClusterId,

    /// This provider's cluster id.
    #[arg(long)]
    pub provider_id: ClusterId,

    /// Where the origin's agent reaches this provider's (HOST:PORT), as given to `install
    /// provider`.
    #[arg(long, value_name = "HOST:PORT")]
    pub provider_endpoint: HostPort,

    /// Where to write the bundle (default: standard output).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// How long to wait for the request to be approved and signed.
    #[arg(long, default_value = "2m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,

    /// With --dry-run, the request is checked and the tenant's record named; nothing is
    /// waited for or written.
    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// The provider's kubeconfig, for the commands its admin runs.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// Kubeconfig of the provider cluster (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub provider_kubeconfig: Option<PathBuf>,

    /// The context of the provider's kubeconfig to use (default: its current context).
    #[arg(long, value_name = "CONTEXT")]
    pub provider_context: Option<String>,
}

/// `refractctl version`.
#[derive(Debug, Clone, clap::Args)]
pub struct VersionArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// Only this client's version; no cluster is asked.
    #[arg(long)]
    pub client: bool,

    /// How to print.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// `refractctl completion`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The origin's kubeconfig and the peering's provider, shared by several commands.
#[derive(Debug, Clone, clap::Args)]
pub struct OriginArgs {
    /// Kubeconfig of the origin cluster (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub origin_kubeconfig: Option<PathBuf>,

    /// The context of the origin's kubeconfig to use (default: its current context).
    #[arg(long, value_name = "CONTEXT")]
    pub origin_context: Option<String>,
}

/// `refractctl peer`.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// Kubeconfig of the provider cluster.
    #[arg(long, value_name = "FILE")]
    pub provider_kubeconfig: PathBuf,

    /// The context of the provider's kubeconfig to use (default: its current context).
    #[arg(long, value_name = "CONTEXT")]
    pub provider_context: Option<String>,

    /// The origin's cluster id (a DNS label): the tenant's name on the provider, in its
    /// namespaces' names (`<namespace>-<origin-id>`) and its certificate.
    #[arg(long)]
    pub origin_id: ClusterId,

    /// The provider's cluster id (a DNS label): the virtual node is `refract-<provider-id>`.
    #[arg(long)]
    pub provider_id: ClusterId,

    /// Where the origin's agent reaches the provider's agent (HOST:PORT): the address of the
    /// `refract-remote-agent` Service exposed by a LoadBalancer, a NodePort or an ingress
    /// passing TLS through. The remote agent's certificate is issued for this host. Required
    /// unless --single-host.
    #[arg(
        long,
        value_name = "HOST:PORT",
        required_unless_present = "single_host"
    )]
    pub provider_endpoint: Option<HostPort>,

    #[command(flatten)]
    pub local_agent: LocalAgentArgs,

    #[command(flatten)]
    pub images: ImageArgs,

    #[command(flatten)]
    pub single_host: SingleHostArgs,

    /// How long to wait for the agents, the connection and the virtual node.
    #[arg(long, default_value = "5m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,

    /// With --dry-run, the provider's objects come first, then the origin's (with -o json, one
    /// List for each).
    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// `refractctl status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// Only the peering with this provider (default: every peering of the origin).
    #[arg(long)]
    pub provider_id: Option<ClusterId>,

    /// How to print: text for people, json or yaml for scripts (the same fields either way).
    /// The exit code is 0 only when every peering's link is connected and its virtual node
    /// Ready; 3 when one is not (or there is no peering); 1 when status itself failed.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// `-o`: how a command prints what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

/// `refractctl unpeer`.
#[derive(Debug, Clone, clap::Args)]
pub struct UnpeerArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// The provider of the peering to end.
    #[arg(long)]
    pub provider_id: ClusterId,

    /// Kubeconfig of the provider: with it, the tenant's record is removed there too, and a
    /// forced unpeer also removes the tenant's namespaces on the provider.
    #[arg(long, value_name = "FILE")]
    pub provider_kubeconfig: Option<PathBuf>,

    /// The context of the provider's kubeconfig to use (default: its current context).
    #[arg(long, value_name = "CONTEXT", requires = "provider_kubeconfig")]
    pub provider_context: Option<String>,

    /// The provider is dead or unreachable: do not wait for it. The origin is cleaned up at
    /// once; the provider keeps the tenant's namespaces until its --tenant-expiry, unless
    /// --provider-kubeconfig is given.
    #[arg(long)]
    pub force: bool,

    /// The origin's cluster id. Read from the peering's local agent; needed only to clean the
    /// provider once that agent is gone (after a forced unpeer, with --provider-kubeconfig
    /// when the provider is back).
    #[arg(long)]
    pub origin_id: Option<ClusterId>,

    /// How long a graceful unpeer may take.
    #[arg(long, default_value = "10m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,

    /// With --dry-run, the objects that exist and would be deleted, the origin's first (the
    /// virtual node among them), then the provider's; Secrets without their data.
    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// `refractctl rotate`.
#[derive(Debug, Clone, clap::Args)]
pub struct RotateArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// Kubeconfig of the provider, where the new certificate's request is approved and its
    /// remote agent signs it. Two admins who do not share kubeconfigs rotate as they peered
    /// instead: `join request`, the provider's `kubectl certificate approve` and `tenant
    /// export`, then `join complete`.
    #[arg(long, value_name = "FILE")]
    pub provider_kubeconfig: PathBuf,

    /// The context of the provider's kubeconfig to use (default: its current context).
    #[arg(long, value_name = "CONTEXT")]
    pub provider_context: Option<String>,

    /// The provider of the peering whose client certificate is rotated.
    #[arg(long)]
    pub provider_id: ClusterId,

    /// How long to wait for the remote agent to sign the new certificate.
    #[arg(long, default_value = "2m", value_parser = refract_core::duration::parse)]
    pub timeout: Duration,

    /// With --dry-run, what would be replaced (never a Secret's data); no key is made.
    #[command(flatten)]
    pub dry_run: DryRunArgs,
}

/// `refractctl tap`.
#[derive(Debug, Clone, clap::Args)]
pub struct TapArgs {
    #[command(flatten)]
    pub origin: OriginArgs,

    /// The provider of the peering to watch.
    #[arg(long)]
    pub provider_id: ClusterId,

    /// Stop after this many messages (default: until interrupted).
    #[arg(long)]
    pub count: Option<u64>,

    /// Stop after this long (e.g. 30s; default: until interrupted).
    #[arg(long = "for", value_name = "DURATION", value_parser = refract_core::duration::parse)]
    pub duration: Option<Duration>,
}

/// How the origin's local agent of a peering runs, beyond what the peering decides.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalAgentArgs {
    /// Where offloaded pods reach the origin's API server (HOST:PORT; default: the origin
    /// kubeconfig's server).
    #[arg(long, value_name = "HOST:PORT")]
    pub home_api_server: Option<HostPort>,

    /// A further local agent flag, e.g. `--local-agent-arg=--remote-pod-remap=10.2.0.0/16=10.92.0.0/16`
    /// (repeatable; see `local-agent --help`). One that deploy/ or refractctl already sets is
    /// replaced; others are added as given.
    #[arg(
        long = "local-agent-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    pub local_agent_args: Vec<String>,
}

/// Where the agents' images are.
#[derive(Debug, Clone, clap::Args)]
pub struct ImageArgs {
    /// Where the agents' images are: the clusters pull REGISTRY/local-agent:<version> and
    /// REGISTRY/remote-agent:<version>, as `scripts/images.sh --push REGISTRY` tags them
    /// (e.g. registry.example.com/refract). Required unless both image flags are given.
    #[arg(long, value_name = "REGISTRY", env = "REFRACT_REGISTRY")]
    pub registry: Option<String>,

    /// The local agent's image (default: REGISTRY/local-agent:<version>).
    #[arg(long, value_name = "IMAGE")]
    pub local_agent_image: Option<String>,

    /// The remote agent's image (default: REGISTRY/remote-agent:<version>).
    #[arg(long, value_name = "IMAGE")]
    pub remote_agent_image: Option<String>,
}

/// `--single-host` and the ports it uses.
#[derive(Debug, Clone, clap::Args)]
pub struct SingleHostArgs {
    /// Both clusters run on this machine, without kube-proxy (the demo, the tests): the agents
    /// use host networking and listen on 127.0.0.1 on the ports below, reach their API servers
    /// at their kubeconfigs' addresses, and the origin's API server calls the webhook at
    /// 127.0.0.1.
    #[arg(id = "single_host", long = "single-host")]
    pub enabled: bool,

    /// --single-host: the remote agent's gRPC port.
    #[arg(long, default_value_t = 16443, requires = "single_host")]
    pub grpc_port: u16,

    /// --single-host: the remote agent's admin port (probes, /metrics).
    #[arg(long, default_value_t = 19091, requires = "single_host")]
    pub remote_admin_port: u16,

    /// --single-host: the local agent's webhook port.
    #[arg(long, default_value_t = 19443, requires = "single_host")]
    pub webhook_port: u16,

    /// --single-host: the local agent's admin port (probes, /metrics).
    #[arg(long, default_value_t = 19090, requires = "single_host")]
    pub local_admin_port: u16,

    /// --single-host: the virtual node's kubelet API port.
    #[arg(long, default_value_t = 20250, requires = "single_host")]
    pub kubelet_port: u16,
}

/// `--dry-run=client`: what a command would apply or delete, printed, nothing changed.
#[derive(Debug, Clone, clap::Args)]
pub struct DryRunArgs {
    /// `client`: print the objects this would apply (or, for unpeer, delete) and change
    /// nothing (no cluster is written; the certificate Secrets are left out of what would be
    /// applied, as their contents are made or kept then, and the webhook's caBundle is empty).
    #[arg(long, value_enum, value_name = "client")]
    pub dry_run: Option<DryRun>,

    /// With --dry-run: print the objects as YAML documents or a JSON list (default: one line
    /// per object).
    #[arg(short = 'o', long, value_enum, requires = "dry_run")]
    pub output: Option<ManifestOutput>,
}

/// `--dry-run`'s one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DryRun {
    /// Computed here, without asking the cluster.
    Client,
}

/// How `--dry-run` prints objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ManifestOutput {
    Yaml,
    Json,
}
