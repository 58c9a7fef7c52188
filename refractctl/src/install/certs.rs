//! The certificates a peering keeps in Secrets: kept while they still fit, issued otherwise.

use refract_certs::{Issued, Role};
use refract_shared::tls::ClusterId;

use crate::apply;
use crate::manifests::NAMESPACE;
use crate::pki;
use crate::plan::{self, OriginPlan, TENANT_LABEL};
use crate::tenant_cert::{self, Approval};

/// A serving certificate `peer` keeps in a Secret.
pub struct ServingLeaf<'a> {
    /// The Secret in refract-system.
    pub secret: &'a str,
    /// The identity it carries.
    pub id: &'a ClusterId,
    /// Its DNS names and IP addresses.
    pub names: Vec<String>,
    /// Labels of the Secret.
    pub labels: &'a [(&'a str, &'a str)],
}

/// Keeps the certificate in `leaf.secret` if it still fits, else issues one from `ca`.
pub async fn ensure_serving(
    client: &kube::Client,
    ca: &Issued,
    leaf: &ServingLeaf<'_>,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let name = leaf.secret;
    let why = match pki::read(client, name).await? {
        Some(existing) => match pki::reissue_reason(&existing, &ca.cert_pem, leaf.id, &leaf.names)?
        {
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

/// The tenant's client certificate: kept in the origin when it still fits, else asked for
/// the way two admins would (a key made in the origin, a CertificateSigningRequest approved
/// here and signed by the remote agent); recorded on the provider either way.
pub async fn ensure_client(
    origin: &kube::Client,
    provider: &kube::Client,
    plan: &OriginPlan,
    ca_cert_pem: &str,
    deadline: std::time::Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<refract_shared::tls::identity::CertSummary> {
    let name = plan::local_tls_secret(&plan.provider);
    if let Some(existing) = pki::read(origin, &name).await? {
        match pki::reissue_reason(&existing, ca_cert_pem, &plan.origin, &[])? {
            None => {
                say(&format!(
                    "client certificate in Secret {NAMESPACE}/{name} kept"
                ));
                return record_tenant(provider, &plan.origin, &existing.cert_pem).await;
            }
            Some(reason) => say(&format!(
                "client certificate in Secret {NAMESPACE}/{name} replaced: {reason}"
            )),
        }
    }
    let request = tenant_cert::request(origin, &plan.provider, &plan.origin, false, say).await?;
    let signed = tenant_cert::sign(
        provider,
        &plan.origin,
        &request,
        Approval::Here,
        deadline,
        say,
    )
    .await?;
    tenant_cert::complete(origin, &plan.provider, &plan.origin, &signed, &name, say).await
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
