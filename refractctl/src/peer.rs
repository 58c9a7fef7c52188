//! `refractctl peer`: both clusters' halves of one peering, then waiting until it works.

use std::time::Instant;

use anyhow::{bail, Context};
use refract_certs::{Issued, Role};
use refract_shared::proto::ListTenantsRequest;
use refract_shared::tls::ClusterId;
use serde_json::Value;

use crate::apply;
use crate::cli::PeerArgs;
use crate::display;
use crate::manifests::{Agent, NAMESPACE};
use crate::peering::{self, connect_cluster};
use crate::pki::{self, TlsSecret};
use crate::plan::{self, HostPort, HostPorts, Network, Plan, PEERING_LABEL, TENANT_LABEL};
use crate::wait;

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
    let (origin, origin_api) =
        connect_cluster(args.origin.origin_kubeconfig.as_deref(), "origin").await?;
    let (provider, provider_api) =
        connect_cluster(Some(&args.provider_kubeconfig), "provider").await?;
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
    if let Some(existing) = peering::list(&origin, Some(&args.provider_id))
        .await?
        .first()
    {
        if existing
            .origin
            .as_ref()
            .is_some_and(|o| *o != args.origin_id)
        {
            bail!(
                "this origin already peers with {} as {}; unpeer it first, or peer again with --origin-id {}",
                args.provider_id,
                existing.origin.as_ref().unwrap(),
                existing.origin.as_ref().unwrap()
            );
        }
        say(&format!(
            "a peering with {} exists; bringing it to what was asked",
            args.provider_id
        ));
    }
    let plan = plan_of(&args, origin_api, provider_api)?;

    say(&format!(
        "provider {}: installing the remote agent",
        plan.provider
    ));
    let mut provider_objects = plan.provider_objects();
    apply_namespace(&provider, &mut provider_objects, &say).await?;
    let ca = pki::ensure_ca(
        &provider,
        plan::PROVIDER_CA_SECRET,
        &format!("refract peering CA of {}", plan.provider),
        &say,
    )
    .await?;
    ensure_serving(
        &provider,
        &ca,
        &ServingLeaf {
            secret: plan::REMOTE_TLS_SECRET,
            id: &plan.provider,
            names: plan.server_names(),
            labels: &[],
        },
        &say,
    )
    .await?;

    say(&format!(
        "origin {}: installing the local agent of this peering",
        plan.origin
    ));
    // The webhook's CA is not known yet; only the Namespace of these is applied now.
    apply_namespace(&origin, &mut plan.origin_objects(""), &say).await?;
    let client_cert = ensure_client(&origin, &provider, &plan, &ca, &say).await?;
    say(&format!(
        "tenant {} certificate: serial {}, valid until {}",
        plan.origin, client_cert.serial, client_cert.not_after
    ));
    let origin_ca = pki::ensure_ca(
        &origin,
        plan::ORIGIN_CA_SECRET,
        &format!("refract origin CA of {}", plan.origin),
        &say,
    )
    .await?;
    let webhook_id = ClusterId::parse(&format!("{}-webhook", plan.origin))
        .context("the origin id is too long")?;
    ensure_serving(
        &origin,
        &origin_ca,
        &ServingLeaf {
            secret: plan::WEBHOOK_TLS_SECRET,
            id: &webhook_id,
            names: plan.webhook_names(),
            labels: &[],
        },
        &say,
    )
    .await?;
    let kubelet_id = ClusterId::parse(&format!("{}-kubelet", plan.origin))
        .context("the origin id is too long")?;
    let peering_label = [(PEERING_LABEL, plan.provider.as_str())];
    ensure_serving(
        &origin,
        &origin_ca,
        &ServingLeaf {
            secret: &plan::kubelet_tls_secret(&plan.provider),
            id: &kubelet_id,
            names: plan.kubelet_names(),
            labels: &peering_label,
        },
        &say,
    )
    .await?;

    apply::apply_all(&provider, &provider_objects, &say).await?;
    let mut origin_objects = plan.origin_objects(&origin_ca.cert_pem);
    origin_objects.retain(|o| o["kind"] != "Namespace");
    apply::apply_all(&origin, &origin_objects, &say).await?;

    let remote_selector = "app.kubernetes.io/name=refract-remote-agent";
    wait::until(
        deadline,
        "the remote agent to become available",
        || wait::deployment_available(&provider, plan::REMOTE_NAME),
        || async { wait::pods_state(&provider, remote_selector).await },
    )
    .await?;
    say("remote agent available");
    let local_name = plan::local_agent_name(&plan.provider);
    let local_selector = format!("{PEERING_LABEL}={}", plan.provider);
    wait::until(
        deadline,
        "the local agent to become available",
        || wait::deployment_available(&origin, &local_name),
        || async { wait::pods_state(&origin, &local_selector).await },
    )
    .await?;
    say("local agent available");
    let made = peering::get(&origin, &plan.provider).await?;
    let tenant = wait::until(
        deadline,
        "the provider to show the tenant connected",
        || async {
            let mut inspect = made.inspect(&origin, peering::Calls::Bounded).await?;
            let tenants = inspect
                .list_tenants(ListTenantsRequest {})
                .await?
                .into_inner();
            Ok(tenants
                .tenants
                .into_iter()
                .find(|t| t.cluster_id == plan.origin.as_str() && t.connected))
        },
        || async { wait::pods_state(&origin, &local_selector).await },
    )
    .await?;
    say(&format!(
        "tenant {} connected to provider {} since {} (agent {})",
        plan.origin,
        plan.provider,
        display::printable(&tenant.connected_since),
        display::printable(&tenant.agent_version)
    ));
    let node = plan::virtual_node(&plan.provider);
    wait::until(
        deadline,
        &format!("virtual node {node} to become Ready"),
        || async {
            Ok(wait::node_ready(&origin, &node)
                .await?
                .filter(|(status, ..)| status == "True"))
        },
        || async {
            match wait::node_ready(&origin, &node).await {
                Ok(Some((s, r, m))) => format!("  node {node}: Ready={s} {r} {m}"),
                Ok(None) => format!(
                    "  node {node} does not exist yet\n{}",
                    wait::pods_state(&origin, &local_selector).await
                ),
                Err(e) => format!("  could not read node {node}: {e}"),
            }
        },
    )
    .await?;
    say(&format!("virtual node {node} Ready"));
    say(&format!(
        "peered: origin {} offloads to provider {} through {}. Offload a namespace with a NamespaceOffloading; `refractctl status` shows the peering",
        plan.origin, plan.provider, plan.endpoint
    ));
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
        local_image: args
            .local_agent_image
            .clone()
            .unwrap_or_else(|| Agent::Local.default_image()),
        remote_image: args
            .remote_agent_image
            .clone()
            .unwrap_or_else(|| Agent::Remote.default_image()),
        network,
        local_args: args.local_agent_args.clone(),
    })
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

