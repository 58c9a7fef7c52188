//! The storage fabric end to end: a claim of the virtual storage class whose pod lands on the
//! virtual node is provisioned on the provider with the peering's class (by the testkit's fake
//! provisioner and the provider's real PV controller), and the provider's volume comes back as
//! an origin PV pinned to the virtual node, which the origin's real PV controller binds and
//! the real scheduler honours.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{busybox, kubectl_stdin, origin_get, provider_get, Peering};
use refract_testkit::fake_kubelet::{self, FakeNode};

const WAIT: Duration = Duration::from_secs(90);

fn pod(name: &str, node_selector: &str) -> String {
    pod_of_claim(name, node_selector, "data")
}

/// A pod mounting claim `claim`.
fn pod_of_claim(name: &str, node_selector: &str, claim: &str) -> String {
    let image = busybox();
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: apps}}
spec:
  nodeSelector: {node_selector}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: db
      image: "{image}"
      command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
      volumeMounts: [{{name: data, mountPath: /var/lib/postgresql}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]
"#
    )
}

/// Waits until origin claim `claim` of `apps` is Bound to origin PV `volume`.
async fn until_bound_at_origin(p: &Peering, claim: &str, volume: &str) {
    let what = format!("claim {claim} Bound at the origin to {volume}");
    p.eventually(WAIT, &what, || {
        let r = origin_get(
            p,
            &[
                "-n",
                "apps",
                "pvc",
                claim,
                "-o",
                "jsonpath={.spec.volumeName},{.status.phase}",
            ],
        )?;
        (r == format!("{volume},Bound")).then_some(())
    })
    .await;
}

/// The reflection values with claims on (the default) and off.
const CLAIMS_ON: &str = "offloading:\n  reflection:\n    persistentvolumeclaim: {workers: 3}\n";
const CLAIMS_OFF: &str = "offloading:\n  reflection:\n    persistentvolumeclaim: {workers: 0}\n";

