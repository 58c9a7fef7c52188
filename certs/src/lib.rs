//! Certificate authority and certificate issuance for Refract agents.
//!
//! Each peering is authenticated by certificates from a CA the operator owns:
//! - a **server** certificate for the remote agent (SAN URI of its cluster id, plus the DNS names
//!   and IP addresses local agents dial);
//! - a **client** certificate per origin cluster (SAN URI `spiffe://refract/cluster/<id>`): the
//!   remote agent takes the tenant from it and nothing else.
//!
//! [`issue`] makes either; [`reissue`] rotates one (new key, new serial, same identity and
//! names); [`output`] writes them as files or as a `kubernetes.io/tls` Secret manifest.

pub mod output;
pub mod request;

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use refract_shared::tls::identity::{self, ClusterId};
use time::{Duration, OffsetDateTime};

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters or the key.
    #[error("failed to generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// An input certificate could not be read.
    #[error("failed to read certificate: {0}")]
    Read(String),
    /// A certificate request is not one Refract signs.
    #[error("certificate request refused: {0}")]
    Request(String),
}

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// A remote agent's serving certificate.
    Server,
    /// A local agent's client certificate.
    Client,
}

/// The validity window of a new certificate.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// Valid from five minutes ago (to absorb clock skew) for `days` days.
    pub fn days_from_now(days: i64) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            not_before: now - Duration::minutes(5),
            not_after: now + Duration::days(days),
        }
    }
}

/// What to put in a leaf certificate.
#[derive(Debug, Clone)]
pub struct LeafRequest {
    /// The cluster the certificate identifies.
    pub cluster_id: ClusterId,
    /// Server or client.
    pub role: Role,
    /// DNS names to add (servers).
    pub dns_names: Vec<String>,
    /// IP addresses to add (servers).
    pub ips: Vec<IpAddr>,
    /// Validity window.
    pub validity: Validity,
}

/// Creates a self-signed CA certificate and key.
pub fn create_ca(common_name: &str, validity: Validity) -> Result<Issued, CertError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues a leaf certificate signed by the CA in `ca`.
pub fn issue(ca: &Issued, request: &LeafRequest) -> Result<Issued, CertError> {
    let key = KeyPair::generate()?;
    let cert = leaf_params(request)?.signed_by(&key, &ca_issuer(ca)?)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The CA in `ca` as rcgen's issuer.
fn ca_issuer(ca: &Issued) -> Result<Issuer<'static, KeyPair>, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    Ok(Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?)
}

/// Everything a leaf says but its key: the one place that decides what Refract's
/// certificates carry, whoever made the key.
fn leaf_params(request: &LeafRequest) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(&format!(
        "refract-{}-{}",
        match request.role {
            Role::Server => "server",
            Role::Client => "client",
        },
        request.cluster_id
    ));
    params
        .subject_alt_names
        .push(SanType::URI(rcgen::string::Ia5String::try_from(
            request.cluster_id.spiffe_uri(),
        )?));
    for dns in &request.dns_names {
        params
            .subject_alt_names
            .push(SanType::DnsName(rcgen::string::Ia5String::try_from(
                dns.as_str(),
            )?));
    }
    for ip in &request.ips {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![match request.role {
        Role::Server => ExtendedKeyUsagePurpose::ServerAuth,
        Role::Client => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.not_before = request.validity.not_before;
    params.not_after = request.validity.not_after;
    params.serial_number = Some(random_serial());
    Ok(params)
}

/// Reads back what a leaf certificate was issued for, so it can be re-issued.
pub fn request_from_cert(cert_pem: &str, validity: Validity) -> Result<LeafRequest, CertError> {
    use x509_parser::prelude::*;
    let der = crate::pem_to_der(cert_pem)?;
    let summary = identity::summarize(&der).map_err(|e| CertError::Read(e.to_string()))?;
    let cluster_id = summary
        .cluster_id
        .map_err(|e| CertError::Read(e.to_string()))?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|e| CertError::Read(e.to_string()))?;
    let role = match cert.extended_key_usage() {
        Ok(Some(eku)) if eku.value.server_auth => Role::Server,
        Ok(Some(eku)) if eku.value.client_auth => Role::Client,
        _ => {
            return Err(CertError::Read(
                "certificate has neither serverAuth nor clientAuth usage".into(),
            ))
        }
    };
    let mut dns_names = Vec::new();
    let mut ips = Vec::new();
    for san in &summary.sans {
        if let Some(d) = san.strip_prefix("DNS:") {
            dns_names.push(d.to_string());
        } else if let Some(ip) = san.strip_prefix("IP:").and_then(|ip| ip.parse().ok()) {
            ips.push(ip);
        }
    }
    Ok(LeafRequest {
        cluster_id,
        role,
        dns_names,
        ips,
        validity,
    })
}

/// Rotates a certificate: same identity, role and names; new key, serial and validity.
pub fn reissue(ca: &Issued, cert_pem: &str, validity: Validity) -> Result<Issued, CertError> {
    issue(ca, &request_from_cert(cert_pem, validity)?)
}

/// The DER bytes of the first certificate in a PEM string.
pub fn pem_to_der(pem: &str) -> Result<Vec<u8>, CertError> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .map_err(|e| CertError::Read(format!("no PEM certificate: {e}")))
}

pub(crate) fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Refract");
    dn.push(DnType::CommonName, common_name);
    dn
}

/// A positive 16-byte serial; uniqueness matters, secrecy does not.
fn random_serial() -> rcgen::SerialNumber {
    let mut bytes: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    bytes[0] &= 0x7f;
    rcgen::SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> Issued {
        create_ca("test-ca", Validity::days_from_now(1)).unwrap()
    }

    fn client(id: &str) -> LeafRequest {
        LeafRequest {
            cluster_id: ClusterId::parse(id).unwrap(),
            role: Role::Client,
            dns_names: vec![],
            ips: vec![],
            validity: Validity::days_from_now(1),
        }
    }

    #[test]
    fn issued_certificate_carries_identity() {
        let leaf = issue(&ca(), &client("origin-a")).unwrap();
        let der = pem_to_der(&leaf.cert_pem).unwrap();
        assert_eq!(
            identity::cluster_id_from_der(&der).unwrap().as_str(),
            "origin-a"
        );
    }

    #[test]
    fn reissue_keeps_identity_role_and_names_but_changes_key() {
        let ca = ca();
        let mut request = client("provider");
        request.role = Role::Server;
        request.dns_names = vec!["remote.example".into()];
        request.ips = vec!["127.0.0.1".parse().unwrap()];
        let first = issue(&ca, &request).unwrap();
        let second = reissue(&ca, &first.cert_pem, Validity::days_from_now(2)).unwrap();
        assert_ne!(first.key_pem, second.key_pem);
        let back = request_from_cert(&second.cert_pem, Validity::days_from_now(1)).unwrap();
        assert_eq!(back.role, Role::Server);
        assert_eq!(back.cluster_id.as_str(), "provider");
        assert_eq!(back.dns_names, vec!["remote.example".to_string()]);
        assert_eq!(back.ips, request.ips);
    }
}
