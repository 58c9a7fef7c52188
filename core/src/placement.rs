//! Where pods of an extended namespace may be scheduled: the toleration and node affinity the
//! admission webhook gives them, so the stock scheduler places them as the namespace's
//! `podOffloadingStrategy` and `clusterSelector` say.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    Toleration,
};

use crate::keys::{VIRTUAL_NODE_TAINT_KEY, VIRTUAL_NODE_TYPE, VIRTUAL_NODE_TYPE_LABEL};

/// Where pods may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Origin nodes only: nothing to add.
    Local,
    /// Virtual nodes selected by the cluster selector only.
    Remote,
    /// Origin nodes, or the selected virtual nodes.
    LocalAndRemote,
}

/// Adds the virtual-node toleration and the required node affinity to `spec`. Returns whether
/// anything changed.
pub fn apply(spec: &mut PodSpec, strategy: Strategy, selector: Option<&NodeSelector>) -> bool {
    if strategy == Strategy::Local {
        return false;
    }
    let mut changed = false;
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations
        .iter()
        .any(|t| t.key.as_deref() == Some(VIRTUAL_NODE_TAINT_KEY))
    {
        tolerations.push(Toleration {
            key: Some(VIRTUAL_NODE_TAINT_KEY.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        });
        changed = true;
    }
    let Some(imposed) = imposed_terms(strategy, selector) else {
        return changed;
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let existing = node_affinity
        .required_during_scheduling_ignored_during_execution
        .take()
        .map(|s| s.node_selector_terms)
        .unwrap_or_default();
    let terms = if existing.is_empty() {
        imposed
    } else {
        // Both must hold: every combination of an existing term and an imposed one.
        existing
            .iter()
            .flat_map(|e| {
                imposed.iter().map(move |i| NodeSelectorTerm {
                    match_expressions: Some(
                        e.match_expressions
                            .iter()
                            .flatten()
                            .chain(i.match_expressions.iter().flatten())
                            .cloned()
                            .collect(),
                    ),
                    match_fields: None,
                })
            })
            .collect()
    };
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: terms,
    });
    true
}

fn requirement(operator: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: VIRTUAL_NODE_TYPE_LABEL.into(),
        operator: operator.into(),
        values: Some(vec![VIRTUAL_NODE_TYPE.into()]),
    }
}

/// The node selector terms a strategy imposes, or `None` for no constraint.
fn imposed_terms(
    strategy: Strategy,
    selector: Option<&NodeSelector>,
) -> Option<Vec<NodeSelectorTerm>> {
    let selected: Vec<NodeSelectorTerm> = selector
        .map(|s| s.node_selector_terms.clone())
        .unwrap_or_default();
    match strategy {
        Strategy::Local => None,
        Strategy::Remote => {
            let base = if selected.is_empty() {
                vec![NodeSelectorTerm::default()]
            } else {
                selected
            };
            Some(
                base.into_iter()
                    .map(|mut t| {
                        t.match_expressions
                            .get_or_insert_with(Vec::new)
                            .push(requirement("In"));
                        t
                    })
                    .collect(),
            )
        }
        // Any origin node, or a virtual node the selector picks.
        Strategy::LocalAndRemote if selected.is_empty() => None,
        Strategy::LocalAndRemote => {
            let mut terms = selected;
            terms.push(NodeSelectorTerm {
                match_expressions: Some(vec![requirement("NotIn")]),
                match_fields: None,
            });
            Some(terms)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> PodSpec {
        serde_json::from_value(json).unwrap()
    }

    fn required(s: &PodSpec) -> serde_json::Value {
        serde_json::to_value(
            &s.affinity
                .as_ref()
                .unwrap()
                .node_affinity
                .as_ref()
                .unwrap()
                .required_during_scheduling_ignored_during_execution,
        )
        .unwrap()
    }

    #[test]
    fn local_changes_nothing() {
        let mut s = spec(serde_json::json!({"containers": []}));
        assert!(!apply(&mut s, Strategy::Local, None));
        assert!(s.tolerations.is_none() && s.affinity.is_none());
    }

    #[test]
    fn remote_requires_a_virtual_node() {
        let mut s = spec(serde_json::json!({"containers": []}));
        assert!(apply(&mut s, Strategy::Remote, None));
        assert_eq!(
            s.tolerations.as_ref().unwrap()[0].key.as_deref(),
            Some(VIRTUAL_NODE_TAINT_KEY)
        );
        assert_eq!(
            required(&s),
            serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}]}]})
        );
        // Idempotent toleration.
        apply(&mut s, Strategy::Remote, None);
        assert_eq!(s.tolerations.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn local_and_remote_with_selector_allows_origin_nodes_or_selected_virtual_nodes() {
        let selector: NodeSelector =
            serde_json::from_value(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]}]}))
            .unwrap();
        let mut s = spec(serde_json::json!({"containers": []}));
        apply(&mut s, Strategy::LocalAndRemote, Some(&selector));
        assert_eq!(
            required(&s)["nodeSelectorTerms"].as_array().unwrap().len(),
            2
        );
        assert_eq!(
            required(&s)["nodeSelectorTerms"][1]["matchExpressions"][0]["operator"],
            "NotIn"
        );
        let mut plain = spec(serde_json::json!({"containers": []}));
        apply(&mut plain, Strategy::LocalAndRemote, None);
        assert!(plain.affinity.is_none(), "no selector: any node");
    }

    #[test]
    fn existing_required_affinity_is_combined() {
        let mut s = spec(
            serde_json::json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}}),
        );
        apply(&mut s, Strategy::Remote, None);
        let exprs = &required(&s)["nodeSelectorTerms"][0]["matchExpressions"];
        assert_eq!(exprs.as_array().unwrap().len(), 2);
        assert_eq!(exprs[0]["key"], "disk");
        assert_eq!(exprs[1]["key"], "liqo.io/type");
    }
}
