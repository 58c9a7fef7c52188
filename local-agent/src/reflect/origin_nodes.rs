//! The origin's nodes, as the EndpointSlice forge asks about them, and which of their changes
//! must forge slices again.
//!
//! A slice's endpoints name the nodes their pods run on. Building the sets of every origin node
//! and of this peering's virtual nodes for each slice cost a pass over all the origin's nodes
//! per slice; looking up the nodes the endpoints name costs a lookup each.

use std::collections::HashMap;
use std::fmt;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use refract_core::forge::{NodeSite, Nodes};
use refract_core::keys::REMOTE_CLUSTER_ID_LABEL;

/// The origin's nodes in the local agent's watch of them.
pub struct OriginNodes<'a> {
    /// The watch's store of origin nodes.
    pub store: &'a Store<Node>,
    /// The provider's cluster ID: the virtual nodes of this peering carry it as
    /// [`REMOTE_CLUSTER_ID_LABEL`].
    pub remote_cluster_id: &'a str,
}

impl Nodes for OriginNodes<'_> {
    fn site(&self, name: &str) -> NodeSite {
        match self.store.get(&ObjectRef::new(name)) {
            None => NodeSite::Unknown,
            Some(node) if cluster_of(&node) == Some(self.remote_cluster_id) => NodeSite::Provider,
            Some(_) => NodeSite::Origin,
        }
    }
}

/// What the forge reads of each origin node (that it exists, and its
/// [`REMOTE_CLUSTER_ID_LABEL`]), as the node watch last told it: which nodes' slices must be
/// forged again after an event.
#[derive(Default)]
pub struct NodeSites {
    /// Node name → its cluster label.
    known: HashMap<String, Option<String>>,
    /// A listing under way: the nodes it has given so far.
    listing: Option<HashMap<String, Option<String>>>,
}

impl NodeSites {
    /// Takes one event of the node watch, after its store has; returns the nodes whose site
    /// may have changed. A listing is compared whole when it ends, as the store swaps it in
    /// then: forging against the store in mid-listing would read the old nodes.
    pub fn changed(&mut self, event: &watcher::Event<Node>) -> Vec<String> {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(node) => {
                let listing = self.listing.get_or_insert_with(HashMap::new);
                listing.insert(name_of(node), cluster_of(node).map(str::to_string));
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.known, listed);
                let mut changed: Vec<String> = old
                    .iter()
                    .filter(|(name, cluster)| self.known.get(*name) != Some(*cluster))
                    .map(|(name, _)| name.clone())
                    .collect();
                changed.extend(
                    self.known
                        .keys()
                        .filter(|name| !old.contains_key(*name))
                        .cloned(),
                );
                changed
            }
            watcher::Event::Apply(node) => {
                let name = name_of(node);
                let cluster = cluster_of(node).map(str::to_string);
                match self.known.insert(name.clone(), cluster.clone()) {
                    Some(old) if old == cluster => Vec::new(),
                    _ => vec![name],
                }
            }
            watcher::Event::Delete(node) => {
                let name = name_of(node);
                match self.known.remove(&name) {
                    Some(_) => vec![name],
                    None => Vec::new(),
                }
            }
        }
    }
}

fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// The peering a virtual node belongs to: its provider's cluster ID.
fn cluster_of(node: &Node) -> Option<&str> {
    let labels = node.metadata.labels.as_ref()?;
    labels.get(REMOTE_CLUSTER_ID_LABEL).map(String::as_str)
}

impl fmt::Debug for OriginNodes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OriginNodes")
            .field("nodes", &self.store.len())
            .field("remote_cluster_id", &self.remote_cluster_id)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::api::ObjectMeta;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    use super::*;

    fn node(name: &str, cluster: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: cluster
                    .map(|c| BTreeMap::from([(REMOTE_CLUSTER_ID_LABEL.into(), c.into())])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn nodes_are_the_providers_the_origins_or_unknown() {
        let (reader, mut writer) = store::<Node>();
        for n in [
            node("worker-1", None),
            node("refract-provider", Some("provider")),
            node("refract-other", Some("other-provider")),
        ] {
            writer.apply_watcher_event(&Event::Apply(n));
        }
        let nodes = OriginNodes {
            store: &reader,
            remote_cluster_id: "provider",
        };
        assert_eq!(nodes.site("refract-provider"), NodeSite::Provider);
        assert_eq!(nodes.site("worker-1"), NodeSite::Origin);
        // Another peering's virtual node: its pods are not on this provider.
        assert_eq!(nodes.site("refract-other"), NodeSite::Origin);
        assert_eq!(nodes.site("gone"), NodeSite::Unknown);
    }

    fn sorted(mut names: Vec<String>) -> Vec<String> {
        names.sort();
        names
    }

    #[test]
    fn a_listing_is_compared_whole_when_it_ends() {
        let mut sites = NodeSites::default();
        assert!(sites.changed(&Event::Init).is_empty());
        assert!(sites.changed(&Event::InitApply(node("a", None))).is_empty());
        assert!(sites.changed(&Event::InitApply(node("b", None))).is_empty());
        assert_eq!(sorted(sites.changed(&Event::InitDone)), vec!["a", "b"]);
        // A relist: a is gone, b became this peering's, c is new.
        sites.changed(&Event::Init);
        sites.changed(&Event::InitApply(node("b", Some("provider"))));
        sites.changed(&Event::InitApply(node("c", None)));
        assert_eq!(sorted(sites.changed(&Event::InitDone)), vec!["a", "b", "c"]);
        // The same listing again changes nothing.
        sites.changed(&Event::Init);
        sites.changed(&Event::InitApply(node("b", Some("provider"))));
        sites.changed(&Event::InitApply(node("c", None)));
        assert!(sites.changed(&Event::InitDone).is_empty());
    }

    #[test]
    fn a_node_joining_leaving_or_relabelled_changes_its_site_and_nothing_else_does() {
        let mut sites = NodeSites::default();
        assert_eq!(sites.changed(&Event::Apply(node("a", None))), vec!["a"]);
        // A status update: same site.
        assert!(sites.changed(&Event::Apply(node("a", None))).is_empty());
        assert_eq!(
            sites.changed(&Event::Apply(node("a", Some("provider")))),
            vec!["a"]
        );
        assert_eq!(sites.changed(&Event::Delete(node("a", None))), vec!["a"]);
        assert!(sites.changed(&Event::Delete(node("a", None))).is_empty());
    }
}
