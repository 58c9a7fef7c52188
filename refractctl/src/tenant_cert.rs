//! The tenant's client certificate in three steps that two admins can run apart, so that no
//! private key, CA key or kubeconfig crosses between the clusters:
//!
//! 1. [`request`], in the origin: a key made there and kept in a Secret there, and a
//!    certificate request for the tenant's identity;
//! 2. [`sign`], in the provider: the request as a Kubernetes CertificateSigningRequest of
//!    signer `refract.io/tenant-client`, which the remote agent signs with the CA in its own
//!    Secret once an admin approved it (`kubectl certificate approve`);
//! 3. [`complete`], in the origin: the certificate and the CA bundle put next to the key, in
//!    the Secret the local agent mounts.
//!
//! `peer` and `rotate` run the three in a row; `join request`, `tenant export` and
//! `join complete` run one each.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use refract_certs::request as csr;
use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::identity::CertSummary;
use refract_shared::tls::ClusterId;
use serde_json::json;

use crate::apply;
use crate::install::record_tenant;
use crate::manifests::NAMESPACE;
use crate::pki;
use crate::plan;

/// The request Secret's key and request fields.
const KEY_FIELD: &str = "tls.key";
const REQUEST_FIELD: &str = "tls.csr";

/// A certificate the provider signed, with the CA that checks it (both PEM, public).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The tenant's client certificate.
    pub certificate: String,
    /// The provider's CA certificate: the origin checks the remote agent's serving
    /// certificate against it.
    pub ca: String,
}

/// What the provider's admin hands back to the origin's admin (`tenant export`, `join
/// complete`): public material only. `join complete` trusts none of it before checking it
/// against the key the origin kept.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bundle {
    /// [`BUNDLE_API_VERSION`].
    pub api_version: String,
    /// [`BUNDLE_KIND`].
    pub kind: String,
    /// The provider's cluster id.
    pub provider_id: String,
    /// The tenant's (origin's) cluster id.
    pub origin_id: String,
    /// Where the origin's agent reaches the provider's (HOST:PORT).
    pub provider_endpoint: String,
    /// The tenant's client certificate (PEM).
    pub certificate: String,
    /// The provider's CA certificate (PEM).
    pub ca: String,
}

/// The bundle's `apiVersion` and `kind`: a file of another kind is refused, not guessed at.
pub const BUNDLE_API_VERSION: &str = "refract.io/v1";
pub const BUNDLE_KIND: &str = "PeeringBundle";

/// A bundle's fields, checked.
#[derive(Debug, Clone)]
pub struct CheckedBundle {
    /// The provider's cluster id.
    pub provider: ClusterId,
    /// The tenant's cluster id.
    pub origin: ClusterId,
    /// Where the local agent dials the remote agent.
    pub endpoint: crate::plan::HostPort,
    /// The certificate and its CA, checked against the kept key by [`complete`].
    pub signed: Signed,
}

impl Bundle {
    /// The bundle for `origin`'s certificate from `provider`, reached at `endpoint`.
    pub fn new(
        provider: &ClusterId,
        origin: &ClusterId,
        endpoint: &crate::plan::HostPort,
        signed: Signed,
    ) -> Self {
        Self {
            api_version: BUNDLE_API_VERSION.into(),
            kind: BUNDLE_KIND.into(),
            provider_id: provider.to_string(),
            origin_id: origin.to_string(),
            provider_endpoint: endpoint.to_string(),
            certificate: signed.certificate,
            ca: signed.ca,
        }
    }