#[tokio::test]
async fn a_virtual_class_claim_is_provisioned_on_the_provider_and_its_volume_pins_pods() {
    // Claims are reflected (the defaults, written out): the file is turned off below.
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(values.path(), CLAIMS_ON).unwrap();
    let mut p = Peering::start_offloading_with(&[
        "--remote-real-storage-class-name=fast",
        &format!("--reflection-config={}", values.path().display()),
    ])
    .await
    .expect("peering");
    // A real (fake-kubelet) node at the origin too, so the scheduler has a local choice the
    // volume's node affinity must rule out.
    let origin_nodes = tokio_util::sync::CancellationToken::new();
    let _stop_origin_nodes = origin_nodes.clone().drop_guard();
    tokio::spawn(fake_kubelet::run(
        p.origin.client().await.unwrap(),
        vec![FakeNode::new(
            "origin-node-1",
            "8",
            "16Gi",
            "10.50.0.0/24".parse().unwrap(),
            std::net::Ipv4Addr::new(127, 0, 20, 1),
        )],
        origin_nodes,
    ));
    let storage_class = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/local-agent/storageclass.yaml"
    );
    p.origin_kubectl(&["apply", "-f", storage_class]);
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: fast}}\nprovisioner: {}\nreclaimPolicy: Delete\n",
            refract_testkit::fake_provisioner::PROVISIONER
        ),
    );
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: apps}
spec: {podOffloadingStrategy: LocalAndRemote}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: apps}
spec: {storageClassName: liqo, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scratch, namespace: apps}
spec: {storageClassName: manual, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
"#,
    );
    p.until_extended("apps", WAIT).await;
    // Before any consumer, nothing is provisioned anywhere.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(provider_get(&p, &["-n", "apps-origin", "pvc", "data", "-o", "name"]).is_none());

    // The first consumer goes to the virtual node.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &pod("db", "{liqo.io/type: virtual-node}"),
    );
    let claim_uid = origin_get(
        &p,
        &[
            "-n",
            "apps",
            "pvc",
            "data",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    )
    .unwrap();
    let origin_pv = format!("pvc-{claim_uid}");
    p.eventually(WAIT, "the provider claim Bound with class fast", || {
        let r = provider_get(
            &p,
            &[
                "-n",
                "apps-origin",
                "pvc",
                "data",
                "-o",
                "jsonpath={.spec.storageClassName},{.status.phase}",
            ],
        )?;
        (r == "fast,Bound").then_some(())
    })
    .await;
    until_bound_at_origin(&p, "data", &origin_pv).await;
    let affinity = origin_get(
        &p,
        &[
            "pv",
            &origin_pv,
            "-o",
            "jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0]}",
        ],
    )
    .unwrap();
    assert!(
        affinity.contains("kubernetes.io/hostname") && affinity.contains("refract-provider"),
        "origin PV not pinned to the virtual node: {affinity}"
    );
    let remote_pv = provider_get(
        &p,
        &[
            "-n",
            "apps-origin",
            "pvc",
            "data",
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
    )
    .unwrap();
    let mirrored = origin_get(
        &p,
        &[
            "pv",
            &origin_pv,
            "-o",
            "jsonpath={.metadata.annotations.offloading\\.refract\\.io/remote-volume},{.spec.capacity.storage},{.spec.storageClassName}",
        ],
    )
    .unwrap();
    assert_eq!(mirrored, format!("{remote_pv},1Gi,liqo"));
    p.eventually(
        WAIT,
        "the pod Running on the provider with its claim",
        || {
            let r = provider_get(
                &p,
                &[
                    "-n",
                    "apps-origin",
                    "pod",
                    "db",
                    "-o",
                    "jsonpath={.status.phase},{.spec.volumes[0].persistentVolumeClaim.claimName}",
                ],
            )?;
            (r == "Running,data").then_some(())
        },
    )
    .await;

    // The provider's controllers wrote the claim (bound it, set its status) and the pod's
    // ShadowPod (its status): writes outside Refract's fields, never taken for drift.
    let drifted = origin_get(
        &p,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            "reason=ReflectionDrifted",
            "-o",
            "name",
        ],
    )
    .unwrap_or_default();
    if !drifted.trim().is_empty() {
        let remote = p.remote_log();
        let claim_lines: Vec<&str> = remote
            .lines()
            .filter(|l| l.contains("PersistentVolumeClaim") || l.contains("restor"))
            .collect();
        panic!(
            "controller writes taken for drift: {drifted}\nremote agent on claims:\n{}",
            claim_lines.join("\n")
        );
    }

    // Later consumers: one pinned to the origin node cannot be scheduled (volume node affinity
    // conflict); one left free lands on the virtual node.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "{}---{}",
            pod("db-local", "{kubernetes.io/hostname: origin-node-1}"),
            pod("db-2", "{}")
        ),
    );
    let node = p
        .eventually(WAIT, "db-2 scheduled", || {
            let node = origin_get(
                &p,
                &[
                    "-n",
                    "apps",
                    "pod",
                    "db-2",
                    "-o",
                    "jsonpath={.spec.nodeName}",
                ],
            )?;
            (!node.is_empty()).then_some(node)
        })
        .await;
    assert_eq!(
        node, "refract-provider",
        "db-2 must follow its volume to the virtual node"
    );
    p.eventually(
        WAIT,
        "db-local refused for its volume's node affinity",
        || {
            let events = origin_get(
                &p,
                &[
                    "-n",
                    "apps",
                    "events",
                    "--field-selector",
                    "involvedObject.name=db-local,reason=FailedScheduling",
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
            )?;
            events
                .contains("volume node affinity conflict")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        origin_get(
            &p,
            &[
                "-n",
                "apps",
                "pod",
                "db-local",
                "-o",
                "jsonpath={.spec.nodeName}"
            ]
        )
        .unwrap(),
        ""
    );

    // A claim of another class is never reflected.
    assert!(provider_get(&p, &["-n", "apps-origin", "pvc", "scratch", "-o", "name"]).is_none());

    // Claims turned off while the agents run: nothing more is reflected, and the provider
    // claim stays, with its volume's data, even across a new session (whose snapshot must not
    // have the provider collect it). Then on again.
    std::fs::write(values.path(), CLAIMS_OFF).unwrap();
    p.eventually(WAIT, "claims turned off at the origin", || {
        p.local_log()
            .contains("reflection of the kind turned off")
            .then_some(())
    })
    .await;
    let sessions = |p: &Peering| p.local_log().matches("connected to remote agent").count();
    let before = sessions(&p);
    p.remote.take().unwrap().stop().await;
    p.start_remote();
    p.eventually(
        WAIT,
        "a new session after the remote agent restarted",
        || (sessions(&p) > before).then_some(()),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        provider_get(&p, &["-n", "apps-origin", "pvc", "data", "-o", "name"]).is_some(),
        "the provider claim was removed while claims were off:\n{}",
        p.remote_log()
    );
    std::fs::write(values.path(), CLAIMS_ON).unwrap();
    p.eventually(WAIT, "claims turned on again", || {
        p.local_log()
            .contains("reflection of the kind turned on")
            .then_some(())
    })
    .await;

    // Deleting the claim (after its pods) removes the provider claim and the origin PV.
    p.origin_kubectl(&[
        "-n",
        "apps",
        "delete",
        "pod",
        "db",
        "db-2",
        "db-local",
        "--wait=true",
        "--timeout=60s",
    ]);
    p.origin_kubectl(&["-n", "apps", "delete", "pvc", "data", "--wait=false"]);
    p.eventually(WAIT, "provider claim and both PVs gone", || {
        let remote_claim = provider_get(&p, &["-n", "apps-origin", "pvc", "data", "-o", "name"]);
        let remote_volume = provider_get(&p, &["pv", &remote_pv, "-o", "name"]);
        let local_volume = origin_get(&p, &["pv", &origin_pv, "-o", "name"]);
        (remote_claim.is_none() && remote_volume.is_none() && local_volume.is_none()).then_some(())
    })
    .await;

    // Claims off when the local agent starts, turned on while it runs: the claim reflector
    // and the volume intake start then, and a new claim's consumer gets its volume.
    let said = |p: &Peering, what: &str| p.local_log().matches(what).count();
    std::fs::write(values.path(), CLAIMS_OFF).unwrap();
    p.local.take().unwrap().stop().await;
    p.start_local();
    p.eventually(WAIT, "the local agent started with claims off", || {
        (said(&p, "reflection disabled (0 workers)") > 0).then_some(())
    })
    .await;
    let turned_on = said(&p, "reflection of the kind turned on");
    std::fs::write(values.path(), CLAIMS_ON).unwrap();
    p.eventually(WAIT, "claims turned on", || {
        (said(&p, "reflection of the kind turned on") > turned_on).then_some(())
    })
    .await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: late, namespace: apps}}\nspec: {{storageClassName: liqo, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n---\n{}",
            pod_of_claim("db-late", "{liqo.io/type: virtual-node}", "late")
        ),
    );
    let late_uid = p
        .eventually(WAIT, "claim late", || {
            origin_get(
                &p,
                &[
                    "-n",
                    "apps",
                    "pvc",
                    "late",
                    "-o",
                    "jsonpath={.metadata.uid}",
                ],
            )
            .filter(|uid| !uid.is_empty())
        })
        .await;
    until_bound_at_origin(&p, "late", &format!("pvc-{late_uid}")).await;
    println!("claims off at start, turned on while the agent runs: claim late provisioned on the provider and Bound at the origin to pvc-{late_uid}");
}
