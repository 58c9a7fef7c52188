//! `refractctl unpeer`: the local agent's unpeer (graceful or forced), then what `peer` made
//! for this peering, on both sides, until nothing labelled for it is left.

use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use refract_admin::tenant::RemoveTenantArgs;
use refract_admin::unpeer::command::UnpeerArgs as AgentUnpeer;
use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::ClusterId;
use serde_json::{json, Value};

use crate::apply;
use crate::cli::UnpeerArgs;
use crate::dry_run;
use crate::manifests::NAMESPACE;
use crate::peering;
use crate::plan::{self, TENANT_LABEL};
use crate::wait;

/// Runs `unpeer`, printing each step.
pub async fn run(args: UnpeerArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + args.timeout;
    let say = |what: &str| println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let (origin, _) = peering::connect_cluster(
        args.origin.origin_kubeconfig.as_deref(),
        args.origin.origin_context.as_deref(),
        "origin",
    )
    .await?;
    let found = peering::list(&origin, Some(&args.provider_id)).await?;
    let origin_id = match (
        found.first().and_then(|p| p.origin.clone()),
        &args.origin_id,
    ) {
        (Some(deployed), Some(given)) if deployed != *given => {
            anyhow::bail!("--origin-id is {given} but the peering's local agent runs as {deployed}")
        }
        (deployed, given) => deployed.or_else(|| given.clone()),
    };
    if dry_run::asked(&args.dry_run) {
        return print_dry_run(&origin, &args, found.first(), origin_id.as_ref()).await;
    }
    if found.is_empty() {
        say(&format!(
            "no local agent of a peering with {} on this origin; removing what may be left",
            args.provider_id
        ));
    }

    // The agent's own unpeer: drains (graceful) and removes the virtual node.
    refract_admin::unpeer::command::run_with(
        origin.clone(),
        AgentUnpeer {
            remote_cluster_id: args.provider_id.clone(),
            node_name: None,
            kubeconfig: None,
            force: args.force,
            timeout: args.timeout,
        },
    )
    .await?;

    if let Some(kubeconfig) = &args.provider_kubeconfig {
        match &origin_id {
            Some(tenant) => {
                clean_provider(
                    kubeconfig,
                    args.provider_context.as_deref(),
                    tenant,
                    args.force,
                    deadline,
                    &say,
                )
                .await?
            }
            None => say("the origin's cluster id is unknown (no local agent left): nothing removed on the provider; run again with --origin-id"),
        }
    } else if args.force {
        say("the provider was not touched: it removes the tenant's namespaces after its --tenant-expiry, or run `refractctl unpeer --force --provider-kubeconfig ...` when it is back");
    }

    // What was installed on the origin for this peering, by refractctl or `kubectl apply -k`:
    // the names the local agent's Deployment uses, else refractctl's.
    let names = OriginNames::of(found.first(), &args.provider_id);
    for object in names.installed(&args.provider_id) {
        if apply::delete(&origin, &object).await? {
            say(&format!("{} deleted", apply::describe(&object)));
        }
    }
    if peering::list(&origin, None).await?.is_empty() {
        // No agent serves the webhook any more; pods must not wait on it.
        let webhook = webhook_configuration();
        if apply::delete(&origin, &webhook).await? {
            say(&format!(
                "MutatingWebhookConfiguration {} deleted (no peering left)",
                plan::WEBHOOK_NAME
            ));
        }
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(origin.clone(), NAMESPACE.as_str());
    let of_peering = ListParams::default().labels(&names.pods);
    wait::until(
        deadline,
        "the local agent's pods to end",
        || async { Ok(pods.list(&of_peering).await?.items.is_empty().then_some(())) },
        || async { String::new() },
    )
    .await?;
    say("the local agent's pods ended");
    // Their leader election Lease, once no replica is left to renew it.
    let lease = lease_of(&args.provider_id);
    if apply::delete(&origin, &lease).await? {
        say(&format!("{} deleted", apply::describe(&lease)));
    }
    let left = labelled_on_origin(&origin, &args.provider_id).await?;
    if !left.is_empty() {
        anyhow::bail!(
            "still labelled {PEERING_LABEL}={} on the origin: {}",
            args.provider_id,
            left.join(", ")
        );
    }
    say(&format!(
        "unpeered: nothing labelled for the peering with {} is left on the origin",
        args.provider_id
    ));
    Ok(())
}

/// The leader election Lease of the local agents of the peering with `provider`.
fn lease_of(provider: &ClusterId) -> Value {
    let name = refract_core::keys::local_agent_lease(provider.as_str());
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": NAMESPACE}})
}

/// What removes the tenant from the provider besides its namespaces: its record and its
/// certificate request (a new peering of this origin asks afresh).
fn provider_leftovers(tenant: &ClusterId) -> [Value; 2] {
    let request_name = refract_certs::request::request_object_name(tenant);
    [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": plan::tenant_record(tenant), "namespace": NAMESPACE}}),
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": request_name}}),
    ]
}

/// `--dry-run=client`: what exists and would be deleted, read from both clusters (the
/// provider when its kubeconfig is given), nothing changed. The virtual node goes with the
/// local agent's unpeer, after its pods are drained (graceful) or at once (--force).
async fn print_dry_run(
    origin: &kube::Client,
    args: &UnpeerArgs,
    found: Option<&peering::Peering>,
    origin_id: Option<&ClusterId>,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use refract_core::keys::REMOTE_CLUSTER_ID_LABEL;
    let provider_id = &args.provider_id;
    let mut candidates = OriginNames::of(found, provider_id).installed(provider_id);
    candidates.push(lease_of(provider_id));
    let last_peering = peering::list(origin, None)
        .await?
        .iter()
        .all(|p| p.provider == *provider_id);
    if last_peering {
        candidates.push(webhook_configuration());
    }
    let mut on_origin = existing(origin, &candidates).await?;
    let nodes: Api<Node> = Api::all(origin.clone());
    on_origin
        .extend(labelled_named(nodes, &format!("{REMOTE_CLUSTER_ID_LABEL}={provider_id}")).await?);
    dry_run::note(&format!(
        "origin: the peering with {provider_id} ({})",
        if args.force {
            "forced: nothing drained"
        } else {
            "graceful: the virtual node's pods drained first"
        }
    ));
    dry_run::print_deleted(&on_origin, &args.dry_run)?;
    let Some(kubeconfig) = &args.provider_kubeconfig else {
        dry_run::note("provider: not read (no --provider-kubeconfig); its remote agent removes the tenant's namespaces when the unpeer is graceful");
        return Ok(());
    };
    let Some(tenant) = origin_id else {
        dry_run::note(
            "provider: the origin's cluster id is unknown (no local agent left): give --origin-id",
        );
        return Ok(());
    };
    let (provider, _) = peering::connect_cluster(
        Some(kubeconfig),
        args.provider_context.as_deref(),
        "provider",
    )
    .await?;
    let mut on_provider = existing(&provider, &provider_leftovers(tenant)).await?;
    let namespaces: Api<Namespace> = Api::all(provider.clone());
    on_provider.extend(labelled_named(namespaces, &format!("{TENANT_LABEL}={tenant}")).await?);
    dry_run::note(&format!(
        "provider: tenant {tenant} (its namespaces removed by {})",
        if args.force {
            "refractctl"
        } else {
            "the remote agent"
        }
    ));
    dry_run::print_deleted(&on_provider, &args.dry_run)
}

/// The cluster-scoped objects of `api` carrying `selector`, as their identity and labels only.
async fn labelled_named<K>(api: Api<K>, selector: &str) -> anyhow::Result<Vec<Value>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = api
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("failed to list {} labelled {selector}", K::plural(&())))?;
    Ok(listed
        .items
        .iter()
        .map(|o| {
            json!({
                "apiVersion": K::api_version(&()),
                "kind": K::kind(&()),
                "metadata": {"name": o.name_any(), "labels": o.labels()},
            })
        })
        .collect())
}

