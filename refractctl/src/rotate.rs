//! `refractctl rotate`: a new client certificate for one tenant, in place, no restart.

use std::time::Instant;

use anyhow::Context;
use refract_certs::Validity;
use refract_core::keys::PEERING_LABEL;

use crate::apply;
use crate::cli::RotateArgs;
use crate::manifests::NAMESPACE;
use crate::peer::record_tenant;
use crate::peering;
use crate::pki;
use crate::plan;

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
    let ca_secret = pki::read(&provider, plan::PROVIDER_CA_SECRET)
        .await?
        .with_context(|| format!("the provider has no CA in Secret {NAMESPACE}/{}: was this peering made by `refractctl peer`?", plan::PROVIDER_CA_SECRET))?;
    let ca = refract_certs::Issued {
        cert_pem: ca_secret.cert_pem,
        key_pem: ca_secret.key_pem,
    };
    let leaf = refract_certs::reissue(&ca, &held.cert_pem, Validity::days_from_now(pki::LEAF_DAYS))
        .context("failed to issue the new client certificate")?;
    let name = plan::local_tls_secret(&args.provider_id);
    let labels = [(PEERING_LABEL, args.provider_id.as_str())];
    apply::apply(&origin, &pki::secret(&name, &labels, &leaf, &ca.cert_pem)).await?;
    let after = record_tenant(&provider, &tenant, &leaf.cert_pem).await?;
    say(&format!(
        "tenant {tenant}: client certificate serial {} (until {}) replaced by serial {} (until {}) in Secret {NAMESPACE}/{name}",
        before.serial, before.not_after, after.serial, after.not_after
    ));
    say("the local agent reads it when the kubelet refreshes the Secret's volume (about a minute) and dials with it from then on; the remote agent moves open streams onto it at its --max-connection-age. The old certificate stays valid until it ends; to refuse it now, add `serial:<old serial>` to the provider's --tenant-deny-list");
    Ok(())
}
