//! What a kind's forge reads besides the object itself, indexed so that a change of it
//! re-queues only the objects that read it.
//!
//! An EndpointSlice's forge reads its Service (named by its `kubernetes.io/service-name`
//! label: the Service's policy decides the slice's) and the origin nodes its endpoints name
//! (endpoints on this peering's virtual nodes, and on nodes the origin does not have, are left
//! out). Finding a Service's slices by scanning the store cost a pass over every watched slice
//! per Service event; and a node that joins or leaves must re-forge the slices naming it, or
//! their endpoints stay as the node's absence or presence left them until the slice itself
//! changes.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Mutex;

use kube::Resource;
use refract_core::keys::SERVICE_NAME_LABEL;
use refract_core::lock::Locked;
use refract_core::options::Kind;

/// An object: namespace and name.
type ObjectKey = (String, String);

/// Whose Services are all in the local agent's store of origin Services: a slice is not forged
/// before its namespace's are, or its Service's policy would be read as absent.
#[derive(Debug, Clone, PartialEq)]
pub enum ServicesListed {
    /// Those of these namespaces (the Service reflector's, which watches the extended ones).
    In(BTreeSet<String>),
    /// Every namespace's (a watch of all Services, when Services are not reflected).
    Everywhere,
}

impl Default for ServicesListed {
    fn default() -> Self {
        Self::In(BTreeSet::new())
    }
}

impl ServicesListed {
    /// Whether `namespace`'s Services are all in.
    pub fn covers(&self, namespace: &str) -> bool {
        match self {
            Self::In(namespaces) => namespaces.contains(namespace),
            Self::Everywhere => true,
        }
    }
}

/// The objects of one kind that read others, by what they read.
pub struct Dependencies {
    /// By `(namespace, Service name)`.
    services: Index<(String, String)>,
    /// By node name.
    nodes: Index<String>,
}

impl Dependencies {
    /// The index for `kind`, if its forge reads anything besides the object.
    pub fn of(kind: Kind) -> Option<Self> {
        (kind == Kind::EndpointSlice).then(|| Self {
            services: Index::default(),
            nodes: Index::default(),
        })
    }

    /// `obj` is now as given (what it reads may have changed).
    pub fn applied<K: super::Reflectable>(&self, obj: &K) {
        let meta = obj.meta();
        let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) else {
            return;
        };
        let service = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
        let services = service.map(|s| (namespace.clone(), s.clone()));
        self.services
            .set(namespace, name, services.into_iter().collect());
        let nodes = obj
            .nodes_read_by_forge()
            .into_iter()
            .map(str::to_string)
            .collect();
        self.nodes.set(namespace, name, nodes);
    }

    /// `obj` is gone.
    pub fn deleted<K: Resource>(&self, obj: &K) {
        let meta = obj.meta();
        let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) else {
            return;
        };
        self.services.set(namespace, name, BTreeSet::new());
        self.nodes.set(namespace, name, BTreeSet::new());
    }

    /// Every object of `namespace` is gone from the store.
    pub fn forget_namespace(&self, namespace: &str) {
        self.services.forget_namespace(namespace);
        self.nodes.forget_namespace(namespace);
    }

    /// The names of `namespace`'s objects that follow its Service `service`.
    pub fn following(&self, namespace: &str, service: &str) -> Vec<String> {
        let group = (namespace.to_string(), service.to_string());
        let objects = self.services.objects(&group);
        objects.into_iter().map(|(_, name)| name).collect()
    }

    /// The objects (namespace, name) whose forge reads node `node`.
    pub fn on_node(&self, node: &str) -> Vec<(String, String)> {
        self.nodes.objects(&node.to_string())
    }
}

/// Objects by the values they read, both ways.
struct Index<V>(Mutex<Entries<V>>);

struct Entries<V> {
    objects_of: HashMap<V, BTreeSet<ObjectKey>>,
    values_of: HashMap<ObjectKey, BTreeSet<V>>,
}

impl<V> Default for Index<V> {
    fn default() -> Self {
        Self(Mutex::new(Entries {
            objects_of: HashMap::new(),
            values_of: HashMap::new(),
        }))
    }
}

impl<V: Clone + Eq + Hash + Ord> Index<V> {
    /// Object `namespace/name` now reads `values` (none: it leaves the index).
    fn set(&self, namespace: &str, name: &str, values: BTreeSet<V>) {
        let key = (namespace.to_string(), name.to_string());
        let mut entries = self.0.locked();
        match entries.values_of.get(&key) {
            Some(old) if *old == values => return,
            None if values.is_empty() => return,
            _ => {}
        }
        entries.remove(&key);
        if values.is_empty() {
            return;
        }
        for value in &values {
            let objects = entries.objects_of.entry(value.clone()).or_default();
            objects.insert(key.clone());
        }
        entries.values_of.insert(key, values);
    }

    fn forget_namespace(&self, namespace: &str) {
        let mut entries = self.0.locked();
        let gone: Vec<ObjectKey> = entries
            .values_of
            .keys()
            .filter(|(ns, _)| ns == namespace)
            .cloned()
            .collect();
        for key in gone {
            entries.remove(&key);
        }
    }

