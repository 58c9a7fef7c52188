//! The signer of tenants' client certificates: Kubernetes CertificateSigningRequests with
//! signerName `refract.io/tenant-client`, once the provider's admin has approved them
//! (`kubectl certificate approve`), are signed with the peering CA kept in a Secret of the
//! agent's namespace. The origin's admin keeps the tenant's key; the provider's admin keeps the
//! CA's key; neither crosses (README, "Install on your clusters").
//!
//! Only the replica leading the cross-tenant work signs, so two replicas never sign one
//! request twice; only it watches the requests (of this signer only), from a fresh list each
//! time it starts leading and every [`RELIST`], so nothing approved meanwhile is missed and a
//! request that could not be signed (no CA Secret yet, a status write that failed) is taken
//! up again.
//!
//! What a request may ask for is decided by `refract_certs::request`: one Refract identity
//! and nothing else; the certificate's usages and lifetime are the signer's. A request whose
//! `refract.io/tenant` label (set by `refract-certs request --manifest`) names another identity is
//! refused. A refused request gets condition Failed with the reason, as Kubernetes' own signers
//! do.

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_certs::{Issued, Validity};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The signerName of tenants' client certificates.
pub const SIGNER_NAME: &str = refract_certs::request::TENANT_SIGNER;
/// How often the leader lists the requests afresh.
const RELIST: std::time::Duration = std::time::Duration::from_secs(60);
/// The label `refract-certs request --manifest` puts on a request: the tenant it is for.
pub const TENANT_LABEL: &str = refract_core::keys::TENANT_NAMESPACE_LABEL;

/// Where the CA is and what the signer issues.
#[derive(Debug, Clone)]
pub struct SignerConfig {
    /// The agent's namespace, holding the CA Secret.
    pub namespace: String,
    /// The Secret with the CA's `tls.crt` and `tls.key` (cert-manager's CA issuer layout).
    pub ca_secret: String,
    /// How long a signed certificate is valid.
    pub validity_days: i64,
}

/// What to do with one request.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Nothing: not approved yet, already signed, denied or failed.
    Wait,
    /// Sign it.
    Sign,
}

fn decide(csr: &CertificateSigningRequest) -> Decision {
    let Some(status) = &csr.status else {
        return Decision::Wait;
    };
    if status.certificate.as_ref().is_some_and(|c| !c.0.is_empty()) {
        return Decision::Wait;
    }
    let has = |kind: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == kind && c.status == "True")
    };
    if has("Denied") || has("Failed") || !has("Approved") {
        return Decision::Wait;
    }
    Decision::Sign
}

/// Signs approved requests while `leading`, until `shutdown`.
pub fn spawn(
    client: kube::Client,
    config: SignerConfig,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let api: Api<CertificateSigningRequest> = Api::all(client.clone());
        let secrets: Api<Secret> = Api::namespaced(client, &config.namespace);
        loop {
            // Wait to lead.
            while !*leading.borrow_and_update() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = leading.changed() => if changed.is_err() { return },
                }
            }
            let selector = format!("spec.signerName={SIGNER_NAME}");
            let mut requests = watcher(api.clone(), watcher::Config::default().fields(&selector))
                .default_backoff()
                .applied_objects()
                .boxed();
            let relist = tokio::time::sleep(RELIST);
            tokio::pin!(relist);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = &mut relist => break,
                    changed = leading.changed() => {
                        if changed.is_err() { return }
                        if !*leading.borrow() { break }
                    }
                    next = requests.next() => match next {
                        Some(Ok(csr)) if decide(&csr) == Decision::Sign => {
                            sign_one(&api, &secrets, &config, csr).await;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(error)) => {
                            tracing::warn!(%error, "watching certificate requests for {SIGNER_NAME} failed; retrying");
                        }
                        None => break,
                    },
                }
            }
        }
    });
}

async fn sign_one(
    api: &Api<CertificateSigningRequest>,
    secrets: &Api<Secret>,
    config: &SignerConfig,
    csr: CertificateSigningRequest,
) {
    let name = csr.name_any();
    // An event may be older than the request's state (two queued before the first was
    // signed): read it again, so that one request is signed once.
    let csr = match api.get_opt(&name).await {
        Ok(Some(current)) if decide(&current) == Decision::Sign => current,
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(request = %name, %error, "cannot read the certificate request; trying again within a minute");
            return;
        }
    };
    let ca = match read_ca(secrets, &config.ca_secret).await {
        Ok(ca) => ca,
        Err(reason) => {
            // Not the request's fault: it stays pending, and is taken up at the next list.
            tracing::warn!(request = %name, %reason, "cannot sign the tenant's certificate request yet; trying again within a minute");
            return;
        }
    };
    let request_pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
    let signed = refract_certs::request::sign_client_request(
        &ca,
        &request_pem,
        Validity::days_from_now(config.validity_days),
    )
    .map_err(|e| e.to_string())
    .and_then(|(cert, tenant)| match csr.labels().get(TENANT_LABEL) {
        Some(label) if label != tenant.as_str() => Err(format!(
            "the request asks for identity {tenant} but is labelled {TENANT_LABEL}={label}"
        )),
        _ => Ok((cert, tenant)),
    });
    let patch = match &signed {
        Ok((cert, _)) => serde_json::json!({
            "status": {"certificate": base64_encode(cert.as_bytes())}
        }),
        Err(reason) => {
            let mut conditions = csr
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            conditions.push(CertificateSigningRequestCondition {
                type_: "Failed".into(),
                status: "True".into(),
                reason: Some("RefractRefused".into()),
                message: Some(reason.clone()),
                last_update_time: None,
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                )),
            });
            serde_json::json!({"status": {"conditions": conditions}})
        }
    };
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => match signed {
            Ok((_, tenant)) => {
                tracing::info!(request = %name, %tenant, "signed the tenant's client certificate")
            }
            Err(reason) => {
                tracing::warn!(request = %name, %reason, "refused the tenant's certificate request")
            }
        },
        Err(error) => {
            tracing::warn!(request = %name, %error, "cannot write the certificate request's status; trying again within a minute")
        }
    }
}

async fn read_ca(secrets: &Api<Secret>, name: &str) -> Result<Issued, String> {
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot read Secret {name}: {e}"))?
        .ok_or_else(|| format!("Secret {name} (the peering CA) does not exist"))?;
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("Secret {name} has no {key}"))
    };
    Ok(Issued {
        cert_pem: field("tls.crt")?,
        key_pem: field("tls.key")?,
    })
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus;
    use k8s_openapi::ByteString;

    fn csr(conditions: &[&str], certificate: Option<&str>) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                certificate: certificate.map(|c| ByteString(c.as_bytes().to_vec())),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|t| CertificateSigningRequestCondition {
                            type_: t.to_string(),
                            status: "True".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_an_approved_unsigned_request_is_signed() {
        assert_eq!(
            decide(&CertificateSigningRequest::default()),
            Decision::Wait
        );
        assert_eq!(decide(&csr(&[], None)), Decision::Wait);
        assert_eq!(decide(&csr(&["Approved"], None)), Decision::Sign);
        assert_eq!(decide(&csr(&["Approved"], Some("pem"))), Decision::Wait);
        assert_eq!(decide(&csr(&["Approved", "Failed"], None)), Decision::Wait);
        assert_eq!(decide(&csr(&["Denied"], None)), Decision::Wait);
    }
}
