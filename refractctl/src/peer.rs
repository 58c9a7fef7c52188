//! `refractctl peer`: both clusters' halves of one peering, then waiting until it works.

use std::time::Instant;

use anyhow::{bail, Context};

use crate::cli::PeerArgs;
use crate::dry_run;
use crate::install::{self, endpoint_of, image, network_of, RunningRemoteAgent};
use crate::manifests::Agent;
use crate::peering::{self, connect_cluster};
use crate::plan::{HostPort, OriginPlan, ProviderPlan};
use crate::ready;

/// Runs `peer`, printing each step.
pub async fn run(args: PeerArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + args.timeout;
    let say = |what: &str| println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    if args.origin_id == args.provider_id {
        bail!(
            "--origin-id and --provider-id are both {}; a cluster does not peer with itself",
            args.origin_id
        );
    }
    let dry_run = dry_run::asked(&args.dry_run);
    let say_first = |what: &str| {
        if dry_run {
            dry_run::note(what)
        } else {
            say(what)
        }
    };
    let clusters = Clusters::connect(&args, &say_first).await?;
    peering::refuse_another_origin(
        &clusters.origin,
        &args.provider_id,
        &args.origin_id,
        &say_first,
    )
    .await?;
    let (plan, provider_plan) = plan_of(
        &args,
        clusters.origin_api.clone(),
        clusters.provider_api.clone(),
    )?;
    if dry_run {
        return print_dry_run(&clusters, &plan, &provider_plan, &args).await;
    }
    install(&clusters, &plan, &provider_plan, deadline, &say).await?;
    ready::origin_side_ready(&clusters.origin, &plan, deadline, &say).await?;
    say(&format!(
        "peered: origin {} offloads to provider {} through {}. Offload a namespace with a NamespaceOffloading; `refractctl status` shows the peering",
        plan.origin, plan.provider, plan.endpoint
    ));
    Ok(())
}

/// `--dry-run=client`: each cluster's objects, the provider's first, as `peer` would apply
/// them (a running remote agent left out, as `peer` leaves it); the certificate steps are
/// named, not run.
async fn print_dry_run(
    clusters: &Clusters,
    plan: &OriginPlan,
    provider_plan: &ProviderPlan,
    args: &PeerArgs,
) -> anyhow::Result<()> {
    let provider_objects = install::provider_objects(
        &clusters.provider,
        provider_plan,
        RunningRemoteAgent::LeaveAsItIs,
        &dry_run::note,
    )
    .await?;
    dry_run::note(&format!("provider {}:", plan.provider));
    dry_run::print(&provider_objects, &args.dry_run)?;
    dry_run::note(&format!("origin {}:", plan.origin));
    dry_run::print(&plan.objects(""), &args.dry_run)?;
    dry_run::note(&format!(
        "and the certificates: the peering CA and the remote agent's serving certificate in the provider (made once), the tenant's key in the origin and CertificateSigningRequest refract-tenant-{} approved in the provider",
        plan.origin
    ));
    Ok(())
}

/// The two clusters, reached with the operator's kubeconfigs.
struct Clusters {
    origin: kube::Client,
    origin_api: HostPort,
    provider: kube::Client,
    provider_api: HostPort,
}

impl Clusters {
    /// Connects to both and says which Kubernetes each runs.
    async fn connect(args: &PeerArgs, say: &impl Fn(&str)) -> anyhow::Result<Self> {
        let (origin, origin_api) = connect_cluster(
            args.origin.origin_kubeconfig.as_deref(),
            args.origin.origin_context.as_deref(),
            "origin",
        )
        .await?;
        let (provider, provider_api) = connect_cluster(
            Some(&args.provider_kubeconfig),
            args.provider_context.as_deref(),
            "provider",
        )
        .await?;
        for (client, which, api) in [
            (&origin, "origin", &origin_api),
            (&provider, "provider", &provider_api),
        ] {
            let version = client
                .apiserver_version()
                .await
                .with_context(|| format!("the {which} API server at {api} does not answer"))?;
            say(&format!(
                "{which} cluster: API server {api}, Kubernetes {}",
                version.git_version
            ));
        }
        Ok(Self {
            origin,
            origin_api,
            provider,
            provider_api,
        })
    }
}

/// The provider's half, then the origin's: the tenant's certificate is asked for the way two
/// admins would ask for it, so the remote agent must be running before the origin's half.
async fn install(
    clusters: &Clusters,
    plan: &OriginPlan,
    provider_plan: &ProviderPlan,
    deadline: Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let Clusters {
        origin, provider, ..
    } = clusters;
    let ca_cert_pem = install::provider_half(
        provider,
        provider_plan,
        RunningRemoteAgent::LeaveAsItIs,
        say,
    )
    .await?;
    ready::remote_agent_available(provider, deadline, say).await?;
    say(&format!(
        "origin {}: installing the local agent of this peering",
        plan.origin
    ));
    install::origin_namespace(origin, plan, say).await?;
    install::ensure_client(origin, provider, plan, &ca_cert_pem, deadline, say).await?;
    install::origin_half(origin, plan, say).await
}

fn plan_of(
    args: &PeerArgs,
    origin_api: HostPort,
    provider_api: HostPort,
) -> anyhow::Result<(OriginPlan, ProviderPlan)> {
    let endpoint = endpoint_of(&args.provider_endpoint, &args.single_host)?;
    let provider = ProviderPlan {
        provider: args.provider_id.clone(),
        endpoint: endpoint.clone(),
        image: image(Agent::Remote, &args.images)?,
        network: network_of(&args.single_host, provider_api),
        // The remote agent's own flags are `install provider`'s; peer never changes them.
        remote_args: Vec::new(),
    };
    let origin = install::origin_plan(
        args.origin_id.clone(),
        args.provider_id.clone(),
        endpoint,
        origin_api,
        (&args.local_agent, &args.images, &args.single_host),
    )?;
    Ok((origin, provider))
}