/// A serving certificate `peer` keeps in a Secret.
struct ServingLeaf<'a> {
    /// The Secret in refract-system.
    secret: &'a str,
    /// The identity it carries.
    id: &'a ClusterId,
    /// Its DNS names and IP addresses.
    names: Vec<String>,
    /// Labels of the Secret.
    labels: &'a [(&'a str, &'a str)],
}

/// Keeps the certificate in `leaf.secret` if it still fits, else issues one from `ca`.
async fn ensure_serving(
    client: &kube::Client,
    ca: &Issued,
    leaf: &ServingLeaf<'_>,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let name = leaf.secret;
    let why = match pki::read(client, name).await? {
        Some(existing) => match pki::reissue_reason(&existing, ca, leaf.id, &leaf.names)? {
            None => {
                say(&format!("certificate in Secret {NAMESPACE}/{name} kept"));
                return Ok(());
            }
            Some(reason) => reason,
        },
        None => "it does not exist".into(),
    };
    let issued = pki::issue(ca, leaf.id, Role::Server, &leaf.names)?;
    apply::apply(
        client,
        &pki::secret(name, leaf.labels, &issued, &ca.cert_pem),
    )
    .await?;
    say(&format!(
        "certificate in Secret {NAMESPACE}/{name} issued for {:?} ({why})",
        leaf.names
    ));
    Ok(())
}

/// The tenant's client certificate: kept in the origin when it still fits, else issued by the
/// provider's CA; recorded on the provider either way.
async fn ensure_client(
    origin: &kube::Client,
    provider: &kube::Client,
    plan: &Plan,
    ca: &Issued,
    say: &impl Fn(&str),
) -> anyhow::Result<refract_shared::tls::identity::CertSummary> {
    let name = plan::local_tls_secret(&plan.provider);
    let kept = match pki::read(origin, &name).await? {
        Some(existing) => match pki::reissue_reason(&existing, ca, &plan.origin, &[])? {
            None => Some(existing),
            Some(reason) => {
                say(&format!(
                    "client certificate in Secret {NAMESPACE}/{name} replaced: {reason}"
                ));
                None
            }
        },
        None => None,
    };
    let held = match kept {
        Some(existing) => {
            say(&format!(
                "client certificate in Secret {NAMESPACE}/{name} kept"
            ));
            existing
        }
        None => {
            let leaf = pki::issue(ca, &plan.origin, Role::Client, &[])?;
            let labels = [(PEERING_LABEL, plan.provider.as_str())];
            apply::apply(origin, &pki::secret(&name, &labels, &leaf, &ca.cert_pem)).await?;
            say(&format!("client certificate for tenant {} issued into Secret {NAMESPACE}/{name} (the provider's CA key stays on the provider)", plan.origin));
            TlsSecret {
                cert_pem: leaf.cert_pem,
                key_pem: leaf.key_pem,
                ca_pem: ca.cert_pem.clone(),
            }
        }
    };
    record_tenant(provider, &plan.origin, &held.cert_pem).await
}

/// The provider's record of the certificate a tenant holds (public part only).
pub async fn record_tenant(
    provider: &kube::Client,
    origin: &ClusterId,
    cert_pem: &str,
) -> anyhow::Result<refract_shared::tls::identity::CertSummary> {
    let summary = pki::summary(cert_pem)?;
    let record = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": plan::tenant_record(origin),
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "refract", TENANT_LABEL: origin.as_str()},
        },
        "data": {
            "cluster-id": origin.as_str(),
            "serial": summary.serial,
            "not-after": summary.not_after.to_string(),
            "tls.crt": cert_pem,
        },
    });
    apply::apply(provider, &record).await?;
    Ok(summary)
}
