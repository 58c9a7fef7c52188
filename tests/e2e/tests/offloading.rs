//! Pod offloading end to end: two real control planes with kube-scheduler and
//! kube-controller-manager, the fake kubelet on the provider, both agent binaries, and the
//! local agent's admission webhook registered in the origin.

use std::time::Duration;

use refract_e2e::{kubectl_stdin, origin_get, provider_get, Peering, NODE_IP};

const WAIT: Duration = Duration::from_secs(60);

async fn node_ready(p: &Peering) {
    p.eventually(WAIT, "virtual node Ready", || {
        let s = origin_get(
            p,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        )?;
        (s == "True").then_some(())
    })
    .await;
}

fn extend(p: &Peering, ns: &str, spec: &str) {
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {ns}}}\nspec: {spec}\n"),
    );
}

/// `name=phase,ip,restarts,hostIP` of every pod of app=web in the origin namespace.
fn origin_pods(p: &Peering) -> Vec<(String, String, String, String, String)> {
    let out = origin_get(p, &["-n", "apps", "pods", "-l", "app=web", "-o", "jsonpath={range .items[*]}{.metadata.name},{.status.phase},{.status.podIP},{.status.containerStatuses[0].restartCount},{.status.hostIP}{\"\\n\"}{end}"]).unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() == 5).then(|| {
                (
                    f[0].into(),
                    f[1].into(),
                    f[2].into(),
                    f[3].into(),
                    f[4].into(),
                )
            })
        })
        .collect()
}