    fn objects(&self, value: &V) -> Vec<ObjectKey> {
        let entries = self.0.locked();
        let objects = entries.objects_of.get(value);
        objects
            .map(|o| o.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl<V: Eq + Hash> Entries<V> {
    fn remove(&mut self, key: &ObjectKey) {
        let Some(values) = self.values_of.remove(key) else {
            return;
        };
        for value in values {
            if let Some(objects) = self.objects_of.get_mut(&value) {
                objects.remove(key);
                if objects.is_empty() {
                    self.objects_of.remove(&value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
    use kube::api::ObjectMeta;

    use super::*;

    fn slice(namespace: &str, name: &str, service: Option<&str>, nodes: &[&str]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                labels: service
                    .map(|s| BTreeMap::from([(SERVICE_NAME_LABEL.to_string(), s.to_string())])),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: nodes
                .iter()
                .map(|n| Endpoint {
                    addresses: vec!["10.0.0.1".into()],
                    node_name: (!n.is_empty()).then(|| n.to_string()),
                    ..Default::default()
                })
                .collect(),
            ports: None,
        }
    }

    fn index() -> Dependencies {
        Dependencies::of(Kind::EndpointSlice).unwrap()
    }

    fn at(objects: &[(&str, &str)]) -> Vec<(String, String)> {
        objects
            .iter()
            .map(|(ns, n)| (ns.to_string(), n.to_string()))
            .collect()
    }

    #[test]
    fn services_are_listed_in_namespaces_or_everywhere() {
        assert!(!ServicesListed::default().covers("shop"));
        let some = ServicesListed::In(BTreeSet::from(["shop".to_string()]));
        assert!(some.covers("shop") && !some.covers("lab"));
        assert!(ServicesListed::Everywhere.covers("lab"));
    }

    #[test]
    fn only_endpointslices_read_other_objects() {
        assert!(Dependencies::of(Kind::ConfigMap).is_none());
        assert!(Dependencies::of(Kind::Service).is_none());
    }

    #[test]
    fn slices_are_found_by_their_service_in_their_namespace() {
        let deps = index();
        deps.applied(&slice("shop", "web-1", Some("web"), &[]));
        deps.applied(&slice("shop", "web-2", Some("web"), &[]));
        deps.applied(&slice("shop", "db-1", Some("db"), &[]));
        deps.applied(&slice("lab", "web-1", Some("web"), &[]));
        deps.applied(&slice("shop", "unlabelled", None, &[]));
        assert_eq!(deps.following("shop", "web"), vec!["web-1", "web-2"]);
        assert_eq!(deps.following("lab", "web"), vec!["web-1"]);
        assert!(deps.following("other", "web").is_empty());
    }

    #[test]
    fn slices_are_found_by_every_node_their_endpoints_name() {
        let deps = index();
        deps.applied(&slice("shop", "web-1", Some("web"), &["a", "b", "a", ""]));
        deps.applied(&slice("lab", "api-1", Some("api"), &["b"]));
        assert_eq!(deps.on_node("a"), at(&[("shop", "web-1")]));
        assert_eq!(
            deps.on_node("b"),
            at(&[("lab", "api-1"), ("shop", "web-1")])
        );
        assert!(deps.on_node("c").is_empty());
        // The endpoints moved off node a.
        deps.applied(&slice("shop", "web-1", Some("web"), &["b", "c"]));
        assert!(deps.on_node("a").is_empty());
        assert_eq!(deps.on_node("c"), at(&[("shop", "web-1")]));
    }

    #[test]
    fn a_changed_slice_moves_and_a_deleted_one_leaves_nothing_behind() {
        let deps = index();
        deps.applied(&slice("shop", "s", Some("web"), &["a"]));
        deps.applied(&slice("shop", "s", Some("api"), &["a"]));
        assert!(deps.following("shop", "web").is_empty());
        assert_eq!(deps.following("shop", "api"), vec!["s"]);
        deps.applied(&slice("shop", "s", None, &[]));
        assert!(deps.following("shop", "api").is_empty() && deps.on_node("a").is_empty());
        deps.applied(&slice("shop", "s", Some("api"), &["a"]));
        deps.deleted(&slice("shop", "s", None, &[]));
        deps.deleted(&slice("shop", "never-seen", None, &[]));
        for entries in [
            &deps.services.0.locked().values_of.len(),
            &deps.nodes.0.locked().values_of.len(),
        ] {
            assert_eq!(*entries, 0);
        }
        assert!(deps.services.0.locked().objects_of.is_empty());
        assert!(deps.nodes.0.locked().objects_of.is_empty());
    }

    #[test]
    fn a_namespace_no_longer_watched_is_forgotten_whole() {
        let deps = index();
        deps.applied(&slice("shop", "web-1", Some("web"), &["a"]));
        deps.applied(&slice("lab", "web-1", Some("web"), &["a"]));
        deps.forget_namespace("shop");
        assert!(deps.following("shop", "web").is_empty());
        assert_eq!(deps.following("lab", "web"), vec!["web-1"]);
        assert_eq!(deps.on_node("a"), at(&[("lab", "web-1")]));
        assert_eq!(deps.nodes.0.locked().values_of.len(), 1);
    }
}
