//! `metrics.k8s.io` for a test control plane: `stand-ins/metrics_api.py` (what it computes and
//! why it stands in for metrics-server is in its header), served as an aggregated API.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use refract_testkit::ControlPlane;

/// A running stand-in; dropping it stops it.
pub struct MetricsApi {
    child: std::process::Child,
}

impl Drop for MetricsApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address the API server can reach a stand-in on, on a link the test made (the
/// aggregator refuses loopback endpoints): the machine's end of the provider's real node's
/// veth pair when the node has a network of its own, else the gateway of its pod bridge,
/// which exists once a pod ran there.
pub fn bridge_address(provider: &ControlPlane) -> anyhow::Result<Ipv4Addr> {
    let node = provider
        .node
        .as_ref()
        .context("the provider has no real node")?;
    if let Some(network) = &node.network {
        return Ok(network.host_ip());
    }
    node.pod_cidr
        .hosts()
        .next()
        .context("the pod subnet has no host address")
}

/// Serves `metrics.k8s.io/v1beta1` on `cp` from `node`'s `/metrics/resource`, listening on
/// `bind`, and waits until the API server says the APIService is available.
pub async fn serve(cp: &ControlPlane, node: &str, bind: Ipv4Addr) -> anyhow::Result<MetricsApi> {
    let port = crate::free_port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/stand-ins/metrics_api.py");
    let p = |f: &str| cp.dir.join(f).display().to_string();
    let log = std::fs::File::create(cp.dir.join(format!("metrics-api-{node}.log")))?;
    let child = std::process::Command::new("python3")
        .args([
            script,
            &bind.to_string(),
            &port.to_string(),
            &p("serving.crt"),
            &p("serving.key"),
            &cp.server,
            &p("ca.crt"),
            refract_testkit::control_plane::ADMIN_TOKEN,
            node,
        ])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("python3")?;
    let standin = MetricsApi { child };
    crate::kubectl_stdin(
        cp,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: metrics-server, namespace: kube-system}}
spec:
  ports: [{{port: 443, targetPort: {port}}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: metrics-server, namespace: kube-system}}
subsets: [{{addresses: [{{ip: "{bind}"}}], ports: [{{port: {port}}}]}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: v1beta1.metrics.k8s.io}}
spec:
  group: metrics.k8s.io
  version: v1beta1
  service: {{name: metrics-server, namespace: kube-system}}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
"#
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let available = crate::kubectl_get(
            cp,
            &[
                "apiservice",
                "v1beta1.metrics.k8s.io",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ],
        );
        if available.as_deref() == Some("True") {
            return Ok(standin);
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(cp.dir.join(format!("metrics-api-{node}.log")))
                .unwrap_or_default();
            bail!("the metrics API on {bind}:{port} is not available after 60 s: {available:?}; its log: {log}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
