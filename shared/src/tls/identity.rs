//! Cluster ids and the SPIFFE-style URI that carries them in certificates.

use std::fmt;

/// The URI prefix of a Refract identity; the cluster id follows it.
pub const SPIFFE_PREFIX: &str = "spiffe://refract/cluster/";

/// Why an identity could not be read or accepted.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// The id is not a lowercase DNS label.
    #[error("invalid cluster id {id:?}: {reason}")]
    InvalidId {
        /// The rejected id.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The certificate could not be parsed.
    #[error("failed to parse certificate: {0}")]
    Parse(String),
    /// The certificate carries no Refract identity.
    #[error("certificate has no SAN URI starting with {SPIFFE_PREFIX}")]
    Missing,
    /// The certificate carries more than one Refract identity.
    #[error("certificate has more than one Refract identity: {0:?}")]
    Ambiguous(Vec<String>),
}

/// A cluster id: a lowercase DNS label (1–63 characters of `a-z`, `0-9` and `-`, starting and
/// ending with a letter or digit), because it ends up in namespace names and labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(String);

impl ClusterId {
    /// Validates `id` as a cluster id.
    pub fn parse(id: &str) -> Result<Self, IdentityError> {
        let invalid = |reason| IdentityError::InvalidId {
            id: id.to_string(),
            reason,
        };
        if id.is_empty() || id.len() > 63 {
            return Err(invalid("must be 1 to 63 characters"));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "only lowercase letters, digits and '-' are allowed",
            ));
        }
        if id.starts_with('-') || id.ends_with('-') {
            return Err(invalid("must start and end with a letter or digit"));
        }
        Ok(Self(id.to_string()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The SAN URI that names this cluster in a certificate.
    pub fn spiffe_uri(&self) -> String {
        format!("{SPIFFE_PREFIX}{}", self.0)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ClusterId {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// What a certificate says about itself, for logs, Inspect and `refract-certs inspect`.
#[derive(Debug, Clone)]
pub struct CertSummary {
    /// The Refract identity, if the certificate carries exactly one.
    pub cluster_id: Result<ClusterId, IdentityError>,
    /// Subject distinguished name.
    pub subject: String,
    /// Issuer distinguished name.
    pub issuer: String,
    /// Start of validity.
    pub not_before: time::OffsetDateTime,
    /// End of validity.
    pub not_after: time::OffsetDateTime,
    /// Serial number, hex.
    pub serial: String,
    /// Every DNS name, IP address and URI in the SAN extension.
    pub sans: Vec<String>,
    /// Whether this is a CA certificate.
    pub is_ca: bool,
}

/// Reads the Refract identity from a DER certificate.
pub fn cluster_id_from_der(der: &[u8]) -> Result<ClusterId, IdentityError> {
    summarize(der)?.cluster_id
}

/// Parses the parts of a DER certificate that Refract cares about.
pub fn summarize(der: &[u8]) -> Result<CertSummary, IdentityError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| IdentityError::Parse(e.to_string()))?;
    let mut sans = Vec::new();
    let mut ids = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => sans.push(format!("DNS:{d}")),
                GeneralName::URI(u) => {
                    sans.push(format!("URI:{u}"));
                    if let Some(id) = u.strip_prefix(SPIFFE_PREFIX) {
                        ids.push(id.to_string());
                    }
                }
                GeneralName::IPAddress(b) => sans.push(format!("IP:{}", ip_to_string(b))),
                other => sans.push(format!("{other:?}")),
            }
        }
    }
    let cluster_id = match ids.as_slice() {
        [] => Err(IdentityError::Missing),
        [one] => ClusterId::parse(one),
        many => Err(IdentityError::Ambiguous(many.to_vec())),
    };
    Ok(CertSummary {
        cluster_id,
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
        serial: cert.raw_serial_as_string(),
        sans,
        is_ca: cert.is_ca(),
    })
}

fn ip_to_string(bytes: &[u8]) -> String {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        std::net::Ipv4Addr::from(v4).to_string()
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        std::net::Ipv6Addr::from(v6).to_string()
    } else {
        format!("{bytes:?}")
    }
}

/// The Kubernetes user a client certificate stands for, as an API server or kubelet reads
/// it: the subject's common name is the user, its organizations the groups.
pub fn kubernetes_user(der: &[u8]) -> Result<(String, Vec<String>), IdentityError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| IdentityError::Parse(e.to_string()))?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok((user, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_labels() {
        for ok in ["a", "origin-1", "0abc", &"x".repeat(63)] {
            assert!(ClusterId::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_what_cannot_be_a_label() {
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a/b", &"x".repeat(64)] {
            assert!(ClusterId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_identity_from_certificate() {
        let id = ClusterId::parse("origin").unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(id.spiffe_uri()).unwrap(),
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(cluster_id_from_der(cert.der()).unwrap(), id);
    }

    #[test]
    fn certificate_without_identity_is_refused() {
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            cluster_id_from_der(cert.der()).unwrap_err(),
            IdentityError::Missing
        );
    }
}
