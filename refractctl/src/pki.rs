//! The peering's certificates as Secrets: CAs made once and kept in their cluster, leaves
//! issued from them, and the checks that decide whether a leaf still fits.

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{bail, Context};
use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use refract_certs::{Issued, LeafRequest, Role, Validity};
use refract_shared::tls::identity;
use refract_shared::tls::ClusterId;
use serde_json::{json, Value};

use crate::manifests::NAMESPACE;

/// How long a CA refractctl makes is valid.
const CA_DAYS: i64 = 3650;
/// How long a leaf refractctl issues is valid.
pub const LEAF_DAYS: i64 = 365;
/// A leaf closer than this to its end is issued again by `peer`.
const RENEW_BEFORE_DAYS: i64 = 30;

/// A certificate, its key and the CA bundle, as a `kubernetes.io/tls` Secret holds them.
#[derive(Debug, Clone)]
pub struct TlsSecret {
    /// `tls.crt`.
    pub cert_pem: String,
    /// `tls.key`.
    pub key_pem: String,
    /// `ca.crt` (empty when the Secret has none).
    pub ca_pem: String,
}

/// The fields of Secret `name` of refract-system, decoded (empty ones left out), if it exists.
pub async fn read_fields(
    client: &kube::Client,
    name: &str,
) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE.as_str());
    let Some(secret) = api
        .get_opt(name)
        .await
        .with_context(|| format!("failed to read Secret {NAMESPACE}/{name}"))?
    else {
        return Ok(None);
    };
    Ok(Some(
        secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .filter(|(_, v)| !v.is_empty())
            .collect(),
    ))
}

/// Reads the TLS Secret `name` of refract-system, if it exists.
pub async fn read(client: &kube::Client, name: &str) -> anyhow::Result<Option<TlsSecret>> {
    let Some(mut fields) = read_fields(client, name).await? else {
        return Ok(None);
    };
    let mut take = |key: &str| fields.remove(key).unwrap_or_default();
    let (cert_pem, key_pem, ca_pem) = (take("tls.crt"), take("tls.key"), take("ca.crt"));
    if cert_pem.is_empty() || key_pem.is_empty() {
        bail!("Secret {NAMESPACE}/{name} has no tls.crt or tls.key");
    }
    Ok(Some(TlsSecret {
        cert_pem,
        key_pem,
        ca_pem,
    }))
}

/// The Secret manifest holding `leaf` and `ca_pem`, labelled with `labels`.
pub fn secret(name: &str, labels: &[(&str, &str)], leaf: &Issued, ca_pem: &str) -> Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let labels: serde_json::Map<String, Value> = [("app.kubernetes.io/part-of", "refract")]
        .iter()
        .chain(labels)
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(&leaf.cert_pem), "tls.key": b64(&leaf.key_pem), "ca.crt": b64(ca_pem)},
    })
}

/// The CA in Secret `name`, made (and stored, without `ca.crt`) when it does not exist.
/// A CA of cert-manager's CA issuer layout (`tls.crt`, `tls.key`) is used as it is.
pub async fn ensure_ca(
    client: &kube::Client,
    name: &str,
    common_name: &str,
    say: &impl Fn(&str),
) -> anyhow::Result<Issued> {
    if let Some(existing) = read(client, name).await? {
        let summary = summary(&existing.cert_pem)
            .with_context(|| format!("Secret {NAMESPACE}/{name} does not hold a certificate"))?;
        if !summary.is_ca {
            bail!(
                "Secret {NAMESPACE}/{name} holds a certificate that is not a CA ({})",
                summary.subject
            );
        }
        say(&format!(
            "CA {} (Secret {NAMESPACE}/{name}) kept",
            summary.subject
        ));
        return Ok(Issued {
            cert_pem: existing.cert_pem,
            key_pem: existing.key_pem,
        });
    }
    let ca = refract_certs::create_ca(common_name, Validity::days_from_now(CA_DAYS))?;
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "refract"}},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem),
            "tls.key": base64::engine::general_purpose::STANDARD.encode(&ca.key_pem),
        },
    });
    crate::apply::apply(client, &manifest).await?;
    say(&format!(
        "CA {common_name} created (Secret {NAMESPACE}/{name}; its key stays in this cluster)"
    ));
    Ok(ca)
}

/// Issues a leaf for `id` with `names` (DNS names and IP addresses).
pub fn issue(ca: &Issued, id: &ClusterId, role: Role, names: &[String]) -> anyhow::Result<Issued> {
    let (ips, dns): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| n.parse::<IpAddr>().is_ok());
    Ok(refract_certs::issue(
        ca,
        &LeafRequest {
            cluster_id: id.clone(),
            role,
            dns_names: dns.into_iter().cloned().collect(),
            ips: ips.into_iter().filter_map(|i| i.parse().ok()).collect(),
            validity: Validity::days_from_now(LEAF_DAYS),
        },
    )?)
}

/// The summary of the first certificate of `pem`.
pub fn summary(pem: &str) -> anyhow::Result<identity::CertSummary> {
    let der = refract_certs::pem_to_der(pem)?;
    Ok(identity::summarize(&der)?)
}

/// Why an existing leaf must be issued again, if it must: it is not from the CA of
/// `ca_cert_pem`, it is for another identity, it lacks one of `names`, or it ends within 30
/// days.
pub fn reissue_reason(
    existing: &TlsSecret,
    ca_cert_pem: &str,
    id: &ClusterId,
    names: &[String],
) -> anyhow::Result<Option<String>> {
    let leaf = summary(&existing.cert_pem)?;
    let ca = summary(ca_cert_pem)?;
    if leaf.issuer != ca.subject {
        return Ok(Some(format!(
            "it was issued by {}, not by {}",
            leaf.issuer, ca.subject
        )));
    }
    match &leaf.cluster_id {
        Ok(found) if found == id => {}
        _ => return Ok(Some(format!("it does not identify {id}"))),
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| {
            let wanted = match n.parse::<IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            };
            !leaf.sans.contains(&wanted)
        })
        .collect();
    if !missing.is_empty() {
        return Ok(Some(format!("it lacks the names {missing:?}")));
    }
    let left = leaf.not_after - time::OffsetDateTime::now_utc();
    if left < time::Duration::days(RENEW_BEFORE_DAYS) {
        return Ok(Some(format!("it ends on {}", leaf.not_after)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_reissued_only_for_a_reason() {
        let ca = refract_certs::create_ca("test CA", Validity::days_from_now(10)).unwrap();
        let other = refract_certs::create_ca("other CA", Validity::days_from_now(10)).unwrap();
        let id = ClusterId::parse("provider").unwrap();
        let names = vec!["agent.example".to_string(), "10.0.0.1".to_string()];
        let leaf = issue(&ca, &id, Role::Server, &names).unwrap();
        let held = TlsSecret {
            cert_pem: leaf.cert_pem,
            key_pem: leaf.key_pem,
            ca_pem: ca.cert_pem.clone(),
        };
        assert_eq!(
            reissue_reason(&held, &ca.cert_pem, &id, &names).unwrap(),
            None
        );
        let more = vec!["other.example".to_string()];
        assert!(reissue_reason(&held, &ca.cert_pem, &id, &more)
            .unwrap()
            .unwrap()
            .contains("lacks"));
        assert!(reissue_reason(&held, &other.cert_pem, &id, &names)
            .unwrap()
            .unwrap()
            .contains("issued by"));
        let someone = ClusterId::parse("someone").unwrap();
        assert!(reissue_reason(&held, &ca.cert_pem, &someone, &names)
            .unwrap()
            .unwrap()
            .contains("identify"));
    }
}
