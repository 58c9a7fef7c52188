//! A provider of fake-kubelet nodes with a namespace offloaded to it, for the benchmarks that
//! offload many pods without running containers.

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use refract_e2e::Peering;
use refract_testkit::fake_kubelet::{self, FakeNode};
use serde_json::json;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The virtual node's name (`refract-<provider>`).
pub const VIRTUAL_NODE: &str = "refract-provider";

/// A pod named `name` bound to the virtual node that idles and requests a little: what the
/// fake kubelets run on the provider.
pub fn sleeper_pod(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": VIRTUAL_NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "infinity"],
                            "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}]
        }
    })
}

/// Registers four fake-kubelet nodes on `p`'s provider with room for `pods` pods between them,
/// waits for the virtual node, offloads `namespace` (`podOffloadingStrategy: Remote`) and
/// gives it its default ServiceAccount at the origin (no controller makes one there). The
/// nodes stop when the returned guard drops.
pub async fn offload_to_fake_nodes(
    p: &Peering,
    namespace: &str,
    pods: usize,
) -> anyhow::Result<DropGuard> {
    let nodes = CancellationToken::new();
    let per_node = pods / 4 + 50;
    let fake_nodes = (1..=4u8)
        .map(|i| {
            let mut node = FakeNode::new(
                &format!("provider-node-{i}"),
                "1024",
                "4096Gi",
                format!("10.60.{}.0/18", (i - 1) * 64)
                    .parse()
                    .expect("a valid CIDR"),
                std::net::Ipv4Addr::new(127, 0, 60, i),
            );
            node.capacity.insert("pods".into(), per_node.to_string());
            node
        })
        .collect();
    tokio::spawn(fake_kubelet::run(
        p.provider.client().await?,
        fake_nodes,
        nodes.clone(),
    ));
    p.until_node_ready(Duration::from_secs(120)).await;
    p.extend(namespace, "{podOffloadingStrategy: Remote}");
    p.until_extended(namespace, Duration::from_secs(60)).await;
    let service_accounts: Api<ServiceAccount> =
        Api::namespaced(p.origin.client().await?, namespace);
    let _ = service_accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
        )
        .await;
    Ok(nodes.drop_guard())
}
