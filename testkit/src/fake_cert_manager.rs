//! A stand-in for cert-manager, so that `deploy/cert-manager/` can be applied as its comments
//! say on clusters that cannot pull cert-manager's images (no network here).
//!
//! It does what those overlays use and nothing more: `cert-manager.io/v1` Issuers of kind
//! `selfSigned` or `ca`, Certificates issued once into their `secretName` (type
//! `kubernetes.io/tls`: `tls.crt`, `tls.key`, `ca.crt`, as cert-manager writes them) with the
//! spec's common name, URIs, DNS names, IP addresses, usages, `isCA` and duration, on ECDSA
//! P-256 keys; and cainjector's `cert-manager.io/inject-ca-from` on webhook configurations. No
//! renewal, no ClusterIssuer, no RSA, no status conditions: a test that needs those needs the
//! real cert-manager.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::ByteString;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use kube::core::GroupVersionKind;
use kube::ResourceExt;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The annotation cainjector reads: `<namespace>/<certificate>` whose CA goes in every webhook.
pub const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

/// How often Certificates and webhook configurations are looked at.
const PASS_INTERVAL: Duration = Duration::from_millis(500);

/// Installs the two CustomResourceDefinitions (schemas left open, as only this reads them)
/// and waits until the API server serves them.
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (kind, plural) in [("Issuer", "issuers"), ("Certificate", "certificates")] {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }],
            },
        }))?;
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).context("failed to create a cert-manager CRD"),
        }
    }
    let certificates = dynamic(client, "Certificate", "certificates", None);
    for _ in 0..100 {
        if certificates.list(&Default::default()).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the cert-manager CRDs were not served within 10 s")
}

/// Issues and injects until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) {
    loop {
        if let Err(error) = issue_missing(&client).await {
            tracing::warn!(error = format!("{error:#}"), "fake cert-manager: issuing");
        }
        if let Err(error) = inject_ca(&client).await {
            tracing::warn!(error = format!("{error:#}"), "fake cert-manager: injecting");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(PASS_INTERVAL) => {}
        }
    }
}

fn dynamic(
    client: &kube::Client,
    kind: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", kind),
        plural,
    );
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Every Certificate whose Secret does not exist yet, issued (a CA issuer's Secret may come
/// later: then on a later pass).
async fn issue_missing(client: &kube::Client) -> anyhow::Result<()> {
    let certificates = dynamic(client, "Certificate", "certificates", None);
    for certificate in certificates.list(&Default::default()).await?.items {
        let namespace = certificate.namespace().unwrap_or_default();
        let spec = &certificate.data["spec"];
        let Some(secret_name) = spec["secretName"].as_str() else {
            continue;
        };
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        if secrets.get_opt(secret_name).await?.is_some() {
            continue;
        }
        let what = format!("Certificate {namespace}/{}", certificate.name_any());
        let Some(issued) = issue(client, &namespace, spec)
            .await
            .with_context(|| what.clone())?
        else {
            continue;
        };
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.to_string()),
                annotations: Some(
                    [(
                        "cert-manager.io/certificate-name".to_string(),
                        certificate.name_any(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                [
                    ("tls.crt", issued.cert_pem),
                    ("tls.key", issued.key_pem),
                    ("ca.crt", issued.ca_pem),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
            ),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(certificate = %what, secret = secret_name, "fake cert-manager issued")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("{what}: writing its Secret")),
        }
    }
    Ok(())
}

/// A certificate, its key and the CA certificate that signed it.
struct Issued {
    cert_pem: String,
    key_pem: String,
    ca_pem: String,
}

/// Issues what `spec` asks from its issuer; `None` while a CA issuer's Secret is missing.
async fn issue(
    client: &kube::Client,
    namespace: &str,
    spec: &Value,
) -> anyhow::Result<Option<Issued>> {
    let issuer_ref = &spec["issuerRef"];
    let kind = issuer_ref["kind"].as_str().unwrap_or("Issuer");
    if kind != "Issuer" {
        bail!("issuerRef kind {kind} is not supported by the stand-in (Issuer only)");
    }
    let issuer_name = issuer_ref["name"]
        .as_str()
        .context("issuerRef has no name")?;
    let issuers = dynamic(client, "Issuer", "issuers", Some(namespace));
    let Some(issuer) = issuers.get_opt(issuer_name).await? else {
        return Ok(None);
    };
    let params = params_of(spec)?;
    let key = key_of(spec)?;
    let issuer_spec = &issuer.data["spec"];
    if issuer_spec.get("selfSigned").is_some() {
        let cert = params.self_signed(&key)?;
        return Ok(Some(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: cert.pem(),
        }));
    }
    let Some(ca_secret) = issuer_spec["ca"]["secretName"].as_str() else {
        bail!("Issuer {namespace}/{issuer_name} is neither selfSigned nor ca");
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Some(ca) = secrets.get_opt(ca_secret).await? else {
        return Ok(None);
    };
    let field = |name: &str| {
        ca.data
            .as_ref()
            .and_then(|d| d.get(name))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .with_context(|| format!("Secret {namespace}/{ca_secret} has no {name}"))
    };
    let (ca_cert, ca_key) = (field("tls.crt")?, field("tls.key")?);
    let signer = Issuer::from_ca_cert_pem(&ca_cert, KeyPair::from_pem(&ca_key)?)?;
    let cert = params.signed_by(&key, &signer)?;
    Ok(Some(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: ca_cert,
    }))
}

/// The key `spec.privateKey` asks for: ECDSA P-256 (cert-manager's default is RSA, which this
/// stand-in cannot make; deploy/ asks for ECDSA everywhere).
fn key_of(spec: &Value) -> anyhow::Result<KeyPair> {
    let algorithm = spec["privateKey"]["algorithm"].as_str().unwrap_or("RSA");
    let size = spec["privateKey"]["size"].as_u64().unwrap_or(256);
    if algorithm != "ECDSA" || size != 256 {
        bail!("privateKey {algorithm} {size} is not supported by the stand-in (ECDSA 256 only)");
    }
    Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?)
}

