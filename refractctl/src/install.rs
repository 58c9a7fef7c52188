//! The two halves of a peering as each cluster's admin applies them: the provider's (`install
//! provider`, once per provider) and the origin's (`join complete`, once per peering); `peer`
//! applies both.

mod certs;

use std::time::Instant;

use anyhow::{bail, Context};
use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::ClusterId;
use serde_json::Value;

use crate::apply;
use crate::cli::{ImageArgs, InstallProviderArgs, LocalAgentArgs, SingleHostArgs};
use crate::dry_run;
use crate::manifests::{Agent, NAMESPACE};
use crate::peering::connect_cluster;
use crate::pki;
use crate::plan::{self, HostPort, HostPorts, Network, OriginPlan, ProviderPlan};
use crate::ready;
pub use certs::{ensure_client, record_tenant};
use certs::{ensure_serving, ServingLeaf};

/// `refractctl install provider`: the provider's half with the provider's kubeconfig only,
/// then waiting until the remote agent is available; ends with the provider admin's next step.
pub async fn run_provider(args: InstallProviderArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let say = |what: &str| println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let (provider, api) = connect_cluster(
        args.provider.provider_kubeconfig.as_deref(),
        args.provider.provider_context.as_deref(),
        "provider",
    )
    .await?;
    let plan = ProviderPlan {
        provider: args.provider_id.clone(),
        endpoint: endpoint_of(&args.provider_endpoint, &args.single_host)?,
        image: image(Agent::Remote, &args.images)?,
        network: network_of(&args.single_host, api),
        remote_args: args.remote_agent_args.clone(),
    };
    if dry_run::asked(&args.dry_run) {
        let objects = provider_objects(
            &provider,
            &plan,
            RunningRemoteAgent::KeepHandAddedFlags,
            &dry_run::note,
        )
        .await?;
        return dry_run::print(&objects, &args.dry_run);
    }
    provider_half(
        &provider,
        &plan,
        RunningRemoteAgent::KeepHandAddedFlags,
        &say,
    )
    .await?;
    ready::remote_agent_available(&provider, started + args.timeout, &say).await?;
    say(&format!(
        "provider {} is ready for tenants at {}. For each origin: apply the CertificateSigningRequest its admin wrote with `refractctl join request`, `kubectl certificate approve refract-tenant-<origin id>`, then `refractctl{ns} tenant export --origin-id <origin id> --provider-id {} --provider-endpoint {} --out <origin id>.bundle.yaml` and hand that file back",
        plan.provider,
        plan.endpoint,
        plan.provider,
        plan.endpoint,
        ns = NAMESPACE.flag()
    ));
    Ok(())
}

/// The provider's half of a peering: its CA (made once, kept in the provider), the remote
/// agent's serving certificate and deploy/remote-agent, leaving a running remote agent as it
/// is. Returns the CA certificate.
pub async fn provider_half(
    provider: &kube::Client,
    plan: &ProviderPlan,
    running: RunningRemoteAgent,
    say: &impl Fn(&str),
) -> anyhow::Result<String> {
    say(&format!(
        "provider {}: installing the remote agent",
        plan.provider
    ));
    let mut provider_objects = provider_objects(provider, plan, running, say).await?;
    apply_namespace(provider, &mut provider_objects, say).await?;
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
    apply::apply_all(provider, &provider_objects, say).await?;
    Ok(ca.cert_pem)
}

/// deploy/remote-agent as `plan` renders it, with a remote agent already running there treated
/// as `running` says; refuses to give that agent another identity. Reads, writes nothing: the
/// dry runs print what this returns.
pub async fn provider_objects(
    provider: &kube::Client,
    plan: &ProviderPlan,
    running: RunningRemoteAgent,
    say: &impl Fn(&str),
) -> anyhow::Result<Vec<Value>> {
    let mut provider_objects = plan.objects();
    if let Some(args) = running_remote_agent_args(provider).await? {
        // Every tenant's local agent checks the remote agent's identity: changing it (and its
        // serving certificate) would cut them all off.
        if let Some(serving) = plan.other_identity_running(&args) {
            bail!(
                "the remote agent here serves as provider {serving}, not {}: run this with --provider-id {serving} (a provider has one identity for all its tenants)",
                plan.provider
            );
        }
        match running {
            RunningRemoteAgent::LeaveAsItIs => {
                provider_objects.retain(|o| {
                    !(o["kind"] == "Deployment" && o["metadata"]["name"] == plan::REMOTE_NAME)
                });
                say(&format!(
                    "Deployment {NAMESPACE}/{} exists: left as it is (its flags and image serve every tenant; `refractctl install provider` changes them)",
                    plan::REMOTE_NAME
                ));
            }
            RunningRemoteAgent::KeepHandAddedFlags => {
                let kept = ProviderPlan::keep_hand_added_flags(&mut provider_objects, &args);
                if !kept.is_empty() {
                    say(&format!(
                        "Deployment {NAMESPACE}/{}: flags added by hand kept: {}",
                        plan::REMOTE_NAME,
                        kept.join(" ")
                    ));
                }
            }
        }
    }
    Ok(provider_objects)
}

