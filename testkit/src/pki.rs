//! Throwaway keys and certificates for a test apiserver.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

/// Writes `ca.crt`, `serving.crt`/`serving.key` (for 127.0.0.1, localhost and
/// [`crate::node_network::API_ADDRESS`] and `service_ip`, the `kubernetes` Service's),
/// `kubelet-client.crt`/`.key` (the API server's identity towards kubelets) and
/// `sa.key`/`sa.pub` (service-account signing key) into `dir`.
pub fn write_apiserver_pki(dir: &Path, service_ip: std::net::Ipv4Addr) -> anyhow::Result<()> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "testkit-ca");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse()?));
    // Where pods reach it: the `kubernetes` Service's cluster IP, and where nodes with a
    // network of their own reach it.
    serving
        .subject_alt_names
        .push(SanType::IpAddress(service_ip.into()));
    serving
        .subject_alt_names
        .push(SanType::IpAddress(crate::node_network::API_ADDRESS.into()));
    serving
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    // The API server's client certificate towards kubelets (logs, exec, port-forward).
    let kubelet_client_key = KeyPair::generate()?;
    let mut kubelet_client = CertificateParams::new(Vec::<String>::new())?;
    kubelet_client
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
    kubelet_client
        .extended_key_usages
        .push(rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let kubelet_client_cert = kubelet_client.signed_by(&kubelet_client_key, &issuer)?;

    let sa_key = KeyPair::generate()?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    std::fs::write(dir.join("serving.crt"), serving_cert.pem())?;
    std::fs::write(dir.join("serving.key"), serving_key.serialize_pem())?;
    std::fs::write(dir.join("kubelet-client.crt"), kubelet_client_cert.pem())?;
    std::fs::write(
        dir.join("kubelet-client.key"),
        kubelet_client_key.serialize_pem(),
    )?;
    std::fs::write(dir.join("sa.key"), sa_key.serialize_pem())?;
    // 1.20 reads verification keys only from PUBLIC KEY blocks, not from a PKCS#8 private key.
    std::fs::write(dir.join("sa.pub"), sa_key.public_key_pem())?;
    Ok(())
}
