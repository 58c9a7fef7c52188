//! Matching a Kubernetes NodeSelector against a set of labels (the virtual node's).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};

/// Whether `labels` satisfy `selector`: terms are ORed, expressions within a term ANDed. A
/// selector without terms selects everything. `matchFields` cannot be evaluated on labels and
/// makes a term fail.
pub fn matches(selector: Option<&NodeSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    if selector.node_selector_terms.is_empty() {
        return true;
    }
    selector.node_selector_terms.iter().any(|term| {
        term.match_fields.as_ref().is_none_or(|f| f.is_empty())
            && term
                .match_expressions
                .iter()
                .flatten()
                .all(|r| requirement_matches(r, labels))
    })
}

fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(json: serde_json::Value) -> NodeSelector {
        serde_json::from_value(json).unwrap()
    }

    fn labels() -> BTreeMap<String, String> {
        [
            ("liqo.io/type", "virtual-node"),
            ("region", "eu"),
            ("gpus", "4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
    }

    #[test]
    fn empty_selects_all() {
        assert!(matches(None, &labels()));
        assert!(matches(
            Some(&selector(serde_json::json!({"nodeSelectorTerms": []}))),
            &labels()
        ));
    }

    #[test]
    fn terms_or_expressions_and() {
        let s = selector(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "region", "operator": "In", "values": ["us"]}]},
            {"matchExpressions": [
                {"key": "region", "operator": "In", "values": ["eu"]},
                {"key": "gpus", "operator": "Gt", "values": ["2"]},
                {"key": "zone", "operator": "DoesNotExist"}
            ]}
        ]}));
        assert!(matches(Some(&s), &labels()));
        let s = selector(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["eu"]}]}
        ]}));
        assert!(!matches(Some(&s), &labels()));
    }
}
