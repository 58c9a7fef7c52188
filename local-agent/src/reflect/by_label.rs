//! A reflector's objects grouped by one label's value, per namespace.
//!
//! EndpointSlices follow their Service (its policy decides theirs): every change of a Service
//! re-queues its slices. Finding them by scanning the store cost a pass over every watched
//! slice, with a namespace string copied for each, per Service event: quadratic in the
//! Services of a relist. The watch keeps this index instead, so a Service event costs the
//! lookup of its own slices.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use refract_shared::lock::Locked;

/// `(namespace, label value)` → names, and each indexed object's label value.
#[derive(Default)]
struct Groups {
    members: HashMap<(String, String), BTreeSet<String>>,
    value_of: HashMap<(String, String), String>,
}

/// Objects grouped by the value of `label`.
pub struct ByLabel {
    label: &'static str,
    groups: Mutex<Groups>,
}

impl ByLabel {
    /// An empty index of `label`.
    pub fn new(label: &'static str) -> Self {
        Self {
            label,
            groups: Mutex::default(),
        }
    }

    /// Object `namespace/name` is now labelled as `labels` say (it may have moved group).
    pub fn applied(
        &self,
        namespace: &str,
        name: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) {
        let value = labels.and_then(|l| l.get(self.label));
        let mut groups = self.groups.locked();
        let key = (namespace.to_string(), name.to_string());
        if groups.value_of.get(&key) == value {
            return;
        }
        groups.remove(&key);
        if let Some(value) = value {
            groups
                .members
                .entry((namespace.to_string(), value.clone()))
                .or_default()
                .insert(name.to_string());
            groups.value_of.insert(key, value.clone());
        }
    }

    /// Object `namespace/name` is gone.
    pub fn deleted(&self, namespace: &str, name: &str) {
        self.groups
            .locked()
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Every object of `namespace` is gone from the store.
    pub fn forget_namespace(&self, namespace: &str) {
        let mut groups = self.groups.locked();
        groups.members.retain(|(ns, _), _| ns != namespace);
        groups.value_of.retain(|(ns, _), _| ns != namespace);
    }

    /// The names of `namespace`'s objects labelled `value`.
    pub fn names(&self, namespace: &str, value: &str) -> Vec<String> {
        let groups = self.groups.locked();
        groups
            .members
            .get(&(namespace.to_string(), value.to_string()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Groups {
    fn remove(&mut self, key: &(String, String)) {
        let Some(value) = self.value_of.remove(key) else {
            return;
        };
        let group = (key.0.clone(), value);
        if let Some(names) = self.members.get_mut(&group) {
            names.remove(&key.1);
            if names.is_empty() {
                self.members.remove(&group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const LABEL: &str = "kubernetes.io/service-name";

    fn labelled(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(LABEL.to_string(), value.to_string())])
    }

    #[test]
    fn objects_are_found_by_namespace_and_label_value() {
        let index = ByLabel::new(LABEL);
        index.applied("shop", "web-1", Some(&labelled("web")));
        index.applied("shop", "web-2", Some(&labelled("web")));
        index.applied("shop", "db-1", Some(&labelled("db")));
        index.applied("lab", "web-1", Some(&labelled("web")));
        index.applied("shop", "unlabelled", None);
        assert_eq!(index.names("shop", "web"), vec!["web-1", "web-2"]);
        assert_eq!(index.names("lab", "web"), vec!["web-1"]);
        assert!(index.names("shop", "unlabelled").is_empty());
        assert!(index.names("other", "web").is_empty());
    }

    #[test]
    fn a_relabelled_object_moves_and_a_deleted_one_leaves_nothing_behind() {
        let index = ByLabel::new(LABEL);
        index.applied("shop", "s", Some(&labelled("web")));
        index.applied("shop", "s", Some(&labelled("api")));
        assert!(index.names("shop", "web").is_empty());
        assert_eq!(index.names("shop", "api"), vec!["s"]);
        index.applied("shop", "s", Some(&BTreeMap::new()));
        assert!(index.names("shop", "api").is_empty());
        index.applied("shop", "s", Some(&labelled("api")));
        index.deleted("shop", "s");
        index.deleted("shop", "never-seen");
        let groups = index.groups.locked();
        assert!(groups.members.is_empty() && groups.value_of.is_empty());
    }

    #[test]
    fn a_namespace_no_longer_watched_is_forgotten_whole() {
        let index = ByLabel::new(LABEL);
        index.applied("shop", "web-1", Some(&labelled("web")));
        index.applied("lab", "web-1", Some(&labelled("web")));
        index.forget_namespace("shop");
        assert!(index.names("shop", "web").is_empty());
        assert_eq!(index.names("lab", "web"), vec!["web-1"]);
        assert_eq!(index.groups.locked().value_of.len(), 1);
    }
}
