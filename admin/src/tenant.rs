//! Removing a tenant: everything this provider holds for one origin.
//!
//! A tenant's footprint is its namespaces (labelled [`TENANT_NAMESPACE_LABEL`]); the ShadowPods,
//! pods and reflected objects all live inside them, so deleting the namespaces removes it all.
//! Three ways lead here, each logged with what was removed and why:
//! - the origin unpeers gracefully (`refract.v1.Reflection/Unpeer`);
//! - the origin has not connected for the remote agent's `--tenant-expiry`;
//! - an operator runs `remote-agent remove-tenant`.
//!
//! A link that drops never removes anything: only an expiry the operator chose does. Each
//! namespace is marked [`TENANT_REMOVAL_ANNOTATION`] before it is deleted, so a remote agent
//! running meanwhile stops restoring the tenant's objects; an origin
//! still holding a valid certificate would offload again when it connects.

use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use refract_core::keys::{
    tenant_account, ORIGINAL_NAME_ANNOTATION, TENANT_NAMESPACE_LABEL, TENANT_REMOVAL_ANNOTATION,
};
use refract_shared::tls::ClusterId;

/// The namespaces of `tenant`.
pub async fn namespaces_of(
    client: &kube::Client,
    tenant: &ClusterId,
) -> Result<Vec<Namespace>, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let selector = format!("{TENANT_NAMESPACE_LABEL}={}", tenant.as_str());
    Ok(api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// How a removed namespace is shown: `provider-namespace (origin-namespace)`.
pub fn describe(ns: &Namespace) -> String {
    match ns.annotations().get(ORIGINAL_NAME_ANNOTATION) {
        Some(origin) => format!("{} ({origin})", ns.name_any()),
        None => ns.name_any(),
    }
}

/// Deletes every namespace of `tenant` (unless `dry_run`), logging each with `reason`, then
/// the tenant's ServiceAccount in `accounts_namespace` (the remote agent's own); what was (or
/// would be) removed, described by [`describe`]. Namespaces already terminating are listed
/// too: their deletion is under way.
pub async fn remove(
    client: &kube::Client,
    tenant: &ClusterId,
    accounts_namespace: &str,
    reason: &str,
    dry_run: bool,
) -> Result<Vec<String>, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut removed = Vec::new();
    for ns in namespaces_of(client, tenant).await? {
        let shown = describe(&ns);
        if !dry_run && ns.metadata.deletion_timestamp.is_none() {
            // Said first, so a remote agent running meanwhile stops restoring the tenant's
            // objects before their deletion reaches it (see the remote agent's `restore`).
            let mark = serde_json::json!({"metadata": {"annotations": {TENANT_REMOVAL_ANNOTATION: reason}}});
            let name = ns.name_any();
            let removed_now = async {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&mark))
                    .await?;
                api.delete(&name, &DeleteParams::background()).await
            };
            match removed_now.await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => return Err(e),
            }
        }
        tracing::info!(tenant = %tenant, namespace = %shown, reason, dry_run, "removed tenant namespace (its ShadowPods, pods and reflected objects with it)");
        removed.push(shown);
    }
    // Last: its bindings went with the namespaces, and while a namespace is still there the
    // remote agent may write in it as the tenant.
    let account = tenant_account(tenant.as_str());
    if !dry_run {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), accounts_namespace);
        match accounts.delete(&account, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    tracing::info!(tenant = %tenant, namespaces = removed.len(), account = %format!("{accounts_namespace}/{account}"), reason, dry_run, "tenant removed");
    Ok(removed)
}

/// Removes everything this provider holds for one origin (tenant).
///
/// Deletes every namespace labelled as the tenant's (its twin namespaces, with the ShadowPods,
/// pods and reflected objects in them), printing each one, and the tenant's ServiceAccount. Revoke the tenant's certificate
/// first (or stop trusting its CA in --client-ca): an origin that still holds a valid
/// certificate offloads again when it reconnects.
#[derive(Debug, Clone, clap::Parser)]
pub struct RemoveTenantArgs {
    /// The tenant: the origin's cluster id, as in its client certificate.
    #[arg(long)]
    pub cluster_id: ClusterId,

    /// Kubeconfig of the provider cluster; else the in-cluster service account, else
    /// $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// List what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// The remote agent's namespace, where the tenant's ServiceAccount (`tenant-<cluster id>`)
    /// is removed too.
    #[arg(long, default_value = "refract-system")]
    pub agent_namespace: String,
}

/// `remote-agent remove-tenant` (and `refractctl unpeer --force`): deletes the tenant's namespaces and prints each one.
pub async fn run(args: RemoveTenantArgs) -> anyhow::Result<()> {
    let client = refract_shared::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    let removed = remove(
        &client,
        &args.cluster_id,
        &args.agent_namespace,
        "an operator ran remove-tenant",
        args.dry_run,
    )
    .await
    .context("failed to remove the tenant's namespaces")?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    if removed.is_empty() {
        println!(
            "tenant {}: no namespaces; nothing to remove",
            args.cluster_id
        );
    }
    for ns in &removed {
        println!("{verb} namespace {ns}");
    }
    Ok(())
}
