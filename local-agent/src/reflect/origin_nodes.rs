//! The origin's nodes, as the EndpointSlice forge asks about them.
//!
//! A slice's endpoints name the nodes their pods run on. Building the sets of every origin node
//! and of this peering's virtual nodes for each slice cost a pass over all the origin's nodes
//! per slice; looking up the nodes the endpoints name costs a lookup each.

use std::fmt;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};
use refract_shared::forge::{NodeSite, Nodes};
use refract_shared::keys::REMOTE_CLUSTER_ID_LABEL;

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
            Some(node) => {
                let labels = node.metadata.labels.as_ref();
                let cluster = labels.and_then(|l| l.get(REMOTE_CLUSTER_ID_LABEL));
                if cluster.map(String::as_str) == Some(self.remote_cluster_id) {
                    NodeSite::Provider
                } else {
                    NodeSite::Origin
                }
            }
        }
    }
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
}
