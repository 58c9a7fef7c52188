//! The certificates `peer` keeps in Secrets: kept while they still fit, issued otherwise.

use refract_certs::{Issued, Role};
use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::ClusterId;

use crate::apply;
use crate::manifests::NAMESPACE;
use crate::pki::{self, TlsSecret};
use crate::plan::{self, Plan, TENANT_LABEL};

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
pub async fn ensure_client(
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
            say(&format!("client certificate for tenant {} issued into Secret {NAMESPACE}/{name}, signed here with the provider's CA (its key is not written to the origin)", plan.origin));
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
