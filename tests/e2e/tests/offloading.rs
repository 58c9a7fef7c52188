//! Pod offloading end to end: two real control planes with kube-scheduler and
//! kube-controller-manager, a real node on the provider (containerd, kubelet, CNI bridge: the
//! offloaded pods run as real containers), both agent binaries, and the local agent's
//! admission webhook registered in the origin.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{busybox, kubectl_stdin, origin_get, provider_get, Peering, NODE_IP};

const WAIT: Duration = Duration::from_secs(90);

/// A container that runs until told to stop, and stops at once when told.
const SLEEPER: &str = r#"["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]"#;

/// The provider node's allocatable CPU in millicores.
fn provider_cpu_millis(p: &Peering) -> u64 {
    let cpu = provider_get(
        p,
        &[
            "node",
            "localhost",
            "-o",
            "jsonpath={.status.allocatable.cpu}",
        ],
    )
    .expect("provider node");
    match cpu.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => cpu.parse::<u64>().unwrap() * 1000,
    }
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
    p.until_node_ready(WAIT).await;

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
    let provider_cpu = provider_cpu_millis(&p);
    let virtual_cpu = |p: &Peering| {
        origin_get(
            p,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.allocatable.cpu}",
            ],
        )
    };
    let full = format!("{}m", provider_cpu * 9 / 10);
    p.eventually(WAIT, &format!("virtual node capacity {full}"), || {
        (virtual_cpu(&p)? == full).then_some(())
    })
    .await;

    p.extend("apps", "{podOffloadingStrategy: Remote}");
    // No toleration or affinity in the template: the webhook adds them.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: apps}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 2
      containers: [{{name: web, image: "{}", command: {SLEEPER}, resources: {{requests: {{cpu: 100m, memory: 16Mi}}}}}}]
"#,
            busybox()
        ),
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

    // Label and annotation changes on an origin pod reach its running provider pod: the
    // container keeps running, and a label added on the provider stays.
    let relabeled = pods[1].0.clone();
    let remote = |p: &Peering, path: &str| {
        provider_get(
            p,
            &[
                "-n",
                "apps-origin",
                "pod",
                &relabeled,
                "-o",
                &format!("jsonpath={path}"),
            ],
        )
    };
    let container = remote(&p, "{.status.containerStatuses[0].containerID}").unwrap();
    p.provider_kubectl(&[
        "-n",
        "apps-origin",
        "label",
        "pod",
        &relabeled,
        "provider-owned=yes",
    ]);
    p.origin_kubectl(&["-n", "apps", "label", "pod", &relabeled, "tier=front"]);
    p.origin_kubectl(&["-n", "apps", "annotate", "pod", &relabeled, "note=hello"]);
    p.eventually(
        WAIT,
        "the origin's new label and annotation on the provider pod",
        || {
            let got = remote(&p, "{.metadata.labels.tier}/{.metadata.annotations.note}")?;
            (got == "front/hello").then_some(())
        },
    )
    .await;
    p.origin_kubectl(&["-n", "apps", "label", "pod", &relabeled, "tier-"]);
    let labels = p
        .eventually(
            WAIT,
            "the label removed at the origin gone on the provider",
            || {
                let labels = remote(&p, "{.metadata.labels}")?;
                (!labels.contains("\"tier\"")).then_some(labels)
            },
        )
        .await;
    assert!(
        labels.contains("\"provider-owned\":\"yes\"") && labels.contains("\"app\":\"web\""),
        "{labels}"
    );
    assert_eq!(
        remote(&p, "{.status.containerStatuses[0].containerID}").unwrap(),
        container,
        "the provider pod's container changed with its labels"
    );

    // The virtual node's capacity follows the provider (the origin's own pods do not count).
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: local-load, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: {SLEEPER}, resources: {{requests: {{cpu: 500m}}}}}}]\n", busybox()),
    );
    let less = format!("{}m", (provider_cpu - 500) * 9 / 10);
    p.eventually(
        WAIT,
        &format!("virtual node capacity to drop to {less}"),
        || (virtual_cpu(&p)? == less).then_some(()),
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
        "--grace-period=1",
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
        "--grace-period=1",
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
    // The ShadowPods' statuses were written all along (pods deleted, recreated, restarted):
    // writes outside Refract's fields, never taken for drift.
    let drifted = p.origin_kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=ReflectionDrifted",
        "-o",
        "name",
    ]);
    assert!(
        drifted.trim().is_empty(),
        "status writes taken for drift: {drifted}"
    );
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
    p.until_node_ready(WAIT).await;
    p.extend("apps", "{podOffloadingStrategy: Remote}");
    p.until_extended("apps", WAIT).await;
    // The local image, though neither pod may ever run: a bug must not make a node pull one.
    let image = busybox();
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: root, namespace: apps}}
spec:
  containers: [{{name: c, image: "{image}", securityContext: {{privileged: true}}}}]
