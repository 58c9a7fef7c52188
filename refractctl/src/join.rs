//! The origin admin's steps of a peering made by two admins: `join request` (a key that stays
//! in the origin, and a request for the provider's admin) and `join complete` (the bundle the
//! provider's admin handed back, checked, and this peering's local agent).

use std::time::Instant;

use anyhow::{bail, Context};
use refract_certs::output::write_atomic;

use crate::cli::{JoinCompleteArgs, JoinRequestArgs};
use crate::dry_run;
use crate::install;
use crate::manifests::NAMESPACE;
use crate::peering::{self, connect_cluster};
use crate::plan;
use crate::ready;
use crate::tenant_cert::{self, Bundle};

/// `refractctl join request`: progress on standard error, the request on standard output or
/// in `--out`, then the provider admin's commands.
pub async fn request(args: JoinRequestArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let say = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    if args.origin_id == args.provider_id {
        bail!(
            "--origin-id and --provider-id are both {}; a cluster does not peer with itself",
            args.origin_id
        );
    }
    let (origin, _) = connect_cluster(
        args.origin.origin_kubeconfig.as_deref(),
        args.origin.origin_context.as_deref(),
        "origin",
    )
    .await?;
    peering::refuse_another_origin(&origin, &args.provider_id, &args.origin_id, &say).await?;
    if dry_run::asked(&args.dry_run) {
        return print_request_dry_run(&origin, &args).await;
    }
    install::origin_namespace_if_missing(&origin, &say).await?;
    let request =
        tenant_cert::request(&origin, &args.provider_id, &args.origin_id, false, &say).await?;
    let manifest = refract_certs::output::csr_manifest(&args.origin_id, &request);
    let (file, apply) = match &args.out {
        Some(path) => {
            write_atomic(path, manifest.as_bytes(), 0o644)
                .with_context(|| format!("failed to write {}", path.display()))?;
            say(&format!(
                "CertificateSigningRequest written to {} (a request only: no key)",
                path.display()
            ));
            let file = path.display().to_string();
            (file.clone(), format!("kubectl apply -f {file}"))
        }
        None => {
            print!("{manifest}");
            (
                "the request printed above".to_string(),
                "kubectl apply -f FILE".to_string(),
            )
        }
    };
    let origin_id = &args.origin_id;
    say(&format!(
        "next, the provider's admin, with {file}:\n  {apply}\n  kubectl certificate approve refract-tenant-{origin_id}\n  refractctl{ns} tenant export --origin-id {origin_id} --provider-id {} --provider-endpoint HOST:PORT --out {origin_id}.bundle.yaml\nthen you, with that bundle:\n  refractctl{ns} join complete --bundle {origin_id}.bundle.yaml --registry REGISTRY",
        args.provider_id,
        ns = NAMESPACE.flag()
    ));
    Ok(())
}

/// `join request --dry-run=client`: the namespace (if missing) and the Secret that would keep
/// the key; the key and the request are not made.
async fn print_request_dry_run(
    origin: &kube::Client,
    args: &JoinRequestArgs,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let mut objects = Vec::new();
    let namespaces: kube::Api<Namespace> = kube::Api::all(origin.clone());
    if namespaces
        .get_opt(NAMESPACE.as_str())
        .await
        .with_context(|| format!("failed to read namespace {NAMESPACE}"))?
        .is_none()
    {
        objects.push(dry_run::named("v1", "Namespace", NAMESPACE.as_str(), None));
    }
    let secret = plan::local_request_secret(&args.provider_id);
    objects.push(dry_run::named(
        "v1",
        "Secret",
        &secret,
        Some(NAMESPACE.as_str()),
    ));
    dry_run::print(&objects, &args.dry_run)?;
    dry_run::note(&format!(
        "a real run keeps a pending request of {} in that Secret or makes a new key there, then writes CertificateSigningRequest {} to {}",
        args.origin_id,
        refract_certs::request::request_object_name(&args.origin_id),
        args.out
            .as_ref()
            .map_or("standard output".to_string(), |p| p.display().to_string())
    ));
    Ok(())
}

/// `refractctl join complete`: the bundle checked against the key kept in the origin, the
/// origin's half of the peering, then waiting until it works.
pub async fn complete(args: JoinCompleteArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + args.timeout;
    let say = |what: &str| println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let text = std::fs::read_to_string(&args.bundle)
        .with_context(|| format!("failed to read {}", args.bundle.display()))?;
    let bundle = Bundle::parse(&text).with_context(|| format!("{}", args.bundle.display()))?;
    let (origin, origin_api) = connect_cluster(
        args.origin.origin_kubeconfig.as_deref(),
        args.origin.origin_context.as_deref(),
        "origin",
    )
    .await?;
    let plan = install::origin_plan(
        bundle.origin.clone(),
        bundle.provider.clone(),
        bundle.endpoint.clone(),
        origin_api,
        (&args.local_agent, &args.images, &args.single_host),
    )?;
    if dry_run::asked(&args.dry_run) {
        return dry_run::print(&plan.objects(""), &args.dry_run);
    }
    peering::refuse_another_origin(&origin, &plan.provider, &plan.origin, &say).await?;
    say(&format!(
        "origin {}: completing the peering with provider {} at {}",
        plan.origin, plan.provider, plan.endpoint
    ));
    install::origin_namespace(&origin, &plan, &say).await?;
    tenant_cert::complete(
        &origin,
        &plan.provider,
        &plan.origin,
        &bundle.signed,
        &plan::local_tls_secret(&plan.provider),
        &say,
    )
    .await?;
    install::origin_half(&origin, &plan, &say).await?;
    ready::origin_side_ready(&origin, &plan, deadline, &say).await?;
    say(&format!(
        "peered: origin {} offloads to provider {} through {}. Offload a namespace with a NamespaceOffloading; `refractctl status` shows the peering",
        plan.origin, plan.provider, plan.endpoint
    ));
    Ok(())
}
