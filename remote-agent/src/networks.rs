//! The provider's own networks, which no tenant EndpointSlice may point into: those
//! `--provider-cidr` names, and those the remote agent discovers itself, so a provider that sets
//! no flag is still fenced: every node's addresses and pod ranges, and the API server's Service
//! address (`kubernetes.default`). They are read once at start, logged, and followed as nodes
//! come and go (from the node watch capacity keeps, not a watch of their own).
//!
//! The Service range itself is not published by Kubernetes 1.20's API: `--provider-cidr`
//! adds it (and anything else the provider wants fenced).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use refract_core::lock::RwLocked;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::policy::ProviderNetworks;

/// The networks every tenant write is judged against; the discovery keeps them current.
pub type SharedNetworks = Arc<RwLock<ProviderNetworks>>;

/// The node addresses and pod ranges of `nodes`, and `api_service` (the `kubernetes` Service's
/// address), each as a network.
pub fn discovered<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    api_service: Option<IpAddr>,
) -> BTreeSet<IpNet> {
    let mut networks: BTreeSet<IpNet> = api_service.map(IpNet::from).into_iter().collect();
    for node in nodes {
        let spec = node.spec.as_ref();
        let ranges = spec
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(spec.and_then(|s| s.pod_cidr.clone()));
        networks.extend(ranges.filter_map(|r| r.parse::<IpNet>().ok()));
        let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
        networks.extend(
            addresses
                .into_iter()
                .flatten()
                .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                .filter_map(|a| a.address.parse::<IpAddr>().ok())
                .map(IpNet::from),
        );
    }
    networks
}

/// `base` (the flags') and `found`, in that order, without repeats.
fn merged(base: &[IpNet], found: &BTreeSet<IpNet>) -> Vec<IpNet> {
    let mut all = base.to_vec();
    all.extend(found.iter().filter(|n| !base.contains(n)));
    all
}

/// The `kubernetes` Service's cluster IP, if it can be read.
async fn api_service_ip(client: &kube::Client) -> Option<IpAddr> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    match services.get_opt("kubernetes").await {
        Ok(service) => service?.spec?.cluster_ip?.parse().ok(),
        Err(error) => {
            tracing::warn!(%error, "cannot read the API server's Service (default/kubernetes); add its address with --provider-cidr");
            None
        }
    }
}

/// Discovers the provider's networks once, sets them beside `base` in `shared`, and logs them.
/// An API that cannot be read leaves the flags' networks alone in force, and says so.
pub async fn discover(
    client: &kube::Client,
    base: &[IpNet],
    shared: &SharedNetworks,
) -> Option<IpAddr> {
    let api_service = api_service_ip(client).await;
    let nodes = match Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            tracing::warn!(%error, "cannot list the provider's nodes; their addresses and pod ranges are fenced once the node watch has them");
            Vec::new()
        }
    };
    let found = discovered(&nodes, api_service);
    tracing::info!(
        flags = ?base.iter().map(ToString::to_string).collect::<Vec<_>>(),
        discovered = ?found.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "no tenant EndpointSlice may point into the provider's own networks, nor any tenant pod reach them: these (node addresses, pod ranges, the API server's Service); add others, such as the Service range, with --provider-cidr"
    );
    let pod_ranges_published = nodes.iter().any(|n| {
        n.spec.as_ref().is_some_and(|s| {
            s.pod_cidr.is_some() || s.pod_cidrs.as_ref().is_some_and(|c| !c.is_empty())
        })
    });
    if !pod_ranges_published && base.is_empty() {
        tracing::warn!("no node publishes its pod range (spec.podCIDR) and no --provider-cidr is given: tenants' network fences cannot deny the provider's pod and Service networks; name them with --provider-cidr");
    }
    shared.write_locked().cidrs = merged(base, &found);
    api_service
}

/// Keeps `shared` current as the nodes in `nodes` change (`changed` ticks with each change).
/// `networks_changed` is told each time they change (the twin namespaces' network fences
/// deny them).
pub fn follow(
    nodes: Store<Node>,
    mut changed: watch::Receiver<u64>,
    base: Vec<IpNet>,
    api_service: Option<IpAddr>,
    shared: SharedNetworks,
    networks_changed: Arc<tokio::sync::Notify>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = changed.changed() => if changed.is_err() { return },
            }
            let state = nodes.state();
            let found = discovered(state.iter().map(|n| n.as_ref()), api_service);
            let next = merged(&base, &found);
            let mut current = shared.write_locked();
            if current.cidrs != next {
                tracing::info!(networks = ?next.iter().map(ToString::to_string).collect::<Vec<_>>(), "the provider's own networks changed with its nodes");
                current.cidrs = next;
                networks_changed.notify_one();
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_node(pod_cidr: &str, addresses: &[(&str, &str)]) -> Node {
        let addresses: Vec<_> = addresses
            .iter()
            .map(|(t, a)| json!({"type": t, "address": a}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
            "status": {"addresses": addresses},
        }))
        .unwrap()
    }

    fn shown(networks: &BTreeSet<IpNet>) -> Vec<String> {
        networks.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn nodes_addresses_pod_ranges_and_the_api_service_are_the_providers() {
        let nodes = [
            mk_node(
                "10.244.0.0/24",
                &[
                    ("InternalIP", "192.168.1.10"),
                    ("Hostname", "n1"),
                    ("ExternalIP", "203.0.113.7"),
                ],
            ),
            mk_node("10.244.1.0/24", &[("InternalIP", "192.168.1.11")]),
        ];
        let found = discovered(&nodes, Some("10.96.0.1".parse().unwrap()));
        assert_eq!(
            shown(&found),
            [
                "10.96.0.1/32",
                "10.244.0.0/24",
                "10.244.1.0/24",
                "192.168.1.10/32",
                "192.168.1.11/32",
                "203.0.113.7/32"
            ]
        );
    }

    #[test]
    fn the_flags_come_first_and_nothing_twice() {
        let base: Vec<IpNet> = vec![
            "10.96.0.0/12".parse().unwrap(),
            "10.244.0.0/24".parse().unwrap(),
        ];
        let found = discovered(&[mk_node("10.244.0.0/24", &[])], None);
        assert_eq!(merged(&base, &found), base);
        assert!(discovered(&[], None).is_empty());
    }
}