---
apiVersion: v1
kind: Namespace
metadata: {{name: plain, labels: {{refract.io/no-webhook: "true"}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: stray, namespace: plain}}
spec:
  nodeName: refract-provider
  tolerations: [{{operator: Exists}}]
  containers: [{{name: c, image: "{image}"}}]
"#
        ),
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
    let events = event_messages(&p, "plain", "reason=OffloadingBackOff").unwrap();
    assert!(
        events.contains("liqo.io/type NotIn [virtual-node]"),
        "{events}"
    );

    // The provider takes the ShadowPod but cannot create its pod (a quota of its admin's): the
    // origin pod says why, attempts back off, and the pod runs once the quota goes.
    let refused_at_first = refused_pod_creates(&p);
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: no-pods, namespace: apps-origin}\nspec: {hard: {pods: \"0\"}}\n",
    );
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: quota, namespace: apps}}\nspec:\n  containers: [{{name: c, image: \"{image}\", command: {SLEEPER}}}]\n"),
    );
    p.eventually(WAIT, "the origin pod shows the provider's failure", || {
        let r = origin_get(
            &p,
            &["-n", "apps", "pod", "quota", "-o", "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}: {.status.message}"],
        )?;
        (r.starts_with("ProviderFailedCreate") && r.contains("quota")).then_some(())
    })
    .await;
    p.eventually(WAIT, "a FailedCreate event on the origin pod", || {
        let e = event_messages(&p, "apps", "involvedObject.name=quota,reason=FailedCreate")?;
        e.contains("could not create the pod").then_some(())
    })
    .await;
    // Counted where they land: the provider API server's refused pod creates.
    let attempts = || refused_pod_creates(&p);
    let before = attempts();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = attempts() - before;
    let all = attempts() - refused_at_first;
    println!("the provider's API server refused {during} pod creates in 30 s of steady failure, {all} in all");
    assert!(
        during <= 6,
        "{during} attempts in 30 s under steady failure (at most 12 a minute)"
    );
    assert!(all >= 2, "the create was retried: {all} refused in all");
    kubectl_stdin(
        &p.provider,
        &["delete", "-f", "-"],
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: no-pods, namespace: apps-origin}\n",
    );
    p.eventually(
        Duration::from_secs(180),
        "the pod runs once the quota is gone",
        || {
            let phase = origin_get(
                &p,
                &[
                    "-n",
                    "apps",
                    "pod",
                    "quota",
                    "-o",
                    "jsonpath={.status.phase}",
                ],
            )?;
            (phase == "Running").then_some(())
        },
    )
    .await;

    // The namespace stops being offloaded while the pod runs: nothing runs it any more, so the
    // origin marks it Failed (and not ready) for its controller to replace, as Liqo does.
    p.origin_kubectl(&["-n", "apps", "delete", "namespaceoffloading", "offloading"]);
    p.eventually(WAIT, "the running pod marked Failed OffloadingAborted", || {
        let r = origin_get(
            &p,
            &["-n", "apps", "pod", "quota", "-o", "jsonpath={.status.phase} {.status.reason} {.status.conditions[?(@.type==\"Ready\")].status}"],
        )?;
        (r == "Failed OffloadingAborted False").then_some(())
    })
    .await;
    let aborted = event_messages(
        &p,
        "apps",
        "involvedObject.name=quota,reason=OffloadingAborted",
    )
    .unwrap_or_default();
    assert!(aborted.contains("no longer offloaded"), "{aborted:?}");
    // Offloaded again, the namespace's new pods leave and the aborted one never does.
    p.extend("apps", "{podOffloadingStrategy: Remote}");
    p.until_extended("apps", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: again, namespace: apps}}\nspec:\n  containers: [{{name: c, image: \"{image}\", command: {SLEEPER}}}]\n"),
    );
    p.eventually(
        Duration::from_secs(180),
        "a new pod offloaded again",
        || provider_get(&p, &["-n", "apps-origin", "pod", "again", "-o", "name"]),
    )
    .await;
    assert!(
        provider_get(
            &p,
            &["-n", "apps-origin", "shadowpod", "quota", "-o", "name"]
        )
        .is_none(),
        "the aborted pod was offloaded again"
    );
    let r = origin_get(
        &p,
        &[
            "-n",
            "apps",
            "pod",
            "quota",
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
        ],
    );
    assert_eq!(r.as_deref(), Some("Failed OffloadingAborted"));
}

