//! Namespace extension rules: whether a namespace is extended to a peer, and under which name.

use std::collections::BTreeMap;

use crate::keys::{REMOTE_CLUSTER_ID_LABEL, VIRTUAL_NODE_TYPE, VIRTUAL_NODE_TYPE_LABEL};
use k8s_openapi::api::core::v1::NodeSelector;

/// How the twin namespace on the provider is named.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub enum MappingStrategy {
    /// `<local namespace>-<local cluster id>`, cut to 63 characters.
    #[default]
    DefaultName,
    /// The same name as the local namespace.
    EnforceSameName,
    /// The name in `remoteNamespaceName`.
    SelectedName,
}

/// The twin namespace's name, or why there is none.
pub fn remote_namespace_name(
    strategy: MappingStrategy,
    selected: Option<&str>,
    local_namespace: &str,
    local_cluster_id: &str,
) -> Result<String, String> {
    match strategy {
        MappingStrategy::EnforceSameName => Ok(local_namespace.to_string()),
        MappingStrategy::DefaultName => {
            let mut name = format!("{local_namespace}-{local_cluster_id}");
            name.truncate(63);
            Ok(name.trim_end_matches('-').to_string())
        }
        MappingStrategy::SelectedName => match selected {
            Some(n) if !n.is_empty() => Ok(n.to_string()),
            _ => Err("namespaceMappingStrategy SelectedName needs remoteNamespaceName".into()),
        },
    }
}

/// The labels a peer's virtual node carries, for cluster selectors.
pub fn virtual_node_labels(
    remote_cluster_id: &str,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = extra.clone();
    labels.insert(VIRTUAL_NODE_TYPE_LABEL.into(), VIRTUAL_NODE_TYPE.into());
    labels.insert(REMOTE_CLUSTER_ID_LABEL.into(), remote_cluster_id.into());
    labels
}

/// Whether a namespace whose NamespaceOffloading has `selector` is extended to the peer whose
/// virtual node has `labels`.
pub fn is_selected(selector: Option<&NodeSelector>, labels: &BTreeMap<String, String>) -> bool {
    crate::selector::matches(selector, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let n = |s, sel, ns| remote_namespace_name(s, sel, ns, "origin");
        assert_eq!(
            n(MappingStrategy::DefaultName, None, "shop").unwrap(),
            "shop-origin"
        );
        assert_eq!(
            n(MappingStrategy::EnforceSameName, None, "shop").unwrap(),
            "shop"
        );
        assert_eq!(
            n(MappingStrategy::SelectedName, Some("elsewhere"), "shop").unwrap(),
            "elsewhere"
        );
        assert!(n(MappingStrategy::SelectedName, None, "shop").is_err());
        let long = "x".repeat(60);
        assert_eq!(
            n(MappingStrategy::DefaultName, None, &long).unwrap(),
            format!("{long}-or")
        );
        let longer = "y".repeat(62);
        assert_eq!(
            n(MappingStrategy::DefaultName, None, &longer).unwrap(),
            longer
        );
    }
}
