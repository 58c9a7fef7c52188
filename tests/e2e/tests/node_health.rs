//! The virtual node's health and the origin's standard eviction, end to end: two real control
//! planes with kube-controller-manager's node lifecycle controller at its defaults (taint-based
//! eviction), a real node on the provider running the offloaded pods, and both agents.
//!
//! The local agent checks its health every second and turns the node NotReady after 20 failed
//! checks. A 1-second outage of the remote agent must change nothing; a long one must make the
//! node NotReady, let the lifecycle controller taint it `node.kubernetes.io/not-ready`
//! (NoExecute) and keep that taint for as long as the provider is away (no write of the agent
//! removes it), evict the pod that tolerates it for 20 s and not the one that tolerates it for
//! ever, and leave both remote pods running on the provider. When the link returns, the
//! evicted pod's remote pod is deleted and the origin pod is finalized; the other one keeps
//! its container, with 0 restarts.
//!
//! The origin also gets one Ready node of its own (the testkit's fake kubelet, running no pod
//! of this test): with every node NotReady, the lifecycle controller assumes its own
//! disruption and evicts nothing, as in any real cluster.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use refract_e2e::{busybox, kubectl_stdin, origin_get, provider_get, Peering};
use refract_testkit::fake_kubelet::{self, FakeNode};

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "health";
const TWIN: &str = "health-origin";
const NODE: &str = "refract-provider";
/// The lifecycle controller's taint of a NotReady node that evicts.
const NOT_READY: &str = "node.kubernetes.io/not-ready:NoExecute";

/// The virtual node's Ready condition, whole: `status lastTransitionTime reason: message`.
fn ready_condition(p: &Peering) -> String {
    origin_get(
        p,
        &[
            "node",
            NODE,
            "-o",
            "jsonpath={range .status.conditions[?(@.type==\"Ready\")]}{.status} {.lastTransitionTime} {.reason}: {.message}{end}",
        ],
    )
    .unwrap_or_default()
}

/// The virtual node's Ready status.
fn ready(p: &Peering) -> String {
    let condition = ready_condition(p);
    condition.split(' ').next().unwrap_or_default().to_owned()
}

/// The virtual node's taints: `key:effect` → timeAdded.
fn taints(p: &Peering) -> BTreeMap<String, String> {
    let out = origin_get(
        p,
        &[
            "node",
            NODE,
            "-o",
            "jsonpath={range .spec.taints[*]}{.key} {.effect} {.timeAdded}{\"\\n\"}{end}",
        ],
    )
    .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let key = f.next()?;
            let effect = f.next().unwrap_or_default();
            let added = f.next().unwrap_or_default().to_string();
            Some((format!("{key}:{effect}"), added))
        })
        .collect()
}

/// `name uid containerID restarts phase` of the provider pods.
fn provider_pods(p: &Peering) -> BTreeMap<String, String> {
    provider_get(
        p,
        &["-n", TWIN, "pods", "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount} {.status.phase}{\"\\n\"}{end}"],
    )
    .unwrap_or_default()
    .lines()
    .filter_map(|l| l.split_once(' ').map(|(n, rest)| (n.to_string(), rest.to_string())))
    .collect()
}

/// Whether origin pod `name` exists, and whether it is being deleted.
fn origin_pod(p: &Peering, name: &str) -> Option<bool> {
    let out = origin_get(
        p,
        &[
            "-n",
            NS,
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ],
    )?;
    Some(!out.trim().is_empty())
}

