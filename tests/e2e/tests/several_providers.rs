//! One origin peered with two providers, end to end: three real control planes, two local
//! agents in the origin (two virtual nodes), a remote agent in each provider, and a real node
//! in provider A running the offloaded pod.
//!
//! - A NamespaceOffloading without a cluster selector extends its namespace to both providers;
//!   one whose selector names provider A extends it to A only; one selecting a label provider B
//!   suggests for its virtual node (`--node-label`) extends it to B only.
//! - Each local agent keeps its own entry of the status (its own field manager); once settled,
//!   the status is not rewritten: no write fights.
//! - A pod offloaded to provider A is reachable from provider B: its Service's EndpointSlice in
//!   B's twin namespace carries the pod's origin address, remapped by B's `--remap`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_core::keys::REMOTE_CLUSTER_ID_LABEL;
use refract_e2e::{busybox, kubectl_get, kubectl_stdin, origin_get, Peering, POD_REMAP};
use refract_testkit::Options;

const WAIT: Duration = Duration::from_secs(150);
const B: &str = "provider-b";
/// How provider B sees the origin's addresses of A's pods (10.71.0.0/16 at the origin).
const B_REMAP: &str = "10.71.0.0/16=10.81.0.0/16";

/// The twin namespaces `cp` holds, sorted.
fn twins(cp: &refract_testkit::ControlPlane) -> Vec<String> {
    let out = kubectl_get(
        cp,
        &[
            "namespaces",
            "-l",
            "refract.io/tenant=origin",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    )
    .unwrap_or_default();
    let mut names: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    names.sort();
    names
}

/// `(phase, "peer=state,...", resourceVersion)` of a NamespaceOffloading, each peer's state
/// `Ready`, `NotSelected` or `Pending` as its conditions say.
fn status(p: &Peering, ns: &str) -> Option<(String, String, String)> {
    let out = origin_get(p, &["-n", ns, "nso", "offloading", "-o", "json"])?;
    let nso: serde_json::Value = serde_json::from_str(&out).ok()?;
    let phase = nso["status"]["offloadingPhase"].as_str()?.to_string();
    let is = |conditions: &serde_json::Value, type_: &str, status: &str| {
        conditions.as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == type_ && c["status"] == status)
        })
    };
    let peers: Vec<String> = nso["status"]["remoteNamespacesConditions"]
        .as_object()?
        .iter()
        .map(|(peer, c)| {
            let state = if is(c, "OffloadingRequired", "False") {
                "NotSelected"
            } else if is(c, "Ready", "True") {
                "Ready"
            } else {
                "Pending"
            };
            format!("{peer}={state}")
        })
        .collect();
    let version = nso["metadata"]["resourceVersion"].as_str()?.to_string();
    Some((phase, peers.join(","), version))
}

