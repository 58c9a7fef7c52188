//! Each twin namespace gets a NetworkPolicy from the remote agent that fences its tenant's pods
//! in. The test nodes' network plugin (`bridge`) does not enforce NetworkPolicy, so the test
//! reads back what the agent wrote to the provider's API server and evaluates it
//! ([`refract_e2e::netpol`]) for the connections that matter: another tenant's pods, the
//! provider's own pods, a kubelet and the metadata address are out of reach; the tenant's own
//! namespaces, DNS and the internet are not.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeMap;
use std::time::Duration;

use refract_e2e::netpol::{allowed, Connection, Endpoint, PodAt};
use refract_e2e::{kubectl, kubectl_get, Peering, PROVIDER_POD_RANGE};
use refract_testkit::Options;

const WAIT: Duration = Duration::from_secs(30);
/// The provider's pod and Service ranges, as its operator names them (the test nodes do not
/// publish their pod range).
const POD_RANGE: &str = PROVIDER_POD_RANGE;
const SERVICE_RANGE: &str = "10.96.0.0/16";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod(
    ip: &str,
    namespace: &str,
    ns_labels: &[(&str, &str)],
    pod_labels: &[(&str, &str)],
) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        pod: Some(PodAt {
            namespace: namespace.into(),
            namespace_labels: labels(ns_labels),
            labels: labels(pod_labels),
        }),
    }
}

fn host(ip: &str) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        pod: None,
    }
}

#[tokio::test]
async fn each_twin_namespace_is_fenced_off_from_other_tenants_and_the_provider() {
    let cidrs = [
        format!("--provider-cidr={POD_RANGE}"),
        format!("--provider-cidr={SERVICE_RANGE}"),
    ];
    let remote_flags: Vec<&str> = cidrs.iter().map(String::as_str).collect();
    // A provider with a real node, whose address the agent finds itself.
    let provider = Options::named("provider")
        .with_node(PROVIDER_POD_RANGE, &[])
        .unwrap();
    let p = Peering::start_on(Options::named("origin"), provider, &[], &remote_flags)
        .await
        .expect("peering");
    p.extend("shop", "{}");
    p.extend("billing", "{}");
    let written = |ns: &str| {
        kubectl_get(
            &p.provider,
            &[
                "-n",
                ns,
                "networkpolicy",
                "refract-tenant-fence",
                "-o",
                "json",
            ],
        )
    };
    for ns in ["shop-origin", "billing-origin"] {
        p.eventually(WAIT, &format!("the network fence of {ns}"), || written(ns))
            .await;
    }
    let shop = written("shop-origin").unwrap();
    println!("the NetworkPolicy the remote agent wrote in shop-origin:\n{shop}");
    let policies: Vec<serde_json::Value> = ["shop-origin", "billing-origin"]
        .iter()
        .map(|ns| serde_json::from_str(&written(ns).unwrap()).unwrap())
        .collect();
    let except = &policies[0]["spec"]["egress"][2]["to"][0]["ipBlock"]["except"];
    for range in [POD_RANGE, SERVICE_RANGE, "169.254.0.0/16"] {
        assert!(
            except.as_array().unwrap().iter().any(|e| e == range),
            "{range} is not denied: {except}"
        );
    }

    // The twin namespaces' labels as the provider has them, and a namespace of another tenant.
    let ns_labels = |ns: &str| -> Vec<(String, String)> {
        let json = kubectl(
            &p.provider,
            &["get", "namespace", ns, "-o", "jsonpath={.metadata.labels}"],
        );
        let map: BTreeMap<String, String> = serde_json::from_str(&json).unwrap();
        map.into_iter().collect()
    };
    let shop_labels = ns_labels("shop-origin");
    let shop_labels: Vec<(&str, &str)> = shop_labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let billing_labels = ns_labels("billing-origin");
    let billing_labels: Vec<(&str, &str)> = billing_labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let api_service_ip = kubectl(
        &p.provider,
        &[
            "-n",
            "default",
            "get",
            "svc",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
    );
    let node_ip = kubectl(
        &p.provider,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
        ],
    );
    println!("the provider node's address: {node_ip}; the API server's Service: {api_service_ip}");

    let web = pod(
        "10.200.0.10",
        "shop-origin",
        &shop_labels,
        &[("app", "web")],
    );
    let ledger = pod(
        "10.200.0.11",
        "billing-origin",
        &billing_labels,
        &[("app", "ledger")],
    );
    let rival = pod(
        "10.200.0.20",
        "shop-rival",
        &[("refract.io/tenant", "rival")],
        &[("app", "web")],
    );
    let provider_pod = pod("10.200.0.30", "monitoring", &[], &[("app", "prometheus")]);
    let dns = pod("10.200.0.2", "kube-system", &[], &[("k8s-app", "kube-dns")]);
    let kubelet = host(&node_ip);
    let api_service = host(&api_service_ip);
    let metadata = host("169.254.169.254");
    let internet = host("93.184.216.34");

    let case = |from: &Endpoint, to: &Endpoint, port: u16, protocol: &str| {
        allowed(
            &policies,
            &Connection {
                from,
                to,
                port,
                protocol,
            },
        )
    };
    let cases = [
        (
            "tenant pod -> another tenant's pod",
            case(&web, &rival, 80, "TCP"),
            false,
        ),
        (
            "another tenant's pod -> tenant pod",
            case(&rival, &web, 80, "TCP"),
            false,
        ),
        (
            "tenant pod -> provider pod",
            case(&web, &provider_pod, 9090, "TCP"),
            false,
        ),
        (
            "provider pod -> tenant pod",
            case(&provider_pod, &web, 80, "TCP"),
            false,
        ),
        (
            "tenant pod -> kubelet",
            case(&web, &kubelet, 10250, "TCP"),
            false,
        ),
        (
            "tenant pod -> API server Service",
            case(&web, &api_service, 443, "TCP"),
            false,
        ),
        (
            "tenant pod -> metadata",
            case(&web, &metadata, 80, "TCP"),
            false,
        ),
        (
            "tenant pod -> DNS on a provider pod port 80",
            case(&web, &dns, 80, "TCP"),
            false,
        ),
        (
            "tenant pod -> its other namespace",
            case(&web, &ledger, 8080, "TCP"),
            true,
        ),
        (
            "its other namespace -> tenant pod",
            case(&ledger, &web, 80, "TCP"),
            true,
        ),
        (
            "tenant pod -> DNS (UDP 53)",
            case(&web, &dns, 53, "UDP"),
            true,
        ),
        (
            "tenant pod -> DNS (TCP 53)",
            case(&web, &dns, 53, "TCP"),
            true,
        ),
        (
            "tenant pod -> the internet",
            case(&web, &internet, 443, "TCP"),
            true,
        ),
    ];
    for (what, got, want) in cases {
        println!("{what}: {}", if got { "allowed" } else { "denied" });
        assert_eq!(got, want, "{what}");
    }
}
