//! ConfigMaps: reflected verbatim (data, binaryData, immutable); the root CA is renamed.

use k8s_openapi::api::core::v1::ConfigMap;

use super::meta::{name_of, remote_meta};
use super::{reflect, Context, Decision, ForgeError};
use crate::options::Kind;

/// The ConfigMap every namespace gets with the cluster's root CA.
pub const ROOT_CA_NAME: &str = "kube-root-ca.crt";

/// Whether this is the origin's root CA ConfigMap.
pub fn is_root_ca(cm: &ConfigMap) -> bool {
    cm.metadata.name.as_deref() == Some(ROOT_CA_NAME)
}

/// The provider name of the origin's root CA ConfigMap: the provider has its own
/// `kube-root-ca.crt`, so the origin's is suffixed with the first five characters of the
/// origin's cluster id (an `a` appended if that ends in a non-alphanumeric character).
pub fn remote_root_ca_name(local_cluster_id: &str) -> String {
    let prefix: String = local_cluster_id.chars().take(5).collect();
    let mut name = format!("{ROOT_CA_NAME}.{prefix}");
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        name.push('a');
    }
    name
}

/// Forges a ConfigMap.
pub fn forge(cm: &ConfigMap, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
    let name = name_of(&cm.metadata, "ConfigMap")?;
    let remote_name = if is_root_ca(cm) {
        remote_root_ca_name(&ctx.options.local_cluster_id)
    } else {
        name.to_string()
    };
    let out = ConfigMap {
        metadata: remote_meta(&cm.metadata, &remote_name, ctx),
        data: cm.data.clone(),
        binary_data: cm.binary_data.clone(),
        immutable: cm.immutable,
    };
    Ok(reflect(
        Kind::ConfigMap,
        ctx.remote_namespace,
        &remote_name,
        &out,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_ca_names() {
        assert_eq!(
            remote_root_ca_name("local-cluster-id"),
            "kube-root-ca.crt.local"
        );
        assert_eq!(remote_root_ca_name("abcd-xyz"), "kube-root-ca.crt.abcd-a");
        assert_eq!(remote_root_ca_name("ab"), "kube-root-ca.crt.ab");
    }
}
