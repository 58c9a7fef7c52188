//! Node labels a provider suggests for its virtual node.
//!
//! They go onto an origin Node, where a single invalid key would make the whole heartbeat
//! patch fail, and where some keys mean something to the origin's control plane. A suggestion
//! is kept only when its key and value are valid Kubernetes label syntax and its key is not in
//! a namespace Kubernetes reserves for itself (the kubelet's own allowlist excepted, as the
//! NodeRestriction admission plugin has it); at most [`MAX_NODE_LABELS`] are kept.

use std::collections::BTreeMap;

/// The most labels a provider may add to its virtual node.
pub const MAX_NODE_LABELS: usize = 64;

/// Keys in Kubernetes' own namespaces that a kubelet may set on its Node.
const KUBELET_ALLOWED: &[&str] = &[
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];
/// Prefixes in Kubernetes' own namespaces that a kubelet may set.
const KUBELET_ALLOWED_PREFIXES: &[&str] = &["kubelet.kubernetes.io/", "node.kubernetes.io/"];

/// The labels kept, and a reason for each one refused.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeLabels {
    /// Valid suggestions.
    pub kept: BTreeMap<String, String>,
    /// `key: reason` for every suggestion dropped.
    pub refused: Vec<String>,
}

/// Filters a provider's suggested node labels.
pub fn node_labels(suggested: &BTreeMap<String, String>) -> NodeLabels {
    let mut out = NodeLabels::default();
    for (key, value) in suggested {
        let refused = if !is_qualified_name(key) {
            Some("not a valid label key")
        } else if !is_label_value(value) {
            Some("its value is not a valid label value")
        } else if is_reserved_key(key) {
            Some("Kubernetes reserves this key")
        } else if out.kept.len() >= MAX_NODE_LABELS {
            Some("over the limit of labels a provider may suggest")
        } else {
            None
        };
        match refused {
            Some(reason) => out
                .refused
                .push(format!("{}: {reason}", super::excerpt(key))),
            None => {
                out.kept.insert(key.clone(), value.clone());
            }
        }
    }
    out
}

fn is_reserved_key(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    let reserved = ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
    reserved
        && !KUBELET_ALLOWED.contains(&key)
        && !KUBELET_ALLOWED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// A label key or resource name: an optional DNS subdomain prefix and `/`, then a name of at
/// most 63 characters, alphanumeric at both ends, `-`, `_` and `.` inside.
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

/// A label value: empty, or at most 63 characters, alphanumeric at both ends, `-`, `_` and `.`
/// inside.
pub fn is_label_value(value: &str) -> bool {
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    value.is_empty()
        || (value.len() <= 63
            && value.chars().all(inner)
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// An RFC 1123 subdomain: lower-case labels joined by dots, at most 253 characters.
pub fn is_dns_subdomain(name: &str) -> bool {
    let label = |l: &str| {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        (1..=63).contains(&l.len())
            && l.chars().all(|c| alnum(c) || c == '-')
            && l.starts_with(alnum)
            && l.ends_with(alnum)
    };
    (1..=253).contains(&name.len()) && name.split('.').all(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::string_map as suggest;

    #[test]
    fn keeps_valid_labels_and_says_why_others_are_dropped() {
        let labels = node_labels(&suggest(&[
            ("provider.example/gpu", "a100"),
            ("topology.kubernetes.io/zone", "eu-1"),
            ("node.kubernetes.io/instance-type", "m5.large"),
            ("team", ""),
            ("Bad Key", "x"),
            ("ok", "not valid!"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("kubernetes.io/hostname", "evil"),
            ("x.k8s.io/y", "z"),
            ("UPPER.example/x", "y"),
        ]));
        assert_eq!(
            labels.kept.keys().collect::<Vec<_>>(),
            [
                "node.kubernetes.io/instance-type",
                "provider.example/gpu",
                "team",
                "topology.kubernetes.io/zone"
            ]
        );
        assert_eq!(labels.refused.len(), 6, "{:?}", labels.refused);
        assert!(labels
            .refused
            .iter()
            .any(|r| r == "Bad Key: not a valid label key"));
        assert!(labels
            .refused
            .iter()
            .any(|r| r.starts_with("node-role.kubernetes.io/control-plane: Kubernetes reserves")));
    }

    #[test]
    fn keeps_at_most_the_limit() {
        let many: BTreeMap<String, String> = (0..1000)
            .map(|i| (format!("l{i:04}"), "v".to_string()))
            .collect();
        let labels = node_labels(&many);
        assert_eq!(labels.kept.len(), MAX_NODE_LABELS);
        assert_eq!(labels.refused.len(), 1000 - MAX_NODE_LABELS);
    }

    #[test]
    fn label_syntax() {
        assert!(is_qualified_name("a"));
        assert!(is_qualified_name("example.com/a-b_c.d"));
        assert!(!is_qualified_name("/a"));
        assert!(!is_qualified_name("a/"));
        assert!(!is_qualified_name("a/b/c"));
        assert!(!is_qualified_name(&"a".repeat(64)));
        assert!(is_qualified_name(&"a".repeat(63)));
        assert!(!is_qualified_name("-a"));
        assert!(is_label_value(""));
        assert!(!is_label_value("a-"));
        assert!(!is_label_value("é"));
    }
}