/// Those of `candidates` that exist, as their identity and labels only (a Secret's data is
/// never printed).
async fn existing(client: &kube::Client, candidates: &[Value]) -> anyhow::Result<Vec<Value>> {
    let mut found = Vec::new();
    for candidate in candidates {
        let candidate = apply::served(client, candidate).await?;
        let api = apply::api_for(client, &candidate).await?;
        let name = candidate["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(live) = api
            .get_opt(name)
            .await
            .with_context(|| format!("failed to read {}", apply::describe(&candidate)))?
        {
            let mut shown = candidate.clone();
            shown["metadata"]["labels"] = json!(live.metadata.labels.unwrap_or_default());
            found.push(shown);
        }
    }
    Ok(found)
}

/// The origin's webhook configuration, shared by its peerings.
fn webhook_configuration() -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration", "metadata": {"name": plan::WEBHOOK_NAME}})
}

/// The names of a peering's objects on the origin.
struct OriginNames {
    deployment: String,
    tls_secret: String,
    kubelet_tls_secret: String,
    pods: String,
}

impl OriginNames {
    /// What was installed on the origin for the peering with `provider` and goes with it.
    fn installed(&self, provider: &ClusterId) -> Vec<Value> {
        let namespaced = |api_version: &str, kind: &str, name: &str| json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": NAMESPACE}});
        vec![
            namespaced("apps/v1", "Deployment", &self.deployment),
            namespaced("policy/v1", "PodDisruptionBudget", &self.deployment),
            namespaced("v1", "Secret", &self.tls_secret),
            namespaced("v1", "Secret", &plan::local_request_secret(provider)),
            namespaced("v1", "Secret", &self.kubelet_tls_secret),
        ]
    }

