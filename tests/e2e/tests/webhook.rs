//! The pod webhook as `deploy/local-agent/webhook.yaml` registers it: a NamespaceOffloading
//! applied with its pods in one `kubectl apply` gates its namespace in time; while no local
//! agent serves, pods of offloaded namespaces are refused (never run at the origin) and pods
//! elsewhere are not touched; once the agent is back, the refused Deployment's pod is created
//! and offloaded.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{busybox, kubectl_stdin, origin_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

/// `kubectl apply -f -` against the origin; (success, stderr).
fn try_apply(p: &Peering, yaml: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg(format!("--kubeconfig={}", p.origin.kubeconfig.display()))
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn pod(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
        busybox()
    )
}

#[tokio::test]
async fn offloaded_namespaces_never_run_pods_at_the_origin_while_no_agent_serves() {
    let mut p = Peering::start_offloading().await.expect("peering");

    // One apply: the namespace, its NamespaceOffloading, then a pod. The webhook labels the
    // namespace while admitting the NamespaceOffloading, so the pod already meets the pod
    // webhook and is placed on the virtual node.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: gated}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: gated}}\nspec: {{podOffloadingStrategy: Remote}}\n---\n{}",
            pod("first", "gated")
        ),
    );
    let tolerations = origin_get(
        &p,
        &[
            "-n",
            "gated",
            "pod",
            "first",
            "-o",
            "jsonpath={.spec.tolerations}",
        ],
    )
    .unwrap();
    assert!(
        tolerations.contains("virtual-node.liqo.io/not-allowed"),
        "the pod applied with its NamespaceOffloading was not mutated: {tolerations}"
    );
    p.eventually(WAIT, "first Running on the virtual node", || {
        let state = origin_get(
            &p,
            &[
                "-n",
                "gated",
                "pod",
                "first",
                "-o",
                "jsonpath={.spec.nodeName} {.status.phase}",
            ],
        )?;
        (state == "refract-provider Running").then_some(())
    })
    .await;

    // No local agent: a pod of the offloaded namespace is refused, saying which webhook; a
    // Deployment is accepted but gets no pod; a pod elsewhere is created as usual.
    p.local.take().unwrap().stop().await;
    let (created, said) = try_apply(&p, &pod("while-down", "gated"));
    println!(
        "a pod applied in an offloaded namespace with no local agent: {}",
        said.trim()
    );
    assert!(
        !created,
        "a pod of an offloaded namespace was admitted without the agent"
    );
    assert!(
        said.contains("pods.offloading.refract.io"),
        "the refusal does not name the webhook: {said}"
    );
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: gated}}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: home}}\n---\n{}",
            busybox(),
            pod("local", "home")
        ),
    );
    assert!(origin_get(&p, &["-n", "home", "pod", "local", "-o", "name"]).is_some());
    let failed = p
        .eventually(WAIT, "the ReplicaSet refused its pod", || {
            let events = origin_get(
                &p,
                &[
                    "-n",
                    "gated",
                    "events",
                    "--field-selector",
                    "reason=FailedCreate",
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
            )?;
            events
                .contains("pods.offloading.refract.io")
                .then_some(events)
        })
        .await;
    println!(
        "the Deployment's ReplicaSet while no local agent serves: {}",
        failed.lines().next().unwrap_or_default()
    );
    let pods = origin_get(&p, &["-n", "gated", "pods", "-l", "app=web", "-o", "name"]).unwrap();
    assert!(
        pods.trim().is_empty(),
        "a pod was created without the agent: {pods}"
    );

    // Back: the ReplicaSet's next attempt goes through the webhook, and the pod is offloaded.
    p.start_local();
    let placed = p
        .eventually(
            Duration::from_secs(180),
            "the Deployment's pod on the virtual node",
            || {
                let state = origin_get(
                    &p,
                    &[
                        "-n",
                        "gated",
                        "pods",
                        "-l",
                        "app=web",
                        "-o",
                        "jsonpath={.items[*].spec.nodeName}",
                    ],
                )?;
                (state == "refract-provider").then_some(state)
            },
        )
        .await;
    println!("after the agent came back, the Deployment's pod is on {placed}");
}
