//! Writing certificates out: as files, or as a Kubernetes `kubernetes.io/tls` Secret.

use std::io::Write;
use std::path::Path;

use base64::Engine;

use crate::Issued;

/// File names inside an output folder, as Kubernetes TLS Secrets name their keys.
pub const CERT_FILE: &str = "tls.crt";
/// See [`CERT_FILE`].
pub const KEY_FILE: &str = "tls.key";
/// See [`CERT_FILE`].
pub const CA_FILE: &str = "ca.crt";

/// Writes `tls.crt`, `tls.key` (mode 0600) and `ca.crt` into `dir`, creating it.
///
/// Each file is written to a temporary name and renamed, so an agent following these files
/// never reads a half-written certificate.
pub fn write_files(dir: &Path, leaf: &Issued, ca_cert_pem: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_atomic(&dir.join(KEY_FILE), leaf.key_pem.as_bytes(), 0o600)?;
    write_atomic(&dir.join(CERT_FILE), leaf.cert_pem.as_bytes(), 0o644)?;
    write_atomic(&dir.join(CA_FILE), ca_cert_pem.as_bytes(), 0o644)
}

/// Writes one file atomically with the given Unix mode.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        let mut file = options.open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    std::fs::rename(tmp, path)
}

/// A `kubernetes.io/tls` Secret manifest (YAML) holding the leaf and the CA bundle.
pub fn secret_manifest(name: &str, namespace: &str, leaf: &Issued, ca_cert_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n    app.kubernetes.io/part-of: refract\ntype: kubernetes.io/tls\ndata:\n  {CERT_FILE}: {}\n  {KEY_FILE}: {}\n  {CA_FILE}: {}\n",
        b64(&leaf.cert_pem),
        b64(&leaf.key_pem),
        b64(ca_cert_pem)
    )
}

/// A Kubernetes CertificateSigningRequest for a tenant's client certificate (YAML), signed by
/// the provider's remote agent once approved (`kubectl certificate approve
/// refract-tenant-<cluster id>`). It holds the request only, never a key.
pub fn csr_manifest(cluster_id: &refract_shared::tls::ClusterId, request_pem: &str) -> String {
    let object = crate::request::request_object(cluster_id, request_pem);
    // A JSON value always has a YAML form.
    serde_yaml_ng::to_string(&object).unwrap_or_else(|_| object.to_string())
}
