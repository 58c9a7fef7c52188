//! `local-agent preview` as a user runs it: offline on files and stdin, and on a live namespace.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use refract_e2e::{bin, kubectl_stdin, run};
use serde_json::Value;

fn preview(args: &[&str]) -> (bool, Value, String) {
    let mut all = vec![
        "preview",
        "--cluster-id",
        "origin",
        "--remote-cluster-id",
        "provider",
    ];
    all.extend_from_slice(args);
    let out = run(bin("local-agent"), &all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stderr,
    )
}

#[test]
fn preview_shows_what_would_be_sent_and_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.yaml");
    std::fs::write(
        &input,
        r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec: {type: NodePort, clusterIP: 10.96.1.1, ports: [{port: 80, nodePort: 30001}]}
- apiVersion: v1
  kind: Secret
  metadata: {name: token, namespace: shop}
  type: kubernetes.io/service-account-token
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.3.7]}, {addresses: [10.0.9.9], nodeName: vn}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: taken, namespace: shop}
data: {a: b}
"#,
    )
    .unwrap();
    let existing = dir.path().join("existing.json");
    std::fs::write(&existing, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"taken","namespace":"shop-origin"}}"#).unwrap();
    let (ok, v, stderr) = preview(&[
        "-f",
        input.to_str().unwrap(),
        "--existing",
        existing.to_str().unwrap(),
        "--remap",
        "10.0.0.0/16=10.50.0.0/16",
        "--provider-node",
        "vn",
    ]);
    assert!(ok, "{stderr}");
    let by_source = |s: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|e| e["source"] == s)
            .cloned()
            .unwrap_or_else(|| panic!("no {s} in {v}"))
    };
    let svc = by_source("Service shop/web");
    assert_eq!(svc["decision"], "reflect");
    assert_eq!(svc["namespace"], "shop-origin");
    assert!(svc["object"]["spec"].get("clusterIP").is_none());
    assert!(svc["object"]["spec"]["ports"][0].get("nodePort").is_none());
    assert_eq!(by_source("Secret shop/token")["decision"], "skip");
    let slice = by_source("EndpointSlice shop/web-1");
    assert_eq!(slice["object"]["endpoints"].as_array().unwrap().len(), 1);
    assert_eq!(slice["object"]["endpoints"][0]["addresses"][0], "10.50.3.7");
    assert_eq!(by_source("ConfigMap shop/taken")["decision"], "conflict");
}

#[test]
fn preview_reports_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: [unclosed\n").unwrap();
    let (ok, _, stderr) = preview(&["-f", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("not valid YAML or JSON"),
        "{stderr}"
    );
    let (ok, _, stderr) = preview(&[]);
    assert!(!ok);
    assert!(stderr.contains("-f FILE"), "{stderr}");
}

#[tokio::test]
async fn preview_reads_a_live_namespace() {
    let cp = refract_testkit::ControlPlane::start(refract_testkit::Options::named("preview"))
        .await
        .unwrap();
    kubectl_stdin(&cp, &["apply", "-f", "-"], "apiVersion: v1\nkind: Namespace\nmetadata: {name: live}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: live}\ndata: {k: v}\n");
    let (ok, v, stderr) = preview(&[
        "--kubeconfig",
        cp.kubeconfig.to_str().unwrap(),
        "--namespace",
        "live",
        "--namespace-mapping-strategy",
        "enforce-same-name",
    ]);
    assert!(ok, "{stderr}");
    let cm = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["source"] == "ConfigMap live/settings")
        .expect("settings previewed");
    assert_eq!(cm["namespace"], "live");
    assert_eq!(cm["object"]["data"]["k"], "v");
}

#[test]
fn preview_shows_the_shadowpod_and_the_status_a_pod_would_get() {
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&pod, "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop, uid: u-1, labels: {app: web}}\nspec:\n  nodeName: refract-provider\n  hostNetwork: true\n  nodeSelector: {liqo.io/type: virtual-node}\n  containers: [{name: web, image: nginx}]\n").unwrap();
    let (ok, v, stderr) = preview(&["-f", pod.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let shadow = &v[0]["object"];
    assert_eq!(shadow["kind"], "ShadowPod");
    assert_eq!(shadow["metadata"]["namespace"], "shop-origin");
    assert_eq!(
        shadow["metadata"]["labels"]["offloading.refract.io/origin-uid"],
        "u-1"
    );
    assert_eq!(shadow["spec"]["pod"]["hostNetwork"], false);
    assert!(shadow["spec"]["pod"].get("nodeSelector").is_none());
    assert!(shadow["spec"]["pod"].get("nodeName").is_none());

    let remote = dir.path().join("remote.yaml");
    std::fs::write(&remote, "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop-origin}\nstatus: {phase: Running, podIP: 10.200.0.12, containerStatuses: [{name: web, ready: true, restartCount: 1, image: nginx, imageID: x}]}\n").unwrap();
    let (ok, v, stderr) = preview(&[
        "-f",
        pod.to_str().unwrap(),
        "--remote-pod",
        remote.to_str().unwrap(),
        "--recreations",
        "2",
        "--remote-pod-remap",
        "10.200.0.0/16=10.71.0.0/16",
        "--node-ip",
        "10.244.0.5",
    ]);
    assert!(ok, "{stderr}");
    let status = &v[0]["status"];
    assert_eq!(status["podIP"], "10.71.0.12");
    assert_eq!(status["hostIP"], "10.244.0.5");
    assert_eq!(status["containerStatuses"][0]["restartCount"], 3);
}
