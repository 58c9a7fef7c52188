//! `refractctl rotate`: a new key and client certificate for one tenant, in place, no
//! restart; the same three steps as a peering by two admins, run in a row.

use std::time::Instant;

use anyhow::Context;

use crate::cli::RotateArgs;
use crate::dry_run;
use crate::manifests::NAMESPACE;
use crate::peering;
use crate::pki;
use crate::plan;
use crate::tenant_cert::{self, Approval};

/// Runs `rotate`, printing each step.
pub async fn run(args: RotateArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let say = |what: &str| println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let (origin, _) = peering::connect_cluster(
        args.origin.origin_kubeconfig.as_deref(),
        args.origin.origin_context.as_deref(),
        "origin",
    )
    .await?;
    let (provider, _) = peering::connect_cluster(
        Some(&args.provider_kubeconfig),
        args.provider_context.as_deref(),
        "provider",
    )
    .await?;
    let peering = peering::get(&origin, &args.provider_id).await?;
    let tenant = peering
        .origin
        .clone()
        .context("the local agent has no --cluster-id; peer again")?;
    let held = peering.credentials(&origin).await?;
    let before = pki::summary(&held.cert_pem)?;
    if dry_run::asked(&args.dry_run) {
        let request = refract_certs::request::request_object_name(&tenant);
        dry_run::note("origin:");
        dry_run::print(
            &[
                dry_run::named(
                    "v1",
                    "Secret",
                    &plan::local_request_secret(&args.provider_id),
                    Some(NAMESPACE.as_str()),
                ),
                dry_run::named(
                    "v1",
                    "Secret",
                    &peering.tls_secret(),
                    Some(NAMESPACE.as_str()),
                ),
            ],
            &args.dry_run,
        )?;
        dry_run::note("provider:");
        dry_run::print(
            &[dry_run::named(
                "certificates.k8s.io/v1",
                "CertificateSigningRequest",
                &request,
                None,
            )],
            &args.dry_run,
        )?;
        dry_run::note(&format!(
            "a real run makes a new key in the origin, asks again with {request} (approved here, signed by the remote agent) and replaces tenant {tenant}'s certificate serial {} (until {})",
            before.serial, before.not_after
        ));
        return Ok(());
    }
    let deadline = started + args.timeout;
    // A new key, made in the origin; the provider's CA key is not read.
    let request = tenant_cert::request(&origin, &args.provider_id, &tenant, true, &say).await?;
    let signed =
        tenant_cert::sign(&provider, &tenant, &request, Approval::Here, deadline, &say).await?;
    let secret = peering.tls_secret();
    let after =
        tenant_cert::complete(&origin, &args.provider_id, &tenant, &signed, &secret, &say).await?;
    say(&format!(
        "tenant {tenant}: client certificate serial {} (until {}) replaced by serial {} (until {}) in Secret {NAMESPACE}/{}",
        before.serial,
        before.not_after,
        after.serial,
        after.not_after,
        secret
    ));
    say("the local agent reads it when the kubelet refreshes the Secret's volume (about a minute) and dials with it from then on; the remote agent moves open streams onto it at its --max-connection-age. The old certificate stays valid until it ends; to refuse it now, add `serial:<old serial>` to the provider's --tenant-deny-list");
    Ok(())
}