/// What the certificate says, from the Certificate's spec as cert-manager reads it.
fn params_of(spec: &Value) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    if let Some(cn) = spec["commonName"].as_str() {
        name.push(DnType::CommonName, cn);
    }
    params.distinguished_name = name;
    let strings = |field: &str| -> Vec<String> {
        spec[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    for uri in strings("uris") {
        params.subject_alt_names.push(SanType::URI(uri.try_into()?));
    }
    for dns in strings("dnsNames") {
        params
            .subject_alt_names
            .push(SanType::DnsName(dns.try_into()?));
    }
    for ip in strings("ipAddresses") {
        let ip: IpAddr = ip.parse().with_context(|| format!("ipAddresses: {ip}"))?;
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    let is_ca = spec["isCA"].as_bool().unwrap_or(false);
    let mut usages = strings("usages");
    if usages.is_empty() {
        usages = vec!["digital signature".into(), "key encipherment".into()];
    }
    if is_ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        usages.push("cert sign".into());
    }
    for usage in usages {
        match usage.as_str() {
            "digital signature" => params.key_usages.push(KeyUsagePurpose::DigitalSignature),
            "key encipherment" => params.key_usages.push(KeyUsagePurpose::KeyEncipherment),
            "cert sign" => params.key_usages.push(KeyUsagePurpose::KeyCertSign),
            "server auth" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth),
            "client auth" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth),
            other => bail!("usage {other:?} is not supported by the stand-in"),
        }
    }
    let hours = match spec["duration"].as_str() {
        Some(d) => d
            .strip_suffix('h')
            .and_then(|h| h.parse::<i64>().ok())
            .with_context(|| {
                format!("duration {d:?}: the stand-in takes whole hours (\"2160h\")")
            })?,
        None => 2160,
    };
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::hours(hours);
    Ok(params)
}

/// cainjector: every MutatingWebhookConfiguration annotated with [`INJECT_CA_FROM`] gets the
/// named Certificate's `ca.crt` as every webhook's caBundle.
async fn inject_ca(client: &kube::Client) -> anyhow::Result<()> {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for mut configuration in configurations.list(&Default::default()).await?.items {
        let Some(from) = configuration.annotations().get(INJECT_CA_FROM).cloned() else {
            continue;
        };
        let Some((namespace, name)) = from.split_once('/') else {
            continue;
        };
        let certificates = dynamic(client, "Certificate", "certificates", Some(namespace));
        let Some(certificate) = certificates.get_opt(name).await? else {
            continue;
        };
        let Some(secret_name) = certificate.data["spec"]["secretName"].as_str() else {
            continue;
        };
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let Some(ca) = secrets
            .get_opt(secret_name)
            .await?
            .and_then(|s| s.data)
            .and_then(|mut d| d.remove("ca.crt"))
        else {
            continue;
        };
        let mut changed = false;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            if webhook.client_config.ca_bundle.as_ref() != Some(&ca) {
                webhook.client_config.ca_bundle = Some(ca.clone());
                changed = true;
            }
        }
        if changed {
            let name = configuration.name_any();
            configurations
                .replace(&name, &PostParams::default(), &configuration)
                .await
                .with_context(|| format!("injecting the CA into {name}"))?;
            tracing::info!(configuration = %name, from = %from, "fake cert-manager injected a CA");
        }
    }
    Ok(())
}