/// The Ready condition of origin pod `name`.
fn pod_ready(p: &Peering, name: &str) -> String {
    origin_get(
        p,
        &[
            "-n",
            NS,
            "pod",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
    )
    .unwrap_or_default()
}

fn pod(name: &str, toleration_seconds: Option<u32>) -> String {
    let seconds = toleration_seconds
        .map(|s| format!(", tolerationSeconds: {s}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  terminationGracePeriodSeconds: 5\n  tolerations:\n  - {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute{seconds}}}\n  - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute{seconds}}}\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
        busybox()
    )
}

#[tokio::test]
async fn pods_are_evicted_after_their_toleration_while_the_provider_is_away_and_not_for_a_short_cut(
) {
    // 20 checks of 1 s: a killed remote agent must restart, take the tenant's stream and report
    // the provider again within that. About 1 s on an idle machine; once over 8 s on a loaded
    // CI machine, and over 12 s with a workspace build running beside the suite.
    let mut p = Peering::start_offloading_with(&["--health-failure-threshold=20"])
        .await
        .expect("peering");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = FakeNode::new(
        "origin-worker",
        "4",
        "8Gi",
        "10.99.0.0/24".parse().unwrap(),
        "127.0.0.2".parse().unwrap(),
    );
    let origin_client = p.origin.client().await.unwrap();
    tokio::spawn(fake_kubelet::run(
        origin_client,
        vec![worker],
        shutdown.clone(),
    ));
    p.eventually(WAIT, "virtual node Ready", || {
        (ready(&p) == "True").then_some(())
    })
    .await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{podOffloadingStrategy: Remote}}\n"),
    );
    p.until_extended(NS, WAIT).await;
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod("evictee", Some(20)));
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod("stayer", None));
    let before = p
        .eventually(WAIT, "both provider pods Running", || {
            let pods = provider_pods(&p);
            (pods.len() == 2 && pods.values().all(|v| v.ends_with(" 0 Running"))).then_some(pods)
        })
        .await;
    p.eventually(WAIT, "both origin pods Running", || {
        let phases = origin_get(
            &p,
            &["-n", NS, "pods", "-o", "jsonpath={.items[*].status.phase}"],
        )?;
        (phases == "Running Running").then_some(())
    })
    .await;

    // The node starts NotReady until the provider is described, and the lifecycle controller
    // taints it then; it lifts that taint only at its next pass (every 5 s) after the node
    // turned Ready, which can come after the pods run. The cut must start from an untainted
    // node, or the start's taint would be taken for the cut's.
    p.eventually(WAIT, "the start's not-ready taint lifted", || {
        (!taints(&p).contains_key(NOT_READY)).then_some(())
    })
    .await;

    // A short cut: the remote agent gone for a second.
    let ready_before = ready_condition(&p);
    let transition = |condition: &str| condition.split(' ').nth(1).map(str::to_owned);
    let remote = p.remote.take().unwrap();
    refract_e2e::run_ok("kill", &["-KILL", &remote.pid().unwrap().to_string()]);
    drop(remote);
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.start_remote();
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(15) {
        // The transition time catches a flip to NotReady and back between two polls too.
        let condition = ready_condition(&p);
        assert!(
            condition.starts_with("True ") && transition(&condition) == transition(&ready_before),
            "a 1 s outage turned the node NotReady: Ready was {ready_before:?}, now {condition:?}"
        );
        let taints_now = taints(&p);
        assert!(
            !taints_now
                .keys()
                .any(|key| key.starts_with("node.kubernetes.io/not-ready")),
            "a 1 s outage got the node tainted: {taints_now:?}; Ready {condition:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(origin_pod(&p, "evictee"), Some(false));
    println!("short cut: the remote agent was gone 1 s; the node stayed Ready and untainted for 15 s, no pod was evicted");

    // A long outage: the remote agent stays away.
    let remote = p.remote.take().unwrap();
    refract_e2e::run_ok("kill", &["-KILL", &remote.pid().unwrap().to_string()]);
    drop(remote);
    let cut = Instant::now();
    let not_ready_after = p
        .eventually(WAIT, "virtual node NotReady", || {
            (ready(&p) == "False").then(|| cut.elapsed())
        })
        .await;
    let (tainted_after, added) = p
        .eventually(WAIT, "the not-ready NoExecute taint", || {
            let added = taints(&p).get(NOT_READY)?.clone();
            Some((cut.elapsed(), added))
        })
        .await;
    let evicted_after = p
        .eventually(WAIT, "evictee evicted (terminating at the origin)", || {
            let t = taints(&p);
            assert_eq!(
                t.get(NOT_READY),
                Some(&added),
                "the lifecycle controller's taint was removed or replaced while the provider was away: {t:?}"
            );
            assert!(
                t.contains_key("virtual-node.liqo.io/not-allowed:NoExecute"),
                "the virtual-node taint is gone: {t:?}"
            );
            (origin_pod(&p, "evictee") == Some(true)).then(|| cut.elapsed())
        })
        .await;
    // The taint stays, and the other pod stays, for as long as the provider is away.
    let hold = Instant::now();
    while hold.elapsed() < Duration::from_secs(15) {
        let t = taints(&p);
        assert_eq!(
            t.get(NOT_READY),
            Some(&added),
            "the not-ready taint changed while the provider was away: {t:?}"
        );
        assert_eq!(
            origin_pod(&p, "stayer"),
            Some(false),
            "the pod tolerating not-ready for ever was evicted"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        provider_pods(&p),
        before,
        "the provider pods changed while their origin was away"
    );
    // Its readiness follows the node's: traffic stops going to a pod nobody can reach.
    assert_eq!(
        pod_ready(&p, "stayer"),
        "False",
        "the stayer still shows Ready while the provider is away"
    );
    println!(
        "long outage: NotReady {not_ready_after:.1?} after the cut, tainted not-ready:NoExecute at {tainted_after:.1?}, evictee (tolerationSeconds 20) evicted at {evicted_after:.1?}; the taint kept its timeAdded {added} while the provider was away; stayer not evicted; both provider pods still the same containers"
    );

    // The link returns.
    p.start_remote();
    let back = Instant::now();
    p.eventually(WAIT, "virtual node Ready again", || {
        (ready(&p) == "True").then_some(())
    })
    .await;
    let finalized_after = p
        .eventually(
            WAIT,
            "evictee gone at the origin and on the provider",
            || {
                (origin_pod(&p, "evictee").is_none() && !provider_pods(&p).contains_key("evictee"))
                    .then(|| back.elapsed())
            },
        )
        .await;
    p.eventually(WAIT, "the not-ready taint removed", || {
        (!taints(&p).contains_key(NOT_READY)).then_some(())
    })
    .await;
    assert_eq!(
        provider_pods(&p).get("stayer"),
        before.get("stayer"),
        "the stayer's provider pod changed or restarted"
    );
    let ready_again = p
        .eventually(WAIT, "the stayer Ready again at the origin", || {
            (pod_ready(&p, "stayer") == "True").then(|| back.elapsed())
        })
        .await;
    println!("link back: the stayer was Ready again at the origin {ready_again:.1?} after the remote agent returned");
    println!(
        "link back: evictee's remote pod deleted and the origin pod finalized {finalized_after:.1?} after the remote agent returned; stayer kept its container with 0 restarts"
    );
    shutdown.cancel();
}
