//! `refractctl peer`: both clusters' halves of one peering, then waiting until it works.

mod certs;
mod ready;

use std::time::Instant;

use anyhow::{bail, Context};
use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::ClusterId;
use serde_json::Value;

use crate::apply;
use crate::cli::PeerArgs;
use crate::manifests::Agent;
use crate::peering::{self, connect_cluster};
use crate::pki;
use crate::plan::{self, HostPort, HostPorts, Network, Plan};
pub use certs::record_tenant;
use certs::{ensure_client, ensure_serving, ServingLeaf};

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
    let clusters = Clusters::connect(&args, &say).await?;
    refuse_another_origin(&clusters.origin, &args, &say).await?;
    let plan = plan_of(
        &args,
        clusters.origin_api.clone(),
        clusters.provider_api.clone(),
    )?;
    install(&clusters, &plan, &say).await?;
    ready::wait_until_peered(&clusters.origin, &clusters.provider, &plan, deadline, &say).await?;
    say(&format!(
        "peered: origin {} offloads to provider {} through {}. Offload a namespace with a NamespaceOffloading; `refractctl status` shows the peering",
        plan.origin, plan.provider, plan.endpoint
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

/// A peering with this provider may exist already (peering again brings it to what was
/// asked), but not under another origin id: the provider would see a second tenant.
async fn refuse_another_origin(
    origin: &kube::Client,
    args: &PeerArgs,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let existing = peering::list(origin, Some(&args.provider_id)).await?;
    let Some(existing) = existing.first() else {
        return Ok(());
    };
    if let Some(other) = existing.origin.as_ref().filter(|o| **o != args.origin_id) {
        bail!(
            "this origin already peers with {} as {other}; unpeer it first, or peer again with --origin-id {other}",
            args.provider_id,
        );
    }
    say(&format!(
        "a peering with {} exists; bringing it to what was asked",
        args.provider_id
    ));
    Ok(())
}

/// Certificates first (the provider's CA, the remote agent's serving certificate, the
/// tenant's client certificate, the origin's CA and its serving certificates), then both
/// agents, whose pods mount them.
async fn install(clusters: &Clusters, plan: &Plan, say: &impl Fn(&str)) -> anyhow::Result<()> {
    let Clusters {
        origin, provider, ..
    } = clusters;
    say(&format!(
        "provider {}: installing the remote agent",
        plan.provider
    ));
    let mut provider_objects = plan.provider_objects();
    apply_namespace(provider, &mut provider_objects, say).await?;
    leave_a_running_remote_agent(provider, &mut provider_objects, say).await?;
    let ca = pki::ensure_ca(
        provider,
        plan::PROVIDER_CA_SECRET,
        &format!("refract peering CA of {}", plan.provider),
        say,
    )
    .await?;
    let remote_leaf = ServingLeaf {
        secret: plan::REMOTE_TLS_SECRET,
        id: &plan.provider,
        names: plan.server_names(),
        labels: &[],
    };
    ensure_serving(provider, &ca, &remote_leaf, say).await?;

    say(&format!(
        "origin {}: installing the local agent of this peering",
        plan.origin
    ));
    // The webhook's CA is not known yet; only the Namespace of these is applied now.
    apply_namespace(origin, &mut plan.origin_objects(""), say).await?;
    let client_cert = ensure_client(origin, provider, plan, &ca, say).await?;
    say(&format!(
        "tenant {} certificate: serial {}, valid until {}",
        plan.origin, client_cert.serial, client_cert.not_after
    ));
    let origin_ca = pki::ensure_ca(
        origin,
        plan::ORIGIN_CA_SECRET,
        &format!("refract origin CA of {}", plan.origin),
        say,
    )
    .await?;
    let webhook_id = ClusterId::parse(&format!("{}-webhook", plan.origin))
        .context("the origin id is too long")?;
    let webhook_leaf = ServingLeaf {
        secret: plan::WEBHOOK_TLS_SECRET,
        id: &webhook_id,
        names: plan.webhook_names(),
        labels: &[],
    };
    ensure_serving(origin, &origin_ca, &webhook_leaf, say).await?;
    let kubelet_id = ClusterId::parse(&format!("{}-kubelet", plan.origin))
        .context("the origin id is too long")?;
    let kubelet_secret = plan::kubelet_tls_secret(&plan.provider);
    let kubelet_leaf = ServingLeaf {
        secret: &kubelet_secret,
        id: &kubelet_id,
        names: plan.kubelet_names(),
        labels: &[(PEERING_LABEL, plan.provider.as_str())],
    };
    ensure_serving(origin, &origin_ca, &kubelet_leaf, say).await?;

    apply::apply_all(provider, &provider_objects, say).await?;
    let mut origin_objects = plan.origin_objects(&origin_ca.cert_pem);
    origin_objects.retain(|o| o["kind"] != "Namespace");
    apply::apply_all(origin, &origin_objects, say).await
}

/// The remote agent serves every tenant of the provider: adding one must not change its flags
/// or image for the others (an admin may have added `--policy` or `--tenant-deny-list`). Once
/// its Deployment exists, `peer` leaves it as it is; the rest of deploy/remote-agent (RBAC,
/// CRD, Service) is applied as usual.
async fn leave_a_running_remote_agent(
    provider: &kube::Client,
    objects: &mut Vec<Value>,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(provider.clone(), crate::manifests::NAMESPACE);
    let exists = deployments
        .get_opt(plan::REMOTE_NAME)
        .await
        .context("failed to read the remote agent's Deployment")?
        .is_some();
    if exists {
        objects
            .retain(|o| !(o["kind"] == "Deployment" && o["metadata"]["name"] == plan::REMOTE_NAME));
        say(&format!(
            "Deployment {}/{} exists: left as it is (its flags and image serve every tenant)",
            crate::manifests::NAMESPACE,
            plan::REMOTE_NAME
        ));
    }
    Ok(())
}

fn plan_of(args: &PeerArgs, origin_api: HostPort, provider_api: HostPort) -> anyhow::Result<Plan> {
    let network = if args.single_host {
        Network::SingleHost {
            ports: HostPorts {
                grpc: args.grpc_port,
                remote_admin: args.remote_admin_port,
                webhook: args.webhook_port,
                local_admin: args.local_admin_port,
                kubelet: args.kubelet_port,
            },
            origin_api: origin_api.clone(),
            provider_api,
        }
    } else {
        Network::Pods
    };
    let endpoint = match (&args.provider_endpoint, args.single_host) {
        (Some(e), _) => e.clone(),
        (None, true) => HostPort {
            host: "127.0.0.1".into(),
            port: args.grpc_port,
        },
        (None, false) => bail!("--provider-endpoint HOST:PORT is required: where the origin's agent reaches the provider's"),
    };
    Ok(Plan {
        origin: args.origin_id.clone(),
        provider: args.provider_id.clone(),
        endpoint,
        home_api_server: args.home_api_server.clone().unwrap_or(origin_api),
        local_image: image(Agent::Local, &args.local_agent_image, &args.registry)?,
        remote_image: image(Agent::Remote, &args.remote_agent_image, &args.registry)?,
        network,
        local_args: args.local_agent_args.clone(),
    })
}

/// The image `agent` runs: the one named, or the version's in `registry`.
fn image(
    agent: Agent,
    named: &Option<String>,
    registry: &Option<String>,
) -> anyhow::Result<String> {
    match (named, registry) {
        (Some(image), _) => Ok(image.clone()),
        (None, Some(registry)) => Ok(agent.image_in(registry)),
        (None, None) => bail!(
            "no image for the {}: give --registry REGISTRY (where you pushed the images with \
             `scripts/images.sh --push REGISTRY`; README, \"Install on your clusters\") or --{}-image IMAGE",
            agent.component(),
            agent.component()
        ),
    }
}

/// Applies the Namespace of `objects` (so Secrets can go in) and takes it out of the list.
async fn apply_namespace(
    client: &kube::Client,
    objects: &mut Vec<Value>,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let (namespace, rest): (Vec<Value>, Vec<Value>) =
        objects.drain(..).partition(|o| o["kind"] == "Namespace");
    *objects = rest;
    apply::apply_all(client, &namespace, say).await
}