#[tokio::test]
async fn a_deployment_runs_on_the_provider_and_survives_deletions_and_a_cut_link() {
    let mut p = Peering::start_offloading().await.expect("peering");
    node_ready(&p).await;

    // The virtual node: labels, taint, and 90% of the provider's free resources.
    let labels = origin_get(
        &p,
        &[
            "node",
            "refract-provider",
            "-o",
            "jsonpath={.metadata.labels}",
        ],
    )
    .unwrap();
    assert!(
        labels.contains(r#""liqo.io/type":"virtual-node""#)
            && labels.contains(r#""liqo.io/remote-cluster-id":"provider""#),
        "{labels}"
    );
    let taints = origin_get(
        &p,
        &["node", "refract-provider", "-o", "jsonpath={.spec.taints}"],
    )
    .unwrap();
    assert!(
        taints.contains("virtual-node.liqo.io/not-allowed") && taints.contains("NoExecute"),
        "{taints}"
    );
    p.eventually(WAIT, "virtual node capacity 90% of 16 CPUs", || {
        (origin_get(
            &p,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.allocatable.cpu}",
            ],
        )? == "14400m")
            .then_some(())
    })
    .await;

    extend(&p, "apps", "{podOffloadingStrategy: Remote}");
    // No toleration or affinity in the template: the webhook adds them.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: apps}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx, resources: {requests: {cpu: 500m, memory: 64Mi}}}]
"#,
    );
    let pods = p
        .eventually(WAIT, "two web pods Running at the origin", || {
            let pods = origin_pods(&p);
            (pods.len() == 2 && pods.iter().all(|x| x.1 == "Running")).then_some(pods)
        })
        .await;
    for (name, _, ip, restarts, host_ip) in &pods {
        assert!(
            ip.starts_with("10.71."),
            "{name}: pod IP {ip} not remapped from the provider's 10.200.0.0/16"
        );
        assert_eq!(restarts, "0");
        assert_eq!(host_ip, NODE_IP);
        let node = origin_get(
            &p,
            &["-n", "apps", "pod", name, "-o", "jsonpath={.spec.nodeName}"],
        )
        .unwrap();
        assert_eq!(node, "refract-provider");
        let remote_ip = provider_get(
            &p,
            &[
                "-n",
                "apps-origin",
                "pod",
                name,
                "-o",
                "jsonpath={.status.podIP}",
            ],
        )
        .unwrap();
        assert_eq!(remote_ip.replacen("10.200.", "10.71.", 1), *ip);
    }
    // The provider's scheduler event about the remote pod shows on the origin pod.
    let first = pods[0].0.clone();
    p.eventually(
        WAIT,
        "the provider's Scheduled event on the origin pod",
        || {
            let events = origin_get(
                &p,
                &[
                    "-n",
                    "apps",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={first}"),
                    "-o",
                    "jsonpath={range .items[*]}{.source.component}|{.message}{\"\\n\"}{end}",
                ],
            )?;
            events
                .lines()
                .any(|l| l.contains("(remote)") && l.contains("assigned apps-origin/"))
                .then_some(())
        },
    )
    .await;
    let tolerations = origin_get(
        &p,
        &[
            "-n",
            "apps",
            "pod",
            &pods[0].0,
            "-o",
            "jsonpath={.spec.tolerations}",
        ],
    )
    .unwrap();
    assert!(
        tolerations.contains("virtual-node.liqo.io/not-allowed"),
        "webhook did not add the toleration: {tolerations}"
    );

    // The virtual node's capacity follows the provider (the origin's own pods do not count).
    kubectl_stdin(&p.provider, &["apply", "-f", "-"], "apiVersion: v1\nkind: Pod\nmetadata: {name: local-load, namespace: default}\nspec:\n  nodeName: provider-node-1\n  containers: [{name: c, image: x, resources: {requests: {cpu: \"4\"}}}]\n");
    p.eventually(
        WAIT,
        "virtual node capacity to drop to 90% of 12 CPUs",
        || {
            (origin_get(
                &p,
                &[
                    "node",
                    "refract-provider",
                    "-o",
                    "jsonpath={.status.allocatable.cpu}",
                ],
            )? == "10800m")
                .then_some(())
        },
    )
    .await;

    // A remote pod deleted on the provider comes back, and the origin counts a restart.
    let victim = pods[0].0.clone();
    p.provider_kubectl(&[
        "-n",
        "apps-origin",
        "delete",
        "pod",
        &victim,
        "--wait=false",
    ]);
    p.eventually(WAIT, "restart count 1 at the origin", || {
        origin_pods(&p)
            .iter()
            .find(|x| x.0 == victim)
            .filter(|x| x.3 == "1" && x.1 == "Running")
            .map(|_| ())
    })
    .await;

    // Cut the link: remote pods keep running and are still re-created when deleted.
    let status = p.local.take().unwrap().stop().await;
    assert!(status.success());
    p.provider_kubectl(&[
        "-n",
        "apps-origin",
        "delete",
        "pod",
        &victim,
        "--wait=false",
    ]);
    p.eventually(
        WAIT,
        "re-creation on the provider while the origin is away",
        || {
            let r = provider_get(
                &p,
                &[
                    "-n",
                    "apps-origin",
                    "shadowpod",
                    &victim,
                    "-o",
                    "jsonpath={.status.recreations},{.status.phase}",
                ],
            )?;
            (r == "2,Running").then_some(())
        },
    )
    .await;
    let running = provider_get(
        &p,
        &[
            "-n",
            "apps-origin",
            "pods",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ],
    )
    .unwrap();
    assert_eq!(
        running, "Running Running",
        "remote pods must keep running while the link is down"
    );
    p.start_local();
    p.eventually(
        WAIT,
        "restart count 2 at the origin after reconnecting",
        || {
            origin_pods(&p)
                .iter()
                .find(|x| x.0 == victim)
                .filter(|x| x.3 == "2")
                .map(|_| ())
        },
    )
    .await;

    // Deleting the Deployment removes the remote pods.
    p.origin_kubectl(&["-n", "apps", "delete", "deployment", "web"]);
    p.eventually(WAIT, "remote pods and ShadowPods removed", || {
        let shadows = provider_get(&p, &["-n", "apps-origin", "shadowpods", "-o", "name"])?;
        let pods = provider_get(&p, &["-n", "apps-origin", "pods", "-o", "name"])?;
        (shadows.trim().is_empty() && pods.trim().is_empty()).then_some(())
    })
    .await;
    p.eventually(WAIT, "origin pods gone", || {
        origin_pods(&p).is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn privileged_pods_are_refused_and_strays_back_off() {
    let p = Peering::start_offloading().await.expect("peering");
    node_ready(&p).await;
    extend(&p, "apps", "{podOffloadingStrategy: Remote}");
    p.until_extended("apps", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Pod
metadata: {name: root, namespace: apps}
spec:
  containers: [{name: c, image: busybox, securityContext: {privileged: true}}]
---
apiVersion: v1
kind: Namespace
metadata: {name: plain, labels: {refract.io/no-webhook: "true"}}
---
apiVersion: v1
kind: Pod
metadata: {name: stray, namespace: plain}
spec:
  nodeName: refract-provider
  tolerations: [{operator: Exists}]
  containers: [{name: c, image: busybox}]
"#,
    );
    p.eventually(WAIT, "privileged pod refused with a reason", || {
        let r = origin_get(
            &p,
            &[
                "-n",
                "apps",
                "pod",
                "root",
                "-o",
                "jsonpath={.status.reason}: {.status.message}",
            ],
        )?;
        (r.starts_with("OffloadingDenied") && r.contains("privileged")).then_some(())
    })
    .await;
    assert!(provider_get(&p, &["-n", "apps-origin", "pod", "root", "-o", "name"]).is_none());
    p.eventually(WAIT, "stray pod Pending with OffloadingBackOff", || {
        let r = origin_get(
            &p,
            &[
                "-n",
                "plain",
                "pod",
                "stray",
                "-o",
                "jsonpath={.status.phase} {.status.reason}",
            ],
        )?;
        (r == "Pending OffloadingBackOff").then_some(())
    })
    .await;
    let events = origin_get(
        &p,
        &[
            "-n",
            "plain",
            "events",
            "--field-selector",
            "reason=OffloadingBackOff",
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
    .unwrap();
    assert!(
        events.contains("liqo.io/type NotIn [virtual-node]"),
        "{events}"
    );
}
