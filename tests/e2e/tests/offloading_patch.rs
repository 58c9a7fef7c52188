//! The offloading patch (`--offloading-patch`, Liqo's VirtualNode `spec.offloadingPatch`) on a
//! real provider node. A test binary of its own: test nodes on one host share `/var/log/pods`,
//! and a short test tearing its node down beside a longer one removed the other's logs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{busybox, kubectl_stdin, provider_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

/// A container that runs until told to stop, and stops at once when told.
const SLEEPER: &str = r#"["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]"#;

#[tokio::test]
async fn an_offloading_patch_places_pods_on_the_provider() {
    // What a VirtualNode's offloadingPatch says in Liqo: placement on the provider, and a
    // label kept at the origin.
    let patch = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        patch.path(),
        "nodeSelector: {kubernetes.io/hostname: localhost}\ntolerations:\n- {key: dedicated, operator: Equal, value: tenants, effect: NoSchedule}\nlabelsNotReflected: [team.example/cost-centre]\n",
    )
    .unwrap();
    let flag = format!("--offloading-patch={}", patch.path().display());
    let p = Peering::start_offloading_with(&[&flag])
        .await
        .expect("peering");
    p.until_node_ready(WAIT).await;
    p.extend("patched", "{podOffloadingStrategy: Remote}");
    p.until_extended("patched", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: placed, namespace: patched, labels: {{app: placed, team.example/cost-centre: \"42\"}}}}\nspec:\n  nodeSelector: {{liqo.io/type: virtual-node}}\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: {SLEEPER}}}]\n",
            busybox()
        ),
    );
    let placed = p
        .eventually(WAIT, "the patched pod Running on the provider", || {
            let out = provider_get(&p, &["-n", "patched-origin", "pod", "placed", "-o", "json"])?;
            let pod: serde_json::Value = serde_json::from_str(&out).ok()?;
            (pod["status"]["phase"] == "Running").then_some(pod)
        })
        .await;
    let spec = &placed["spec"];
    assert_eq!(
        spec["nodeSelector"],
        serde_json::json!({"kubernetes.io/hostname": "localhost"}),
        "the origin's node selector is dropped and the patch's applies"
    );
    let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t["key"] == "dedicated" && t["value"] == "tenants"),
        "the patch's toleration is missing: {tolerations:?}"
    );
    let labels = &placed["metadata"]["labels"];
    assert_eq!(labels["app"], "placed");
    assert!(
        labels.get("team.example/cost-centre").is_none(),
        "a label the patch keeps at the origin was reflected: {labels}"
    );
}
