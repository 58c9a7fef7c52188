//! Certificate requests (PKCS#10), for a peering made by two admins: the origin's admin makes
//! the tenant's key and a request where the key stays ([`create_client_request`]); the
//! provider's signer issues the certificate from its CA without the key ever reaching it
//! ([`sign_client_request`]).
//!
//! The signer trusts nothing in a request but its public key (whose signature proves the
//! requester holds the key) and the one identity it asks for: names, usages, validity and
//! extensions are Refract's own, as [`crate::issue`] would give them.

use rcgen::{CertificateParams, CertificateSigningRequestParams, KeyPair, SanType};
use refract_shared::tls::identity::ClusterId;

use crate::{leaf_params, CertError, Issued, LeafRequest, Role, Validity};

/// The signerName of tenant client certificates: the remote agent signs approved
/// CertificateSigningRequests of this signer, and no others.
pub const TENANT_SIGNER: &str = "refract.io/tenant-client";

/// The CertificateSigningRequest of tenant `cluster_id` (one per tenant; a new request for the
/// same tenant replaces it).
pub fn request_object_name(cluster_id: &ClusterId) -> String {
    format!("refract-tenant-{cluster_id}")
}

/// The CertificateSigningRequest object for `request_pem`: it holds the request only, never a
/// key, and is labelled with the tenant it asks for (the signer refuses a mismatch).
pub fn request_object(cluster_id: &ClusterId, request_pem: &str) -> serde_json::Value {
    use base64::Engine as _;
    serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {
            "name": request_object_name(cluster_id),
            "labels": {
                "app.kubernetes.io/part-of": "refract",
                refract_core::keys::TENANT_NAMESPACE_LABEL: cluster_id.as_str(),
            },
        },
        "spec": {
            "signerName": TENANT_SIGNER,
            "usages": ["client auth", "digital signature", "key encipherment"],
            "request": base64::engine::general_purpose::STANDARD.encode(request_pem),
        },
    })
}

/// A new key, and a request for `cluster_id`'s client certificate signed with it (both PEM):
/// `(request, key)`.
pub fn create_client_request(cluster_id: &ClusterId) -> Result<(String, String), CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = crate::name(&format!("refract-client-{cluster_id}"));
    params
        .subject_alt_names
        .push(SanType::URI(rcgen::string::Ia5String::try_from(
            cluster_id.spiffe_uri(),
        )?));
    let request = params.serialize_request(&key)?;
    Ok((request.pem()?, key.serialize_pem()))
}

/// The identity a request asks for: exactly one subject alternative name, a Refract URI.
/// The request's own signature is checked first.
pub fn requested_identity(request_pem: &str) -> Result<ClusterId, CertError> {
    Ok(parse(request_pem)?.1)
}

/// Issues the client certificate a request asks for, signed by `ca`, valid for `validity`:
/// the certificate (PEM) and the tenant it identifies.
pub fn sign_client_request(
    ca: &Issued,
    request_pem: &str,
    validity: Validity,
) -> Result<(String, ClusterId), CertError> {
    let (request, cluster_id) = parse(request_pem)?;
    let params = leaf_params(&LeafRequest {
        cluster_id: cluster_id.clone(),
        role: Role::Client,
        dns_names: Vec::new(),
        ips: Vec::new(),
        validity,
    })?;
    let cert = params.signed_by(&request.public_key, &crate::ca_issuer(ca)?)?;
    Ok((cert.pem(), cluster_id))
}

/// Whether `cert_pem` certifies the public half of `key_pem`: a certificate handed back for a
/// request is checked against the key kept for it before the two are put together.
pub fn certificate_matches_key(cert_pem: &str, key_pem: &str) -> Result<bool, CertError> {
    use x509_parser::prelude::FromDer;
    let der = crate::pem_to_der(cert_pem)?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der)
        .map_err(|e| CertError::Read(format!("not an X.509 certificate: {e}")))?;
    let key = KeyPair::from_pem(key_pem)
        .map_err(|e| CertError::Read(format!("not a PEM private key: {e}")))?;
    Ok(cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw())
}

fn parse(request_pem: &str) -> Result<(CertificateSigningRequestParams, ClusterId), CertError> {
    let request = CertificateSigningRequestParams::from_pem(request_pem).map_err(|e| {
        CertError::Request(format!(
            "not a PEM certificate request with a valid signature: {e}"
        ))
    })?;
    let identity = match request.params.subject_alt_names.as_slice() {
        [SanType::URI(uri)] => {
            let uri = uri.as_str();
            let id = uri.strip_prefix("spiffe://refract/cluster/").ok_or_else(|| {
                CertError::Request(format!("its name {uri:?} is not a Refract identity (spiffe://refract/cluster/<id>)"))
            })?;
            ClusterId::parse(id).map_err(|e| CertError::Request(e.to_string()))?
        }
        other => {
            return Err(CertError::Request(format!(
                "it must name exactly one Refract identity and nothing else; it names {} subject alternative names",
                other.len()
            )))
        }
    };
    Ok((request, identity))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{create_ca, pem_to_der};
    use refract_shared::tls::identity;

    #[test]
    fn a_request_is_signed_for_its_identity_with_the_requesters_key() {
        let ca = create_ca("ca", Validity::days_from_now(1)).unwrap();
        let origin = ClusterId::parse("origin-a").unwrap();
        let (request, key_pem) = create_client_request(&origin).unwrap();
        assert_eq!(requested_identity(&request).unwrap(), origin);
        let (cert_pem, id) =
            sign_client_request(&ca, &request, Validity::days_from_now(1)).unwrap();
        assert_eq!(id, origin);
        let der = pem_to_der(&cert_pem).unwrap();
        let summary = identity::summarize(&der).unwrap();
        assert_eq!(summary.cluster_id.unwrap(), origin);
        assert_eq!(summary.sans, vec!["URI:spiffe://refract/cluster/origin-a"]);
        // The certificate holds the requester's public key, not one made by the signer.
        let key = KeyPair::from_pem(&key_pem).unwrap();
        use x509_parser::prelude::FromDer;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
        assert_eq!(
            cert.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw()
        );
        assert!(certificate_matches_key(&cert_pem, &key_pem).unwrap());
        let (_, other_key) = create_client_request(&origin).unwrap();
        assert!(!certificate_matches_key(&cert_pem, &other_key).unwrap());
    }

    #[test]
    fn requests_for_more_than_one_identity_or_a_foreign_name_are_refused() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![
            SanType::URI(rcgen::string::Ia5String::try_from("spiffe://refract/cluster/a").unwrap()),
            SanType::DnsName(rcgen::string::Ia5String::try_from("api.example.com").unwrap()),
        ];
        let two = params.serialize_request(&key).unwrap().pem().unwrap();
        let err = requested_identity(&two).unwrap_err().to_string();
        assert!(err.contains("exactly one Refract identity"), "{err}");
        params.subject_alt_names = vec![SanType::URI(
            rcgen::string::Ia5String::try_from("spiffe://other/cluster/a").unwrap(),
        )];
        let foreign = params.serialize_request(&key).unwrap().pem().unwrap();
        let err = requested_identity(&foreign).unwrap_err().to_string();
        assert!(err.contains("not a Refract identity"), "{err}");
        assert!(requested_identity(
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
        )
        .is_err());
    }
}
