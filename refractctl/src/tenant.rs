//! The provider admin's step of a peering made by two admins: `tenant export`, once the
//! origin's request is applied and approved.

use std::time::Instant;

use anyhow::{bail, Context};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::Api;
use refract_certs::output::write_atomic;
use refract_certs::request as csr;

use refract_shared::tls::ClusterId;

use crate::cli::TenantExportArgs;
use crate::dry_run;
use crate::install;
use crate::manifests::NAMESPACE;
use crate::peering::connect_cluster;
use crate::plan;
use crate::tenant_cert::{self, Approval, Bundle};

/// `refractctl tenant export`: waits for the remote agent to sign the approved request, and
/// writes the bundle for the origin's admin (progress on standard error).
pub async fn export(args: TenantExportArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let say = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let (provider, _) = connect_cluster(
        args.provider.provider_kubeconfig.as_deref(),
        args.provider.provider_context.as_deref(),
        "provider",
    )
    .await?;
    remote_agent_is(&provider, &args.provider_id).await?;
    let name = csr::request_object_name(&args.origin_id);
    let csrs: Api<CertificateSigningRequest> = Api::all(provider.clone());
    let Some(request) = csrs
        .get_opt(&name)
        .await
        .with_context(|| format!("failed to read CertificateSigningRequest {name}"))?
    else {
        bail!(
            "the provider has no CertificateSigningRequest {name}: apply the one the origin's admin wrote with `refractctl join request` (kubectl apply -f FILE), approve it (kubectl certificate approve {name}), then run this again"
        );
    };
    if request.spec.signer_name != csr::TENANT_SIGNER {
        bail!(
            "CertificateSigningRequest {name} is for signer {}, not {}",
            request.spec.signer_name,
            csr::TENANT_SIGNER
        );
    }
    let request_pem = String::from_utf8_lossy(&request.spec.request.0).into_owned();
    let asked = csr::requested_identity(&request_pem)
        .with_context(|| format!("CertificateSigningRequest {name}"))?;
    if asked != args.origin_id {
        bail!(
            "CertificateSigningRequest {name} asks for identity {asked}, not {}",
            args.origin_id
        );
    }
    if dry_run::asked(&args.dry_run) {
        let record = plan::tenant_record(&args.origin_id);
        dry_run::print(
            &[dry_run::named(
                "v1",
                "ConfigMap",
                &record,
                Some(NAMESPACE.as_str()),
            )],
            &args.dry_run,
        )?;
        let approved = request.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Approved" && c.status == "True")
        });
        dry_run::note(&format!(
            "CertificateSigningRequest {name} asks for {} of signer {} and is {}; a real run waits for the remote agent's signature, records the tenant and writes the bundle",
            args.origin_id,
            csr::TENANT_SIGNER,
            if approved { "approved" } else { "not approved yet" }
        ));
        return Ok(());
    }
    let signed = tenant_cert::sign(
        &provider,
        &args.origin_id,
        &request_pem,
        Approval::ByAdmin,
        started + args.timeout,
        &say,
    )
    .await?;
    let bundle = Bundle::new(
        &args.provider_id,
        &args.origin_id,
        &args.provider_endpoint,
        signed,
    );
    let text = serde_yaml_ng::to_string(&bundle)?;
    let file = match &args.out {
        Some(path) => {
            write_atomic(path, text.as_bytes(), 0o644)
                .with_context(|| format!("failed to write {}", path.display()))?;
            say(&format!(
                "bundle written to {} (certificate, CA certificate, endpoint: nothing secret)",
                path.display()
            ));
            path.display().to_string()
        }
        None => {
            print!("{text}");
            "BUNDLE".to_string()
        }
    };
    say(&format!(
        "next, hand {file} to the origin's admin, who runs:\n  refractctl{ns} join complete --bundle {file} --registry REGISTRY",
        ns = NAMESPACE.flag()
    ));
    Ok(())
}

/// The provider's remote agent exists and serves as `provider`: a bundle naming another
/// provider id would give the origin an agent that refuses the peer it reaches.
async fn remote_agent_is(provider: &kube::Client, provider_id: &ClusterId) -> anyhow::Result<()> {
    let Some(args) = install::running_remote_agent_args(provider).await? else {
        bail!(
            "the provider has no remote agent (Deployment {NAMESPACE}/{}): run `refractctl install provider` first",
            plan::REMOTE_NAME
        );
    };
    match plan::serving_identity(&args) {
        Some(id) if id == provider_id.as_str() => Ok(()),
        Some(id) => bail!("the remote agent here serves as provider {id}, not {provider_id}"),
        None => {
            bail!("the remote agent here has no --cluster-id; run `refractctl install provider`")
        }
    }
}
