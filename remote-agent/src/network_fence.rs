//! Each twin namespace's network fence: the NetworkPolicy [`NAME`], written by the remote
//! agent's own identity (no tenant may change it). A tenant's pods are reached only from the
//! tenant's own namespaces (and what the policy adds, such as the provider's ingress
//! controller); they reach the tenant's namespaces, DNS and the internet, never the provider's
//! node, pod and Service networks nor the link-local range of cloud metadata services.
//!
//! The fence holds only where the provider's network plugin enforces NetworkPolicy.

use std::collections::BTreeMap;

use ipnet::IpNet;
use refract_core::keys::TENANT_NAMESPACE_LABEL;
use refract_shared::tls::ClusterId;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The name of the NetworkPolicy in each twin namespace.
pub const NAME: &str = "refract-tenant-fence";

/// Ranges no tenant pod may reach whatever the provider's networks are: the link-local ranges,
/// where cloud providers serve instance metadata and credentials (169.254.169.254). A metadata
/// address outside them (AWS's fd00:ec2::254) is for `egressDenied` or `--provider-cidr`.
const ALWAYS_DENIED: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

/// What a tenant's pods may reach and be reached from, in the policy file under `network`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NetworkFence {
    /// Write the fence. Off: the tenant's namespaces get no NetworkPolicy from Refract (the
    /// provider fences tenants its own way).
    pub enabled: bool,
    /// Namespaces, each by a set of labels, whose pods may reach the tenant's pods besides
    /// the tenant's own: the provider's ingress controller, say.
    pub ingress_from_namespaces: Vec<BTreeMap<String, String>>,
    /// Ranges outside the provider's cluster whose traffic may reach the tenant's pods: the
    /// origin's pods as the network fabric presents them here (the range the origin's
    /// `--remap` maps its pod range into), so that the origin's clients reach its offloaded
    /// Services' endpoints. Empty: nothing from outside the cluster gets in.
    pub ingress_allowed: Vec<IpNet>,
    /// Where the tenant's pods resolve names: the namespace and pod labels of the provider's
    /// DNS (port 53, UDP and TCP). The default is pods labelled `k8s-app: kube-dns` (CoreDNS)
    /// in any namespace, which works on every Kubernetes version; narrow it with
    /// `namespaceLabels: {kubernetes.io/metadata.name: kube-system}` from 1.21 on. Another
    /// tenant's pods labelled so stay out of reach: their own fence admits only their tenant.
    pub dns: DnsPeer,
    /// Ranges of the provider's own networks the tenant's pods may reach all the same (a
    /// shared service outside the cluster's pod network, say).
    pub egress_allowed: Vec<IpNet>,
    /// Ranges the tenant's pods may never reach, besides the provider's networks and the
    /// link-local ranges.
    pub egress_denied: Vec<IpNet>,
}

impl Default for NetworkFence {
    fn default() -> Self {
        Self {
            enabled: true,
            ingress_from_namespaces: Vec::new(),
            ingress_allowed: Vec::new(),
            dns: DnsPeer::default(),
            egress_allowed: Vec::new(),
            egress_denied: Vec::new(),
        }
    }
}

/// The provider's DNS servers, by labels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DnsPeer {
    /// Labels of the DNS servers' namespace.
    pub namespace_labels: BTreeMap<String, String>,
    /// Labels of the DNS servers' pods.
    pub pod_labels: BTreeMap<String, String>,
}

impl Default for DnsPeer {
    fn default() -> Self {
        Self {
            namespace_labels: BTreeMap::new(),
            pod_labels: [("k8s-app".to_string(), "kube-dns".to_string())].into(),
        }
    }
}

/// The NetworkPolicy of `tenant`'s twin namespace `namespace`, denying `provider_networks`
/// (node addresses, pod and Service ranges); `None` when the fence is off.
pub fn network_policy(
    namespace: &str,
    tenant: &ClusterId,
    fence: &NetworkFence,
    provider_networks: &[IpNet],
) -> Option<Value> {
    if !fence.enabled {
        return None;
    }
    let tenant_namespaces =
        json!({"namespaceSelector": {"matchLabels": {TENANT_NAMESPACE_LABEL: tenant.as_str()}}});
    let mut from = vec![tenant_namespaces.clone()];
    from.extend(
        fence
            .ingress_from_namespaces
            .iter()
            .map(|labels| json!({"namespaceSelector": {"matchLabels": labels}})),
    );
    from.extend(
        fence
            .ingress_allowed
            .iter()
            .map(|net| json!({"ipBlock": {"cidr": net.trunc().to_string()}})),
    );
    let dns_ports = json!([{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]);
    let mut egress = vec![
        json!({"to": [tenant_namespaces]}),
        json!({
            "to": [{
                "namespaceSelector": {"matchLabels": fence.dns.namespace_labels},
                "podSelector": {"matchLabels": fence.dns.pod_labels},
            }],
            "ports": dns_ports,
        }),
        json!({"to": internet(provider_networks, &fence.egress_denied)}),
    ];
    if !fence.egress_allowed.is_empty() {
        let to: Vec<Value> = fence
            .egress_allowed
            .iter()
            .map(|net| json!({"ipBlock": {"cidr": net.to_string()}}))
            .collect();
        egress.push(json!({ "to": to }));
    }
    Some(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NAME,
            "namespace": namespace,
            "labels": {TENANT_NAMESPACE_LABEL: tenant.as_str()},
        },
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": from}],
            "egress": egress,
        },
    }))
}