/// The origin's refract-system namespace, where the tenant's key and certificate go before
/// the local agent that mounts them.
pub async fn origin_namespace(
    origin: &kube::Client,
    plan: &OriginPlan,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    // The webhook's CA is not known yet; only the Namespace of these is applied now.
    apply_namespace(origin, &mut plan.objects(""), say).await
}

/// refract-system in the origin as deploy/ makes it, when it does not exist yet: `join
/// request` keeps the tenant's key there before anything else of the peering is installed. An
/// existing one is left as it is (a single-host peering relaxed its Pod Security level).
pub async fn origin_namespace_if_missing(
    origin: &kube::Client,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(origin.clone());
    if namespaces
        .get_opt(NAMESPACE.as_str())
        .await
        .with_context(|| format!("failed to read namespace {NAMESPACE}"))?
        .is_some()
    {
        return Ok(());
    }
    let mut objects = crate::manifests::render(Agent::Local, "");
    apply_namespace(origin, &mut objects, say).await
}

/// The origin's half once the tenant's certificate is in place: the origin's CA (made once,
/// kept in the origin), the webhook's and the virtual kubelet's serving certificates, and
/// deploy/local-agent for this peering.
pub async fn origin_half(
    origin: &kube::Client,
    plan: &OriginPlan,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
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
    let mut origin_objects = plan.objects(&origin_ca.cert_pem);
    origin_objects.retain(|o| o["kind"] != "Namespace");
    apply::apply_all(origin, &origin_objects, say).await
}

/// What the provider's half does to a remote agent that runs already. It serves every tenant:
/// adding one (`peer`) must not change its flags or image for the others; `install provider`,
/// the provider admin's command, owns its image and the flags it sets, and keeps the flags an
/// admin added by hand (`--policy`, `--tenant-deny-list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunningRemoteAgent {
    /// `peer`: its Deployment is not applied (RBAC, CRD and Service are, as usual).
    LeaveAsItIs,
    /// `install provider`: applied, with the running agent's other flags kept.
    KeepHandAddedFlags,
}

/// The running remote agent's flags, if its Deployment exists.
pub async fn running_remote_agent_args(
    provider: &kube::Client,
) -> anyhow::Result<Option<Vec<String>>> {
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(provider.clone(), NAMESPACE.as_str());
    let Some(deployment) = deployments
        .get_opt(plan::REMOTE_NAME)
        .await
        .context("failed to read the remote agent's Deployment")?
    else {
        return Ok(None);
    };
    Ok(Some(
        deployment
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.args)
            .unwrap_or_default(),
    ))
}

/// The origin's half of the peering of `origin` with `provider` at `endpoint`, from the
/// flags `peer` and `join complete` share; `origin_api` is the origin's API server as its
/// kubeconfig names it.
pub fn origin_plan(
    origin: ClusterId,
    provider: ClusterId,
    endpoint: HostPort,
    origin_api: HostPort,
    flags: (&LocalAgentArgs, &ImageArgs, &SingleHostArgs),
) -> anyhow::Result<OriginPlan> {
    let (local_agent, images, single_host) = flags;
    Ok(OriginPlan {
        origin,
        provider,
        endpoint,
        home_api_server: local_agent
            .home_api_server
            .clone()
            .unwrap_or(origin_api.clone()),
        image: image(Agent::Local, images)?,
        network: network_of(single_host, origin_api),
        local_args: local_agent.local_agent_args.clone(),
    })
}

/// The network of one cluster's half, whose API server the kubeconfig names `api`.
pub fn network_of(single_host: &SingleHostArgs, api: HostPort) -> Network {
    if !single_host.enabled {
        return Network::Pods;
    }
    Network::SingleHost {
        ports: HostPorts {
            grpc: single_host.grpc_port,
            remote_admin: single_host.remote_admin_port,
            webhook: single_host.webhook_port,
            local_admin: single_host.local_admin_port,
            kubelet: single_host.kubelet_port,
        },
        api,
    }
}

/// Where the origin reaches the remote agent: as given, or 127.0.0.1 on a single host.
pub fn endpoint_of(
    given: &Option<HostPort>,
    single_host: &SingleHostArgs,
) -> anyhow::Result<HostPort> {
    match (given, single_host.enabled) {
        (Some(e), _) => Ok(e.clone()),
        (None, true) => Ok(HostPort {
            host: "127.0.0.1".into(),
            port: single_host.grpc_port,
        }),
        (None, false) => bail!("--provider-endpoint HOST:PORT is required: where the origin's agent reaches the provider's"),
    }
}

/// The image `agent` runs: the one named, or the version's in `registry`.
pub fn image(agent: Agent, images: &ImageArgs) -> anyhow::Result<String> {
    let named = match agent {
        Agent::Local => &images.local_agent_image,
        Agent::Remote => &images.remote_agent_image,
    };
    match (named, &images.registry) {
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
