//! Unpeering end to end, as an operator does it: `local-agent unpeer` against the origin, and
//! on the provider `--tenant-expiry` and `remote-agent remove-tenant`. Two real control planes
//! with controllers, a real node on the provider running the offloaded pod, both agents.
//!
//! Graceful: the pod is drained (it ends on the provider, then leaves the origin, never stuck
//! Terminating), the provider removes the tenant's twin namespace with its reflected objects,
//! and the virtual node, its Lease and the peer's NamespaceOffloading status go; the agent
//! idles and writes nothing back.
//!
//! Forced, the provider dead (its remote agent SIGKILLed): the origin is cleaned up in well
//! under 60 s without a call to the provider, whose pod keeps running; the remote agent,
//! started again with `--tenant-expiry`, removes the tenant once it has stayed away that long.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use refract_e2e::{bin, busybox, kubectl_stdin, origin_get, provider_get, run, Peering};

const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "shop";
const TWIN: &str = "shop-origin";
const NODE: &str = "refract-provider";

/// Extends [`NS`] with a ConfigMap and one pod, and waits for the pod to run on the provider.
/// The tenant's ServiceAccount on the provider, which its objects are written as.
fn tenant_account(p: &Peering) -> Option<String> {
    provider_get(
        p,
        &[
            "-n",
            "refract-system",
            "serviceaccount",
            "tenant-origin",
            "-o",
            "name",
        ],
    )
}

async fn offload_a_pod(p: &Peering) {
    p.eventually(WAIT, "virtual node Ready", || {
        let ready = origin_get(
            p,
            &[
                "node",
                NODE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        )?;
        (ready == "True").then_some(())
    })
    .await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{podOffloadingStrategy: Remote}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {NS}}}\ndata: {{colour: teal}}\n"
        ),
    );
    p.until_extended(NS, WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: {NS}}}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
            busybox()
        ),
    );
    p.eventually(
        WAIT,
        "the pod Running on the provider and the origin",
        || {
            let remote = provider_get(
                p,
                &["-n", TWIN, "pod", "web", "-o", "jsonpath={.status.phase}"],
            )?;
            let local = origin_get(
                p,
                &["-n", NS, "pod", "web", "-o", "jsonpath={.status.phase}"],
            )?;
            (remote == "Running" && local == "Running").then_some(())
        },
    )
    .await;
    p.eventually(WAIT, "the ConfigMap reflected", || {
        provider_get(p, &["-n", TWIN, "configmap", "settings"]).map(|_| ())
    })
    .await;
}

/// `local-agent unpeer` against the origin with `flags`: its output, and how long it took.
fn unpeer(p: &Peering, flags: &[&str]) -> (String, Duration) {
    let kubeconfig = p.origin.kubeconfig.display().to_string();
    let mut args = vec![
        "unpeer",
        "--kubeconfig",
        kubeconfig.as_str(),
        "--remote-cluster-id",
        "provider",
        "--timeout",
        "2m",
    ];
    args.extend_from_slice(flags);
    let started = Instant::now();
    let out = run(bin("local-agent"), &args);
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "local-agent {args:?} failed:\n{stdout}\n{}\n--- local agent ---\n{}\n--- remote agent ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        p.local_log(),
        p.remote_log()
    );
    println!("$ local-agent {}\n{stdout}", args.join(" "));
    (stdout, took)
}

/// What the origin must no longer hold once unpeered: the virtual node (staying gone), its
/// Lease, and the peer in the NamespaceOffloading status.
async fn origin_is_clean(p: &Peering) {
    assert_eq!(
        origin_get(p, &["node", NODE]),
        None,
        "the virtual node is still there"
    );
    assert_eq!(
        origin_get(p, &["-n", "kube-node-lease", "lease", NODE]),
        None,
        "the node's Lease is still there"
    );
    let peers = origin_get(
        p,
        &[
            "-n",
            NS,
            "nso",
            "offloading",
            "-o",
            "jsonpath={.status.remoteNamespacesConditions}",
        ],
    )
    .unwrap_or_default();
    assert!(
        !peers.contains("provider"),
        "the NamespaceOffloading status still shows the provider: {peers}"
    );
    // The agent idles: nothing writes the node back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        origin_get(p, &["node", NODE]),
        None,
        "the virtual node came back"
    );
}

