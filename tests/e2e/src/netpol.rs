//! Evaluates NetworkPolicies as read from an API server, for the test nodes' network plugin
//! does not enforce them: would traffic from one endpoint to another be allowed?
//!
//! Covers what the fences use: pod selectors and namespace selectors by `matchLabels`, ipBlocks
//! with exceptions, ports by number and protocol. An ipBlock is matched against every address,
//! pods' included: some plugins match it only outside the cluster, so this reading allows at
//! least as much as any plugin does, and a "denied" here is denied everywhere.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

/// One end of a connection.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Its address.
    pub ip: IpAddr,
    /// For a pod: its namespace's name and labels, and its own labels. `None` for anything
    /// else (a node, an address outside the cluster).
    pub pod: Option<PodAt>,
}

/// Where a pod is.
#[derive(Debug, Clone)]
pub struct PodAt {
    /// Its namespace.
    pub namespace: String,
    /// Its namespace's labels.
    pub namespace_labels: BTreeMap<String, String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// A connection: from, to, port and protocol.
#[derive(Debug, Clone)]
pub struct Connection<'a> {
    /// The client.
    pub from: &'a Endpoint,
    /// The server.
    pub to: &'a Endpoint,
    /// The server's port.
    pub port: u16,
    /// "TCP" or "UDP".
    pub protocol: &'a str,
}

/// Whether `policies` (every NetworkPolicy of the cluster, as JSON) allow `c`: its egress
/// from the client's pod and its ingress to the server's pod, each allowed when no policy
/// selects that pod for that direction or one of those that do allows it.
pub fn allowed(policies: &[Value], c: &Connection<'_>) -> bool {
    let egress = match &c.from.pod {
        Some(pod) => direction_allows(policies, pod, "Egress", "egress", "to", c.to, c),
        None => true,
    };
    let ingress = match &c.to.pod {
        Some(pod) => direction_allows(policies, pod, "Ingress", "ingress", "from", c.from, c),
        None => true,
    };
    egress && ingress
}

fn direction_allows(
    policies: &[Value],
    pod: &PodAt,
    kind: &str,
    rules_key: &str,
    peers_key: &str,
    peer: &Endpoint,
    c: &Connection<'_>,
) -> bool {
    let selecting: Vec<&Value> = policies
        .iter()
        .filter(|p| p["metadata"]["namespace"].as_str() == Some(pod.namespace.as_str()))
        .filter(|p| labels_match(&p["spec"]["podSelector"], &pod.labels))
        .filter(|p| {
            p["spec"]["policyTypes"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == kind))
        })
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|policy| {
        let namespace = policy["metadata"]["namespace"].as_str().unwrap_or_default();
        policy["spec"][rules_key]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let peers_ok = match rule[peers_key].as_array() {
                    None => true,
                    Some(peers) if peers.is_empty() => true,
                    Some(peers) => peers.iter().any(|p| peer_matches(p, namespace, peer)),
                };
                peers_ok && ports_match(&rule["ports"], c)
            })
    })
}

fn peer_matches(peer: &Value, policy_namespace: &str, endpoint: &Endpoint) -> bool {
    if let Some(block) = peer.get("ipBlock") {
        let inside = |cidr: &Value| {
            cidr.as_str()
                .and_then(|c| c.parse::<IpNet>().ok())
                .is_some_and(|net| net.contains(&endpoint.ip))
        };
        return inside(&block["cidr"])
            && !block["except"].as_array().into_iter().flatten().any(inside);
    }
    let Some(pod) = &endpoint.pod else {
        return false;
    };
    let namespace_ok = match peer.get("namespaceSelector") {
        Some(selector) => labels_match(selector, &pod.namespace_labels),
        None => pod.namespace == policy_namespace,
    };
    let pod_ok = match peer.get("podSelector") {
        Some(selector) => labels_match(selector, &pod.labels),
        None => true,
    };
    namespace_ok && pod_ok
}

fn ports_match(ports: &Value, c: &Connection<'_>) -> bool {
    let Some(ports) = ports.as_array().filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|p| {
        let protocol = p["protocol"].as_str().unwrap_or("TCP");
        let port_ok = match &p["port"] {
            Value::Null => true,
            Value::Number(n) => n.as_u64() == Some(u64::from(c.port)),
            _ => false,
        };
        protocol == c.protocol && port_ok
    })
}

/// Whether `selector`'s `matchLabels` are all in `labels` (an empty selector selects all).
fn labels_match(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
}