    /// Reads and checks a bundle (YAML or JSON); every error says what is wrong.
    pub fn parse(text: &str) -> anyhow::Result<CheckedBundle> {
        let bundle: Bundle = serde_yaml_ng::from_str(text)
            .context("not a Refract peering bundle (as `refractctl tenant export` writes)")?;
        if bundle.api_version != BUNDLE_API_VERSION || bundle.kind != BUNDLE_KIND {
            bail!(
                "the file is a {} {}, not a {BUNDLE_API_VERSION} {BUNDLE_KIND}",
                bundle.api_version,
                bundle.kind
            );
        }
        let id = |what: &str, v: &str| {
            ClusterId::parse(v).with_context(|| format!("the bundle's {what} {v:?}"))
        };
        Ok(CheckedBundle {
            provider: id("providerId", &bundle.provider_id)?,
            origin: id("originId", &bundle.origin_id)?,
            endpoint: bundle
                .provider_endpoint
                .parse()
                .map_err(|e: String| anyhow::anyhow!("the bundle's providerEndpoint: {e}"))?,
            signed: Signed {
                certificate: bundle.certificate,
                ca: bundle.ca,
            },
        })
    }
}

/// Who approves the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// refractctl, holding the provider's kubeconfig (`peer`, `rotate`).
    Here,
    /// The provider's admin, with `kubectl certificate approve` (`tenant export` waits).
    ByAdmin,
}

/// Step 1, in the origin: the request for `tenant`'s certificate with `provider`, and a key
/// that stays in the origin (Secret `refract-local-agent-<provider>-request`). A pending
/// request is used again unless `fresh`, so running this twice asks for one certificate.
pub async fn request(
    origin: &kube::Client,
    provider: &ClusterId,
    tenant: &ClusterId,
    fresh: bool,
    say: &impl Fn(&str),
) -> anyhow::Result<String> {
    let name = plan::local_request_secret(provider);
    if !fresh {
        if let Some((request, _)) = pending(origin, provider).await? {
            if csr::requested_identity(&request).ok().as_ref() == Some(tenant) {
                say(&format!(
                    "certificate request pending in Secret {NAMESPACE}/{name}: asked again"
                ));
                return Ok(request);
            }
        }
    }
    let (request, key) = csr::create_client_request(tenant)?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "refract", PEERING_LABEL: provider.as_str()},
        },
        "type": "Opaque",
        "data": {KEY_FIELD: b64(&key), REQUEST_FIELD: b64(&request)},
    });
    apply::apply(origin, &secret).await?;
    say(&format!(
        "tenant {tenant}: a new key in Secret {NAMESPACE}/{name} (it never leaves the origin) and a certificate request for it"
    ));
    Ok(request)
}

/// The pending request and its key, if the origin holds one for `provider`.
async fn pending(
    origin: &kube::Client,
    provider: &ClusterId,
) -> anyhow::Result<Option<(String, String)>> {
    let Some(mut fields) = pki::read_fields(origin, &plan::local_request_secret(provider)).await?
    else {
        return Ok(None);
    };
    let mut field = |key: &str| fields.remove(key);
    let request = field(REQUEST_FIELD);
    Ok(request.zip(field(KEY_FIELD)))
}

/// Step 2, in the provider: `request_pem` as a CertificateSigningRequest (one already there
/// for another request of this tenant is replaced), approved here or awaited, then the
/// certificate the remote agent signed, recorded as the tenant's.
pub async fn sign(
    provider: &kube::Client,
    tenant: &ClusterId,
    request_pem: &str,
    approval: Approval,
    deadline: Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<Signed> {
    let csrs: Api<CertificateSigningRequest> = Api::all(provider.clone());
    let name = csr::request_object_name(tenant);
    let existing = csrs
        .get_opt(&name)
        .await
        .with_context(|| format!("failed to read CertificateSigningRequest {name}"))?;
    let same = existing
        .as_ref()
        .is_some_and(|e| e.spec.request.0 == request_pem.as_bytes());
    if !same {
        if existing.is_some() {
            csrs.delete(&name, &DeleteParams::default())
                .await
                .with_context(|| format!("failed to delete the earlier request {name}"))?;
            say(&format!(
                "CertificateSigningRequest {name}: an earlier request deleted"
            ));
        }
        let object: CertificateSigningRequest =
            serde_json::from_value(csr::request_object(tenant, request_pem))?;
        csrs.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("failed to create CertificateSigningRequest {name}"))?;
        say(&format!("CertificateSigningRequest {name} created"));
    }
    if approval == Approval::Here && !has_condition(&csrs.get(&name).await?, "Approved") {
        let approve = json!({"status": {"conditions": [{
            "type": "Approved",
            "status": "True",
            "reason": "RefractctlApproved",
            "message": "approved by refractctl, run with the provider's kubeconfig",
        }]}});
        csrs.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&approve))
            .await
            .with_context(|| format!("failed to approve CertificateSigningRequest {name}"))?;
        say(&format!("CertificateSigningRequest {name} approved"));
    }
    let certificate = signed_certificate(&csrs, &name, deadline, say).await?;
    let ca = pki::read(provider, plan::PROVIDER_CA_SECRET)
        .await?
        .with_context(|| {
            format!(
                "the provider has no CA in Secret {NAMESPACE}/{}",
                plan::PROVIDER_CA_SECRET
            )
        })?
        .cert_pem;
    let summary = record_tenant(provider, tenant, &certificate).await?;
    say(&format!(
        "tenant {tenant}: certificate signed by the remote agent, serial {}, valid until {}",
        summary.serial, summary.not_after
    ));
    Ok(Signed { certificate, ca })
}

fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    condition(csr, kind).is_some()
}

fn condition(csr: &CertificateSigningRequest, kind: &str) -> Option<String> {
    let conditions = csr.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.as_deref().unwrap_or(kind),
                c.message.as_deref().unwrap_or("")
            )
        })
}

/// Waits until the request `name` holds a certificate; a denied or refused request, or one
/// still waiting at `deadline`, is an error saying what it waits for.
async fn signed_certificate(
    csrs: &Api<CertificateSigningRequest>,
    name: &str,
    deadline: Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<String> {
    let mut told = String::new();
    loop {
        let current = csrs
            .get(name)
            .await
            .with_context(|| format!("failed to read CertificateSigningRequest {name}"))?;
        if let Some(cert) = current.status.as_ref().and_then(|s| s.certificate.as_ref()) {
            if !cert.0.is_empty() {
                return Ok(String::from_utf8_lossy(&cert.0).into_owned());
            }
        }
        for refusal in ["Denied", "Failed"] {
            if let Some(why) = condition(&current, refusal) {
                bail!("CertificateSigningRequest {name} was {refusal}: {why}");
            }
        }
        let approved = has_condition(&current, "Approved");
        let (waiting_for, if_it_lasts) = if approved {
            (
                "the remote agent to sign it".to_string(),
                format!(
                    "the replica that leads signs requests of signer {} with the CA in Secret {NAMESPACE}/{}: is the remote agent running, with --tenant-ca-secret naming that Secret? Its log says why it did not sign",
                    csr::TENANT_SIGNER,
                    plan::PROVIDER_CA_SECRET
                ),
            )
        } else {
            (
                "an admin of the provider to approve it".to_string(),
                format!("kubectl certificate approve {name}"),
            )
        };
        if Instant::now() >= deadline {
            bail!("CertificateSigningRequest {name} still waits for {waiting_for}: {if_it_lasts}");
        }
        if told != waiting_for {
            // The command an admin runs is worth saying at once; the diagnosis of a signer
            // that does not sign only if it lasts.
            let hint = if approved {
                String::new()
            } else {
                format!(": {if_it_lasts}")
            };
            say(&format!(
                "CertificateSigningRequest {name}: waiting for {waiting_for}{hint}"
            ));
            told = waiting_for;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Step 3, in the origin: `signed` next to the key of the pending request, in Secret `name`
/// (the one the local agent mounts); the request Secret goes. A certificate for another key or
/// another identity is refused: the Secret would hold a pair that cannot connect.
pub async fn complete(
    origin: &kube::Client,
    provider: &ClusterId,
    tenant: &ClusterId,
    signed: &Signed,
    name: &str,
    say: &impl Fn(&str),
) -> anyhow::Result<CertSummary> {
    let request_secret = plan::local_request_secret(provider);
    let summary =
        pki::summary(&signed.certificate).context("the signed certificate cannot be read")?;
    if let Some(held) = pki::read(origin, name).await? {
        if held.cert_pem == signed.certificate {
            say(&format!(
                "client certificate in Secret {NAMESPACE}/{name} is this one already: kept"
            ));
            return Ok(summary);
        }
    }
    let Some((_, key)) = pending(origin, provider).await? else {
        bail!(
            "the origin holds no pending certificate request for provider {provider} (Secret {NAMESPACE}/{request_secret}): run `refractctl join request` first; a request already completed cannot be completed again"
        );
    };
    match &summary.cluster_id {
        Ok(id) if id == tenant => {}
        _ => bail!(
            "the certificate identifies {:?}, not tenant {tenant}",
            summary.cluster_id
        ),
    }
    if !csr::certificate_matches_key(&signed.certificate, &key)? {
        bail!(
            "the certificate is not for the key of the request pending in Secret {NAMESPACE}/{request_secret}: was it signed for an earlier request? Ask the provider's admin to sign the current one"
        );
    }
    let ca = pki::summary(&signed.ca).context("the CA certificate cannot be read")?;
    if !ca.is_ca || ca.subject != summary.issuer {
        bail!(
            "the CA bundle holds {}, which did not issue the certificate (issued by {})",
            ca.subject,
            summary.issuer
        );
    }
    let labels = [(PEERING_LABEL, provider.as_str())];
    let leaf = refract_certs::Issued {
        cert_pem: signed.certificate.clone(),
        key_pem: key,
    };
    apply::apply(origin, &pki::secret(name, &labels, &leaf, &signed.ca)).await?;
    let request = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": request_secret, "namespace": NAMESPACE}});
    apply::delete(origin, &request).await?;
    say(&format!(
        "client certificate for tenant {tenant} (serial {}, until {}) in Secret {NAMESPACE}/{name}, next to the key made in the origin",
        summary.serial, summary.not_after
    ));
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle() -> Bundle {
        Bundle::new(
            &ClusterId::parse("provider").unwrap(),
            &ClusterId::parse("origin").unwrap(),
            &"agent.example:443".parse().unwrap(),
            Signed {
                certificate: "CERT".into(),
                ca: "CA".into(),
            },
        )
    }

    #[test]
    fn a_bundle_reads_back_as_written() {
        let text = serde_yaml_ng::to_string(&bundle()).unwrap();
        assert!(text.contains("kind: PeeringBundle"), "{text}");
        let read = Bundle::parse(&text).unwrap();
        assert_eq!(read.provider.as_str(), "provider");
        assert_eq!(read.origin.as_str(), "origin");
        assert_eq!(read.endpoint.to_string(), "agent.example:443");
        assert_eq!(read.signed.certificate, "CERT");
    }

    #[test]
    fn a_bundle_of_another_kind_or_with_bad_fields_is_refused_with_the_reason() {
        let mut other = bundle();
        other.kind = "Secret".into();
        let err = Bundle::parse(&serde_yaml_ng::to_string(&other).unwrap()).unwrap_err();
        assert!(
            err.to_string()
                .contains("not a refract.io/v1 PeeringBundle"),
            "{err}"
        );
        let mut bad_id = bundle();
        bad_id.origin_id = "Not A Label".into();
        let err = Bundle::parse(&serde_yaml_ng::to_string(&bad_id).unwrap()).unwrap_err();
        assert!(format!("{err:#}").contains("originId"), "{err:#}");
        let mut bad_endpoint = bundle();
        bad_endpoint.provider_endpoint = "nowhere".into();
        let err = Bundle::parse(&serde_yaml_ng::to_string(&bad_endpoint).unwrap()).unwrap_err();
        assert!(err.to_string().contains("providerEndpoint"), "{err}");
        let extra = format!(
            "{}tlsKey: secret\n",
            serde_yaml_ng::to_string(&bundle()).unwrap()
        );
        assert!(
            Bundle::parse(&extra).is_err(),
            "an unknown field is refused"
        );
    }
}