#[tokio::test]
async fn a_graceful_unpeer_drains_removes_the_tenant_and_the_node() {
    let p = Peering::start_offloading().await.expect("peering");
    offload_a_pod(&p).await;

    // A node that is not this peering's virtual node is never touched.
    let kubeconfig = p.origin.kubeconfig.display().to_string();
    let wrong = run(
        bin("local-agent"),
        &[
            "unpeer",
            "--kubeconfig",
            &kubeconfig,
            "--remote-cluster-id",
            "elsewhere",
            "--node-name",
            NODE,
            "--force",
        ],
    );
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && said.contains("is not the virtual node of provider elsewhere"),
        "a forced unpeer of another peering's node was not refused: {said}"
    );
    assert!(origin_get(&p, &["-n", NS, "pod", "web"]).is_some());

    assert!(tenant_account(&p).is_some(), "the tenant's ServiceAccount");
    let (out, took) = unpeer(&p, &[]);
    assert!(out.contains("draining"), "no drain progress shown:\n{out}");
    assert!(
        out.contains("the provider removed 1 namespace(s): shop-origin (shop)"),
        "the provider's removal not shown:\n{out}"
    );
    assert!(
        out.contains("unpeered: virtual node refract-provider removed"),
        "{out}"
    );

    assert_eq!(
        origin_get(&p, &["-n", NS, "pod", "web"]),
        None,
        "the origin pod is still there (stuck Terminating?)"
    );
    origin_is_clean(&p).await;
    // The twin namespace goes, and the pod and ConfigMap in it.
    p.eventually(WAIT, "the twin namespace removed from the provider", || {
        provider_get(&p, &["namespace", TWIN])
            .is_none()
            .then_some(())
    })
    .await;
    let remote_log = p.remote_log();
    assert!(
        remote_log.contains("removed tenant namespace")
            && remote_log.contains("the origin unpeered"),
        "the remote agent did not log what it removed:\n{remote_log}"
    );
    assert!(p
        .local_log()
        .contains("unpeered: the link is stopped for good"));
    assert_eq!(
        tenant_account(&p),
        None,
        "the tenant's ServiceAccount stays"
    );
    // Still in the origin: the user's own namespace and objects.
    assert!(origin_get(&p, &["-n", NS, "configmap", "settings"]).is_some());
    println!("graceful unpeer took {took:.1?}: the pod drained, the twin namespace and the virtual node removed");
}