    /// Those `found`'s Deployment uses (a peering from `kubectl apply -k` has deploy/'s names),
    /// else refractctl's for `provider`.
    fn of(found: Option<&peering::Peering>, provider: &ClusterId) -> Self {
        match found {
            Some(p) => Self {
                deployment: p.name(),
                tls_secret: p.tls_secret(),
                kubelet_tls_secret: p.kubelet_tls_secret(),
                pods: p.pod_selector(),
            },
            None => Self {
                deployment: plan::local_agent_name(provider),
                tls_secret: plan::local_tls_secret(provider),
                kubelet_tls_secret: plan::kubelet_tls_secret(provider),
                pods: format!("{PEERING_LABEL}={provider}"),
            },
        }
    }
}

/// The provider's half: the tenant's namespaces (removed by the remote agent when graceful,
/// here when forced), its record and its certificate request.
async fn clean_provider(
    kubeconfig: &std::path::Path,
    context: Option<&str>,
    tenant: &ClusterId,
    force: bool,
    deadline: Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let (provider, _) = peering::connect_cluster(Some(kubeconfig), context, "provider").await?;
    if force {
        refract_admin::tenant::run(RemoveTenantArgs {
            cluster_id: tenant.clone(),
            kubeconfig: Some(kubeconfig.to_path_buf()),
            dry_run: false,
            agent_namespace: NAMESPACE.to_string(),
        })
        .await?;
    }
    for object in provider_leftovers(tenant) {
        if apply::delete(&provider, &object).await? {
            say(&format!(
                "{} deleted on the provider",
                apply::describe(&object)
            ));
        }
    }
    let namespaces: Api<Namespace> = Api::all(provider.clone());
    let selector = format!("{TENANT_LABEL}={tenant}");
    wait::until(
        deadline,
        &format!("the provider's namespaces of tenant {tenant} to be gone"),
        || async {
            let left = namespaces
                .list(&ListParams::default().labels(&selector))
                .await
                .context("failed to list the provider's namespaces")?;
            Ok(left.items.is_empty().then_some(()))
        },
        || async {
            match namespaces
                .list(&ListParams::default().labels(&selector))
                .await
            {
                Ok(l) => format!(
                    "  still there: {}",
                    l.items
                        .iter()
                        .map(|n| n.name_any())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Err(e) => e.to_string(),
            }
        },
    )
    .await?;
    say(&format!(
        "provider: no namespace of tenant {tenant} is left"
    ));
    Ok(())
}

/// Objects of refract-system, and nodes, still labelled for the peering with `provider`.
async fn labelled_on_origin(
    origin: &kube::Client,
    provider: &ClusterId,
) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Node, Pod, Secret};
    use refract_core::keys::REMOTE_CLUSTER_ID_LABEL;
    let by_peering = ListParams::default().labels(&format!("{PEERING_LABEL}={provider}"));
    let mut left = Vec::new();
    let deployments: Api<Deployment> = Api::namespaced(origin.clone(), NAMESPACE.as_str());
    for d in deployments.list(&by_peering).await?.items {
        left.push(format!("Deployment {}", d.name_any()));
    }
    let secrets: Api<Secret> = Api::namespaced(origin.clone(), NAMESPACE.as_str());
    for s in secrets.list(&by_peering).await?.items {
        left.push(format!("Secret {}", s.name_any()));
    }
    let pods: Api<Pod> = Api::namespaced(origin.clone(), NAMESPACE.as_str());
    for p in pods.list(&by_peering).await?.items {
        left.push(format!("Pod {}", p.name_any()));
    }
    let nodes: Api<Node> = Api::all(origin.clone());
    let by_node = ListParams::default().labels(&format!("{REMOTE_CLUSTER_ID_LABEL}={provider}"));
    for n in nodes.list(&by_node).await?.items {
        left.push(format!("Node {}", n.name_any()));
    }
    Ok(left)
}
