//! Twin namespaces are the tenant's. One deleted by hand on the provider: the remote agent
//! re-creates it once its deletion completes and puts back what was in it (a reflected
//! ConfigMap from the origin, a ShadowPod and its token Secret from its own record), and the
//! pod runs again on the provider's real node through its ShadowPod. One whose name does not
//! carry the tenant's identity (`EnforceSameName` for `monitoring`, a name the provider may
//! install later) is refused at the provider's defaults, and the NamespaceOffloading says
//! which policy key would allow it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use refract_e2e::{busybox, kubectl_get, kubectl_stdin, origin_get, provider_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

/// The provider pod's uid and phase.
fn remote_pod(p: &Peering) -> Option<(String, String)> {
    let got = provider_get(
        p,
        &[
            "-n",
            "apps-origin",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ],
    )?;
    let (uid, phase) = got.split_once(' ')?;
    Some((uid.to_string(), phase.to_string()))
}

#[tokio::test]
async fn a_twin_namespace_deleted_on_the_provider_comes_back_with_its_objects_and_pods() {
    let p = Peering::start_offloading().await.expect("peering");
    p.until_node_ready(WAIT).await;
    p.extend("apps", "{podOffloadingStrategy: Remote}");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: apps}}
data: {{color: blue}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: apps}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: "{}"
      command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
      volumeMounts: [{{name: token, mountPath: /var/run/secrets/tokens}}]
  volumes:
    - name: token
      projected: {{sources: [{{serviceAccountToken: {{path: token, expirationSeconds: 600}}}}]}}
"#,
            busybox()
        ),
    );
    let (first_uid, _) = p
        .eventually(WAIT, "web Running on the provider", || {
            remote_pod(&p).filter(|(_, phase)| phase == "Running")
        })
        .await;
    p.eventually(
        WAIT,
        "the ConfigMap and the token Secret on the provider",
        || {
            let names = provider_get(&p, &["-n", "apps-origin", "configmap,secret", "-o", "name"])?;
            (names.contains("configmap/settings") && names.contains("secret/web-token"))
                .then_some(())
        },
    )
    .await;

    // Deleted by hand, as a provider admin might; kubectl waits until it is gone.
    let deleted = Instant::now();
    p.provider_kubectl(&["delete", "namespace", "apps-origin", "--timeout=120s"]);
    println!("twin namespace deleted in {:?}", deleted.elapsed());
    let back = Instant::now();
    let (uid, _) = p
        .eventually(WAIT, "web Running again on the provider", || {
            remote_pod(&p).filter(|(uid, phase)| phase == "Running" && *uid != first_uid)
        })
        .await;
    println!(
        "pod running again {:?} after the namespace was gone (uid {first_uid} -> {uid})",
        back.elapsed()
    );
    let color = p
        .eventually(WAIT, "the ConfigMap back from the origin", || {
            provider_get(
                &p,
                &[
                    "-n",
                    "apps-origin",
                    "configmap",
                    "settings",
                    "-o",
                    "jsonpath={.data.color}",
                ],
            )
        })
        .await;
    assert_eq!(color, "blue");
    let owner = p
        .eventually(
            WAIT,
            "the token Secret back, owned by the new ShadowPod",
            || {
                provider_get(
                    &p,
                    &[
                        "-n",
                        "apps-origin",
                        "secret",
                        "web-token",
                        "-o",
                        "jsonpath={.metadata.ownerReferences[0].uid}",
                    ],
                )
                .filter(|owner| !owner.is_empty())
            },
        )
        .await;
    let shadow = provider_get(
        &p,
        &[
            "-n",
            "apps-origin",
            "shadowpod",
            "web",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    )
    .unwrap();
    assert_eq!(owner, shadow);
    // Still there a moment later: not taken by the garbage collector as an orphan.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(provider_get(
        &p,
        &["-n", "apps-origin", "secret", "web-token", "-o", "name"]
    )
    .is_some());
    println!(
        "back in {:?}: ConfigMap, ShadowPod, token Secret, pod",
        back.elapsed()
    );
}

#[tokio::test]
async fn a_name_not_carrying_the_tenants_identity_is_refused_at_the_defaults() {
    let p = Peering::start(false).await.expect("peering");
    p.extend("monitoring", "{namespaceMappingStrategy: EnforceSameName}");
    let message = p
        .eventually(WAIT, "the NamespaceOffloading refused with the reason", || {
            let reason = origin_get(
                &p,
                &[
                    "-n",
                    "monitoring",
                    "namespaceoffloading",
                    "offloading",
                    "-o",
                    "jsonpath={.status.remoteNamespacesConditions.provider[?(@.type==\"Ready\")].reason}|{.status.remoteNamespacesConditions.provider[?(@.type==\"Ready\")].message}",
                ],
            )?;
            let (reason, message) = reason.split_once('|')?;
            (reason == "CreationLoopBackOff").then(|| message.to_string())
        })
        .await;
    println!("NamespaceOffloading monitoring: {message}");
    assert!(
        message.contains("does not carry tenant origin's identity")
            && message.contains("namespaces: [\"monitoring\"] under tenants.origin"),
        "{message}"
    );
    assert!(kubectl_get(&p.provider, &["namespace", "monitoring"]).is_none());
}