#[tokio::test]
async fn one_origin_extends_to_two_providers_and_a_pod_on_a_is_reachable_from_b() {
    let p = Peering::start_offloading().await.expect("peering with A");
    let b = p
        .add_provider(
            B,
            Options::named("provider-b"),
            &["--node-label=refract.example/region=south"],
            &["--node-ip=127.0.0.1", &format!("--remap={B_REMAP}")],
        )
        .await
        .expect("peering with B");
    let context = || {
        format!(
            "--- NamespaceOffloadings ---\n{}\n{}\n--- local agent of provider ---\n{}",
            origin_get(&p, &["nso", "-A", "-o", "yaml", "--show-managed-fields"])
                .unwrap_or_default(),
            b.logs(),
            p.local_log()
        )
    };
    let wait = |what: &'static str| (WAIT, what);

    let (within, what) = wait("both virtual nodes Ready");
    refract_e2e::eventually(
        within,
        what,
        || {
            let ready = origin_get(
                &p,
                &["nodes", "-l", "liqo.io/type=virtual-node", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}"],
            )?;
            (ready.trim() == format!("refract-provider=True refract-{B}=True")).then_some(())
        },
        context,
    )
    .await;

    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: both}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: both}}\nspec: {{podOffloadingStrategy: Remote}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: only-a}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: only-a}}\nspec:\n  clusterSelector:\n    nodeSelectorTerms:\n    - matchExpressions: [{{key: {REMOTE_CLUSTER_ID_LABEL}, operator: In, values: [provider]}}]\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: south}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: south}}\nspec:\n  clusterSelector:\n    nodeSelectorTerms:\n    - matchExpressions: [{{key: refract.example/region, operator: In, values: [south]}}]\n"
        ),
    );
    // `south` is selected by a label provider B suggests for its virtual node.
    let (within, what) = wait("twin namespaces: both and only-a in A, both and south in B");
    refract_e2e::eventually(
        within,
        what,
        || {
            (twins(&p.provider) == ["both-origin", "only-a-origin"]
                && twins(&b.provider) == ["both-origin", "south-origin"])
            .then_some(())
        },
        context,
    )
    .await;
    let (within, what) = wait("both statuses Ready, each showing its selected peers");
    let settled = refract_e2e::eventually(
        within,
        what,
        || {
            let both = status(&p, "both")?;
            let only_a = status(&p, "only-a")?;
            let ready = both.0 == "Ready"
                && both.1 == format!("provider=Ready,{B}=Ready")
                && only_a.0 == "Ready"
                && only_a.1 == format!("provider=Ready,{B}=NotSelected");
            ready.then_some((both.2, only_a.2))
        },
        context,
    )
    .await;
    // Settled statuses stay put: neither agent overwrites the other's view.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let later = (
        status(&p, "both").unwrap().2,
        status(&p, "only-a").unwrap().2,
    );
    assert_eq!(
        later, settled,
        "the NamespaceOffloading statuses were rewritten after they settled (a write fight)"
    );
    let managers = origin_get(
        &p,
        &[
            "-n",
            "both",
            "nso",
            "offloading",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
    )
    .unwrap();
    for peer in ["provider", B] {
        let manager = format!("refract-local-agent-status-{peer}");
        assert!(
            managers.split_whitespace().any(|m| m == manager),
            "no status field manager {manager}: {managers}"
        );
    }
    println!("statuses settled: both → Ready for provider and {B}; only-a → Ready for provider, not selected for {B}; unchanged 10 s later (resourceVersions {settled:?})");

    // A pod on provider A, behind a Service.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: both, labels: {{app: web}}}}\nspec:\n  nodeSelector: {{{REMOTE_CLUSTER_ID_LABEL}: provider}}\n  terminationGracePeriodSeconds: 5\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: both}}\nspec:\n  selector: {{app: web}}\n  ports: [{{port: 80}}]\n",
            busybox()
        ),
    );
    let (within, what) = wait("the pod Running on provider A with an origin address");
    let (node, ip) = refract_e2e::eventually(
        within,
        what,
        || {
            let out = origin_get(
                &p,
                &[
                    "-n",
                    "both",
                    "pod",
                    "web",
                    "-o",
                    "jsonpath={.status.phase} {.spec.nodeName} {.status.podIP}",
                ],
            )?;
            let mut f = out.split_whitespace();
            let (phase, node, ip) = (f.next()?, f.next()?, f.next()?);
            (phase == "Running").then(|| (node.to_string(), ip.to_string()))
        },
        context,
    )
    .await;
    assert_eq!(node, "refract-provider");
    let origin_range: ipnet::Ipv4Net = POD_REMAP.split_once('=').unwrap().1.parse().unwrap();
    let addr: std::net::Ipv4Addr = ip.parse().unwrap();
    assert!(
        origin_range.contains(&addr),
        "the origin shows {ip}, not in {origin_range}"
    );
    let b_range: ipnet::Ipv4Net = B_REMAP.split_once('=').unwrap().1.parse().unwrap();
    let host = u32::from(addr) & !u32::from(origin_range.netmask());
    let expected = std::net::Ipv4Addr::from(u32::from(b_range.network()) | host).to_string();
    // The Service's EndpointSlice, as the origin's EndpointSlice controller publishes it (on
    // these 1.20 control planes EndpointSlice v1 is a CRD and the tests write the slices; see
    // testing.md).
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: both, labels: {{kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}}}}\naddressType: IPv4\nendpoints: [{{addresses: [{ip}], conditions: {{ready: true}}, nodeName: refract-provider, targetRef: {{kind: Pod, namespace: both, name: web}}}}]\nports: [{{port: 80, protocol: TCP}}]\n"
        ),
    );

    let (within, what) =
        wait("provider B's EndpointSlice of Service web with the pod's address, remapped");
    let slice = refract_e2e::eventually(
        within,
        what,
        || {
            let out = kubectl_get(
                &b.provider,
                &["-n", "both-origin", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {.nodeName} {.conditions.ready} {.targetRef.kind}{\"\\n\"}{end}"],
            )?;
            out.lines()
                .find(|l| l.starts_with(&format!("{expected} ")))
                .map(str::to_string)
        },
        context,
    )
    .await;
    // Ready; the node name and target the local agent sets are dropped by provider B's own
    // policy (a tenant's endpoint never names a provider node or object).
    assert_eq!(slice, format!("{expected}  true "));
    assert!(
        kubectl_get(&b.provider, &["-n", "both-origin", "service", "web"]).is_some(),
        "the Service is not reflected to B"
    );
    // Provider A publishes the pod's endpoint itself: no reflected copy of it there.
    let in_a = kubectl_get(
        &p.provider,
        &[
            "-n",
            "both-origin",
            "endpointslices",
            "-l",
            "endpointslice.kubernetes.io/managed-by=endpointslice.reflection.refract.io",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]}",
        ],
    )
    .unwrap_or_default();
    assert!(
        in_a.trim().is_empty(),
        "provider A got a reflected endpoint of its own pod: {in_a}"
    );
    println!(
        "pod web runs on provider A ({ip} at the origin); provider B's EndpointSlice shows {slice}"
    );
}