#[tokio::test]
async fn a_forced_unpeer_spares_a_dead_provider_and_the_expiry_collects_the_tenant() {
    let mut p = Peering::start_offloading().await.expect("peering");
    offload_a_pod(&p).await;
    let provider_pod_uid = provider_get(
        &p,
        &["-n", TWIN, "pod", "web", "-o", "jsonpath={.metadata.uid}"],
    )
    .unwrap();

    // The provider dies: its remote agent is killed and stays away.
    let remote = p.remote.take().unwrap();
    refract_e2e::run_ok("kill", &["-KILL", &remote.pid().unwrap().to_string()]);
    drop(remote);

    let (out, took) = unpeer(&p, &["--force"]);
    assert!(
        out.contains("forced: the local agent stopped its link"),
        "{out}"
    );
    assert!(out.contains("deleted pod shop/web"), "{out}");
    assert!(
        out.contains("deleted virtual node refract-provider"),
        "{out}"
    );
    assert!(
        took < Duration::from_secs(60),
        "a forced unpeer took {took:?}"
    );
    assert_eq!(
        origin_get(&p, &["-n", NS, "pod", "web"]),
        None,
        "the origin pod is still there"
    );
    origin_is_clean(&p).await;

    // Nothing was asked of the provider: its pod runs on, the same one.
    let uid = provider_get(
        &p,
        &[
            "-n",
            TWIN,
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ],
    );
    assert_eq!(uid, Some(format!("{provider_pod_uid} Running")));

    // The remote agent comes back with an expiry: the tenant (whose agent now idles) never
    // reconnects, and is removed once it has been away that long, counted from the start.
    p.remote_flags.push("--tenant-expiry=10s".into());
    p.start_remote();
    let restarted = Instant::now();
    p.eventually(WAIT, "the expired tenant's twin namespace removed", || {
        provider_get(&p, &["namespace", TWIN])
            .is_none()
            .then_some(())
    })
    .await;
    let collected_after = restarted.elapsed();
    assert!(
        collected_after >= Duration::from_secs(10),
        "collected {collected_after:?} after the restart, before the 10 s expiry"
    );
    let remote_log = p.remote_log();
    assert!(
        remote_log.contains("removed tenant namespace")
            && remote_log.contains("has not connected since"),
        "the remote agent did not log the collection:\n{remote_log}"
    );
    assert_eq!(
        tenant_account(&p),
        None,
        "the tenant's ServiceAccount stays"
    );
    println!("forced unpeer took {took:.1?} with the provider dead; the provider pod ran on; --tenant-expiry=10s collected the tenant {collected_after:.1?} after the remote agent restarted");
}

#[tokio::test]
async fn an_operator_removes_a_tenant_the_running_remote_agent_still_remembers() {
    let mut p = Peering::start(true).await.expect("peering");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {NS}}}\ndata: {{colour: teal}}\n"
        ),
    );
    p.until_extended(NS, WAIT).await;
    p.eventually(WAIT, "the ConfigMap reflected", || {
        provider_get(&p, &["-n", TWIN, "configmap", "settings"]).map(|_| ())
    })
    .await;
    // Another tenant's namespace, which must stay.
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: other-shop\n  labels: {refract.io/tenant: other}\n",
    );
    // The origin is gone for good; the remote agent runs on and still holds its desired state.
    p.local.take().unwrap().stop().await;

    let kubeconfig = p.provider.kubeconfig.display().to_string();
    let remove = |tenant: &str, extra: &[&str]| {
        let mut args = vec![
            "remove-tenant",
            "--cluster-id",
            tenant,
            "--kubeconfig",
            kubeconfig.as_str(),
        ];
        args.extend_from_slice(extra);
        let out = run(bin("remote-agent"), &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        println!("$ remote-agent {}\n{stdout}", args.join(" "));
        stdout
    };
    assert_eq!(
        remove("origin", &["--dry-run"]),
        "would remove namespace shop-origin (shop)"
    );
    assert!(provider_get(&p, &["-n", TWIN, "configmap", "settings"]).is_some());
    assert!(tenant_account(&p).is_some(), "the tenant's ServiceAccount");
    assert_eq!(
        remove("origin", &[]),
        "removed namespace shop-origin (shop)"
    );
    assert_eq!(
        tenant_account(&p),
        None,
        "the tenant's ServiceAccount stays"
    );
    // Gone for good: the running remote agent does not restore what it remembers.
    p.eventually(WAIT, "the tenant's namespace removed", || {
        provider_get(&p, &["namespace", TWIN])
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        provider_get(&p, &["namespace", TWIN]),
        None,
        "the namespace came back"
    );
    assert!(
        !p.remote_log()
            .contains("restored the tenant's desired state"),
        "the remote agent restored a removed tenant's objects:\n{}",
        p.remote_log()
    );
    let other = provider_get(
        &p,
        &["namespace", "other-shop", "-o", "jsonpath={.status.phase}"],
    );
    assert_eq!(
        other.as_deref(),
        Some("Active"),
        "another tenant's namespace was touched"
    );
    assert_eq!(
        remove("nobody", &[]),
        "tenant nobody: no namespaces; nothing to remove"
    );
}