/// The messages of the origin events in `ns` that `selector` (a field selector) picks.
fn event_messages(p: &Peering, ns: &str, selector: &str) -> Option<String> {
    origin_get(
        p,
        &[
            "-n",
            ns,
            "events",
            "--field-selector",
            selector,
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
}

/// `phase,restarts` of an origin pod.
fn origin_phase_and_restarts(p: &Peering, ns: &str, name: &str) -> Option<(String, u32)> {
    let out = origin_get(
        p,
        &[
            "-n",
            ns,
            "pod",
            name,
            "-o",
            "jsonpath={.status.phase},{.status.containerStatuses[0].restartCount}",
        ],
    )?;
    let (phase, restarts) = out.split_once(',')?;
    Some((phase.to_string(), restarts.parse().ok()?))
}

#[tokio::test]
async fn containers_restart_and_finished_pods_never_run_again_on_a_real_node() {
    let mut p = Peering::start_offloading().await.expect("peering");
    p.until_node_ready(WAIT).await;
    p.extend("apps", "{podOffloadingStrategy: Remote}");
    p.until_extended("apps", WAIT).await;
    let image = busybox();
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: crash, namespace: apps}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: "{image}", command: ["sh", "-c", "echo starting; sleep 1; exit 3"]}}]
---
apiVersion: batch/v1
kind: Job
metadata: {{name: once, namespace: apps}}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: c, image: "{image}", command: ["sh", "-c", "echo job-output-42"]}}]
"#
        ),
    );

    // The kubelet restarts the crashing container; the origin shows the kubelet's count (plus
    // the ShadowPod's re-creations, none here). Both move while it crash-loops, so the test
    // waits for a moment they agree.
    p.eventually(WAIT, "the crashing container restarted twice", || {
        origin_phase_and_restarts(&p, "apps", "crash").filter(|(_, r)| *r >= 2)
    })
    .await;
    p.eventually(
        WAIT,
        "the origin's restart count equal to the kubelet's",
        || {
            let kubelet: u32 = provider_get(
                &p,
                &[
                    "-n",
                    "apps-origin",
                    "pod",
                    "crash",
                    "-o",
                    "jsonpath={.status.containerStatuses[0].restartCount}",
                ],
            )?
            .parse()
            .ok()?;
            let recreations: u32 = provider_get(
                &p,
                &[
                    "-n",
                    "apps-origin",
                    "shadowpod",
                    "crash",
                    "-o",
                    "jsonpath={.status.recreations}",
                ],
            )?
            .parse()
            .unwrap_or(0);
            let (_, origin) = origin_phase_and_restarts(&p, "apps", "crash")?;
            (origin == kubelet + recreations && kubelet >= 2).then_some(())
        },
    )
    .await;
    let exit_code = provider_get(
        &p,
        &[
            "-n",
            "apps-origin",
            "pod",
            "crash",
            "-o",
            "jsonpath={.status.containerStatuses[0].lastState.terminated.exitCode}",
        ],
    )
    .unwrap();
    assert_eq!(exit_code, "3", "the real container's exit code");

    // The Job's pod completes on the provider and shows Succeeded at the origin.
    let job_pod = p
        .eventually(WAIT, "the Job's pod Succeeded at the origin", || {
            let name = origin_get(
                &p,
                &[
                    "-n",
                    "apps",
                    "pods",
                    "-l",
                    "job-name=once",
                    "-o",
                    "jsonpath={.items[0].metadata.name}",
                ],
            )?;
            let (phase, _) = origin_phase_and_restarts(&p, "apps", &name)?;
            (phase == "Succeeded").then_some(name)
        })
        .await;
    let logs = p.provider_kubectl(&["-n", "apps-origin", "logs", &job_pod]);
    assert_eq!(
        logs.trim(),
        "job-output-42",
        "the container's output on the provider"
    );
    p.eventually(WAIT, "the Job complete at the origin", || {
        let done = origin_get(
            &p,
            &[
                "-n",
                "apps",
                "job",
                "once",
                "-o",
                "jsonpath={.status.succeeded}",
            ],
        )?;
        (done == "1").then_some(())
    })
    .await;

    // A finished pod is never run again: not when its provider pod is deleted, not when the
    // ShadowPod itself is lost and the origin sends it again after a reconnect.
    p.provider_kubectl(&["-n", "apps-origin", "delete", "pod", &job_pod]);
    p.provider_kubectl(&["-n", "apps-origin", "delete", "shadowpod", &job_pod]);
    let status = p.local.take().unwrap().stop().await;
    assert!(status.success());
    p.start_local();
    p.eventually(
        WAIT,
        "the finished pod's ShadowPod sent again, marked finished",
        || {
            let marker = provider_get(
                &p,
                &[
                    "-n",
                    "apps-origin",
                    "shadowpod",
                    &job_pod,
                    "-o",
                    "jsonpath={.metadata.annotations.offloading\\.refract\\.io/origin-finished}",
                ],
            )?;
            (marker == "Succeeded").then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        provider_get(&p, &["-n", "apps-origin", "pod", &job_pod, "-o", "name"]).is_none(),
        "a finished pod ran again on the provider\n{}",
        p.remote_log()
    );
    let (phase, _) = origin_phase_and_restarts(&p, "apps", &job_pod).unwrap();
    assert_eq!(phase, "Succeeded");
    assert!(
        origin_get(
            &p,
            &["-n", "apps", "pods", "-l", "job-name=once", "-o", "name"]
        )
        .unwrap()
        .lines()
        .count()
            == 1,
        "the Job started another pod"
    );
}

/// Pod creates the provider's API server refused with 403 (a ResourceQuota's refusal among
/// them), from its own request counter.
fn refused_pod_creates(p: &Peering) -> u64 {
    let metrics = refract_e2e::kubectl(&p.provider, &["get", "--raw", "/metrics"]);
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            [
                "code=\"403\"",
                "resource=\"pods\"",
                "subresource=\"\"",
                "verb=\"POST\"",
            ]
            .iter()
            .all(|label| l.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