/// Every address of each family but the denied ranges: one ipBlock per family, its `except`
/// the denied ranges of that family (a range as wide as the whole family cannot be an
/// exception, and leaves that family out).
fn internet(provider_networks: &[IpNet], denied: &[IpNet]) -> Vec<Value> {
    let always = ALWAYS_DENIED.iter().filter_map(|n| n.parse::<IpNet>().ok());
    let mut all: Vec<IpNet> = provider_networks
        .iter()
        .chain(denied)
        .copied()
        .chain(always)
        .map(|n| n.trunc())
        .collect();
    all.sort();
    all.dedup();
    let mut blocks = Vec::new();
    for (whole, v4) in [("0.0.0.0/0", true), ("::/0", false)] {
        let family: Vec<&IpNet> = all
            .iter()
            .filter(|n| matches!(n, IpNet::V4(_)) == v4)
            .collect();
        if family.iter().any(|n| n.prefix_len() == 0) {
            continue;
        }
        let except: Vec<String> = family.iter().map(ToString::to_string).collect();
        blocks.push(json!({"ipBlock": {"cidr": whole, "except": except}}));
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_fence_admits_the_tenants_namespaces_and_denies_the_providers_networks() {
        let tenant = ClusterId::parse("shop").unwrap();
        let policy = network_policy(
            "web-shop",
            &tenant,
            &NetworkFence::default(),
            &[
                net("10.244.0.0/24"),
                net("192.0.2.2/32"),
                net("10.96.0.1/32"),
            ],
        )
        .unwrap();
        let spec = &policy["spec"];
        assert_eq!(spec["podSelector"], json!({}));
        assert_eq!(
            spec["ingress"],
            json!([{"from": [{"namespaceSelector": {"matchLabels": {"refract.io/tenant": "shop"}}}]}])
        );
        assert_eq!(
            spec["egress"][2]["to"],
            json!([
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.96.0.1/32", "10.244.0.0/24", "169.254.0.0/16", "192.0.2.2/32"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}},
            ])
        );
        assert_eq!(spec["egress"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_fence_that_is_off_is_not_written() {
        let tenant = ClusterId::parse("shop").unwrap();
        let fence = NetworkFence {
            enabled: false,
            ..Default::default()
        };
        assert!(network_policy("web-shop", &tenant, &fence, &[]).is_none());
    }

    #[test]
    fn a_denied_range_as_wide_as_its_family_leaves_that_family_out() {
        let blocks = internet(&[net("0.0.0.0/0")], &[net("10.0.0.5/8")]);
        assert_eq!(
            blocks,
            vec![json!({"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}})]
        );
    }

    #[test]
    fn the_policy_adds_ingress_sources_and_allowed_ranges() {
        let tenant = ClusterId::parse("shop").unwrap();
        let fence = NetworkFence {
            ingress_from_namespaces: vec![[("team".to_string(), "ingress".to_string())].into()],
            ingress_allowed: vec![net("10.121.7.0/16")],
            egress_allowed: vec![net("10.10.0.0/24")],
            ..Default::default()
        };
        let policy = network_policy("web-shop", &tenant, &fence, &[]).unwrap();
        assert_eq!(
            policy["spec"]["ingress"][0]["from"][1],
            json!({"namespaceSelector": {"matchLabels": {"team": "ingress"}}})
        );
        assert_eq!(
            policy["spec"]["ingress"][0]["from"][2],
            json!({"ipBlock": {"cidr": "10.121.0.0/16"}}),
            "the origin's pods, as the fabric presents them"
        );
        assert_eq!(
            policy["spec"]["egress"][3],
            json!({"to": [{"ipBlock": {"cidr": "10.10.0.0/24"}}]})
        );
    }
}
