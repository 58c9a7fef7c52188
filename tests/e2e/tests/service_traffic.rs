//! Service traffic across the two clusters, on real nodes with kube-proxy at both ends.
//!
//! Both clusters get a real node with a network of its own and kube-proxy
//! ([`Options::with_own_network`]) routing Services by their EndpointSlices
//! ([`Options::with_endpoint_slices`], as on Kubernetes 1.21+). The pod ranges are remapped
//! both ways, the way Liqo's network fabric does it: the origin sees the provider's pods in
//! [`PROVIDER_SEEN`] (`--remote-pod-remap`), the provider sees the origin's in
//! [`ORIGIN_SEEN`] (`--remap`), and the machine between the nodes translates those addresses
//! ([`Fabric`]). Then, in one offloaded namespace:
//!
//! - a client pod on the origin's node reaches the Service `backend`, whose only endpoint is an
//!   offloaded pod running on the provider's node (origin kube-proxy → the pod's remapped
//!   address in the origin's EndpointSlice → the fabric → the provider pod), and the provider
//!   pod sees the client by its remapped address;
//! - the offloaded pod reaches the Service `frontdesk` as reflected to the provider, whose only
//!   endpoint is a pod on the origin's node (provider kube-proxy → the reflected EndpointSlice's
//!   remapped address → the fabric → the origin pod);
//! - the remote agent's network fence in the twin namespace, as written with the origin's
//!   remapped range in the tenant's `network.ingressAllowed`, lets both through and keeps
//!   other outside addresses out.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net};
use refract_e2e::netpol::{allowed, Connection, Endpoint, PodAt};
use refract_e2e::{busybox, kubectl_get, kubectl_stdin, run, Peering};
use refract_testkit::fabric::{Fabric, Side};
use refract_testkit::{ControlPlane, Options};

const WAIT: Duration = Duration::from_secs(120);
/// The origin's pods, and the same pods as the provider addresses them.
const ORIGIN_PODS: &str = "10.120.0.0/16";
const ORIGIN_SEEN: &str = "10.121.0.0/16";
/// The provider's pods, and the same pods as the origin addresses them.
const PROVIDER_PODS: &str = "10.220.0.0/16";
const PROVIDER_SEEN: &str = "10.221.0.0/16";

/// A pod serving `answer` over HTTP on port 8080, logging each request's client address.
fn server(name: &str, node_selector: &str, answer: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, labels: {{app: {name}}}}}\nspec:\n  nodeSelector: {node_selector}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: http\n    image: \"{}\"\n    command: [sh, -c, 'mkdir -p /www && echo {answer} > /www/index.html && exec httpd -f -v -p 8080 -h /www']\n    ports: [{{containerPort: 8080}}]\n",
        busybox()
    )
}

/// The Service of [`server`] `name`, on port 80.
fn service(name: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n")
}

/// `kubectl ARGS` against `cp`: its output, or `None` when it fails.
fn try_kubectl(cp: &ControlPlane, args: &[&str]) -> Option<String> {
    let kc = cp.kubeconfig.display().to_string();
    let mut all = vec!["--kubeconfig", kc.as_str()];
    all.extend_from_slice(args);
    let out = run("kubectl", &all);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

#[tokio::test]
async fn services_route_across_the_clusters_both_ways() {
    let origin = Options::named("origin")
        .with_node(ORIGIN_PODS, &[])
        .expect("origin node images")
        .with_own_network()
        .with_endpoint_slices();
    let provider = Options::named("provider")
        .with_node(PROVIDER_PODS, &[])
        .expect("provider node images")
        .with_own_network()
        .with_endpoint_slices();
    let _fabric = Fabric::between(
        Side {
            pods: net(ORIGIN_PODS),
            seen_as: net(ORIGIN_SEEN),
        },
        Side {
            pods: net(PROVIDER_PODS),
            seen_as: net(PROVIDER_SEEN),
        },
    )
    .expect("the fabric's address translation");
    let remote_remap = format!("--remote-pod-remap={PROVIDER_PODS}={PROVIDER_SEEN}");
    let remap = format!("--remap={ORIGIN_PODS}={ORIGIN_SEEN}");
    // The provider's operator lets the origin's pods, as the fabric presents them, through
    // the tenant's network fence.
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(
        policy.path(),
        format!("tenants:\n  origin:\n    network: {{ingressAllowed: [{ORIGIN_SEEN}]}}\n"),
    )
    .unwrap();
    let policy_flag = format!("--policy={}", policy.path().display());
    let p =
        Peering::start_offloading_on(origin, provider, &[&remote_remap, &remap], &[&policy_flag])
            .await
            .expect("peering");
    p.until_node_ready(WAIT).await;
    p.extend("shop", "{podOffloadingStrategy: LocalAndRemote}");
    p.until_extended("shop", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "{}---\n{}",
            server(
                "backend",
                "{liqo.io/type: virtual-node}",
                "backend-on-the-provider"
            ),
            server(
                "frontdesk",
                "{kubernetes.io/hostname: localhost}",
                "frontdesk-on-the-origin"
            ),
        ),
    );
    let (backend_ip, backend_node) = running(&p, "backend").await;
    let (frontdesk_ip, frontdesk_node) = running(&p, "frontdesk").await;
    println!("origin: backend {backend_ip} on {backend_node}, frontdesk {frontdesk_ip} on {frontdesk_node}");
    assert_eq!(backend_node, "refract-provider", "backend is offloaded");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("{}---\n{}", service("backend"), service("frontdesk")),
    );
    assert_eq!(
        frontdesk_node, "localhost",
        "frontdesk runs on the origin's node"
    );
    let backend_addr: std::net::IpAddr = backend_ip.parse().unwrap();
    assert!(
        IpNet::V4(net(PROVIDER_SEEN)).contains(&backend_addr),
        "the origin sees the offloaded pod at its remapped address, got {backend_ip}"
    );

    // The origin's client → an origin Service whose endpoint runs on the provider.
    let backend_cluster_ip = kubectl_get(
        &p.origin,
        &[
            "-n",
            "shop",
            "service",
            "backend",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
    )
    .unwrap();
    let url = format!("http://{backend_cluster_ip}/");
    let answer = p
        .eventually(WAIT, "frontdesk (origin) reaches Service backend", || {
            try_kubectl(
                &p.origin,
                &[
                    "-n",
                    "shop",
                    "exec",
                    "frontdesk",
                    "--",
                    "timeout",
                    "5",
                    "wget",
                    "-qO-",
                    &url,
                ],
            )
        })
        .await;
    println!("origin pod -> origin Service backend {url} (endpoint offloaded): {answer:?}");
    assert_eq!(answer, "backend-on-the-provider");
    // The provider's pod saw the origin's client at the client's remapped address.
    let backend_log = try_kubectl(&p.origin, &["-n", "shop", "logs", "backend"]).unwrap();
    let frontdesk_seen = seen_as(&frontdesk_ip, ORIGIN_PODS, ORIGIN_SEEN);
    println!("backend's log (through the virtual node): {backend_log:?}");
    assert!(
        backend_log.contains(&frontdesk_seen),
        "the provider pod sees the origin client as {frontdesk_seen}: {backend_log}"
    );

    // The offloaded pod → the origin Service reflected to the provider.
    let twin = "shop-origin";
    let (frontdesk_provider_ip, reflected) = p
        .eventually(
            WAIT,
            "Service frontdesk and its EndpointSlice reflected",
            || {
                let ip = kubectl_get(
                    &p.provider,
                    &[
                        "-n",
                        twin,
                        "service",
                        "frontdesk",
                        "-o",
                        "jsonpath={.spec.clusterIP}",
                    ],
                )?;
                let slices = kubectl_get(
                    &p.provider,
                    &[
                        "-n",
                        twin,
                        "endpointslices.v1.discovery.k8s.io",
                        "-l",
                        "kubernetes.io/service-name=frontdesk",
                        "-o",
                        "jsonpath={.items[*].endpoints[*].addresses[*]}",
                    ],
                )?;
                slices
                    .contains(&frontdesk_seen_by_provider(&frontdesk_ip))
                    .then_some((ip, slices))
            },
        )
        .await;
    println!(
        "provider: Service frontdesk {frontdesk_provider_ip}, reflected endpoints {reflected}"
    );
    let url = format!("http://{frontdesk_provider_ip}/");
    let answer = p
        .eventually(
            WAIT,
            "backend (offloaded) reaches the reflected Service frontdesk",
            || {
                try_kubectl(
                    &p.origin,
                    &[
                        "-n", "shop", "exec", "backend", "--", "timeout", "5", "wget", "-qO-", &url,
                    ],
                )
            },
        )
        .await;
    println!(
        "offloaded pod -> provider Service frontdesk {url} (endpoint at the origin): {answer:?}"
    );
    assert_eq!(answer, "frontdesk-on-the-origin");
    let frontdesk_log = try_kubectl(&p.origin, &["-n", "shop", "logs", "frontdesk"]).unwrap();
    let backend_real = kubectl_get(
        &p.provider,
        &[
            "-n",
            twin,
            "pod",
            "backend",
            "-o",
            "jsonpath={.status.podIP}",
        ],
    )
    .unwrap();
    let backend_seen = seen_as(&backend_real, PROVIDER_PODS, PROVIDER_SEEN);
    println!("frontdesk's log: {frontdesk_log:?}");
    assert!(
        frontdesk_log.contains(&backend_seen),
        "the origin pod sees the offloaded client as {backend_seen}: {frontdesk_log}"
    );

    // The provider's own slices for the reflected Services carry their labels, the tenant's
    // among them: they are not the tenant's, and its quota counts only the reflected ones.
    let slices = kubectl_get(
        &p.provider,
        &[
            "-n",
            twin,
            "endpointslices.v1.discovery.k8s.io",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}{\"\\n\"}{end}",
        ],
    )
    .unwrap();
    println!("EndpointSlices in {twin} on the provider:\n{slices}");
    let reflected_slices = slices
        .lines()
        .filter(|l| l.ends_with("endpointslice.reflection.refract.io"))
        .count();
    assert_eq!(reflected_slices, 2, "backend's and frontdesk's, reflected");
    assert!(
        slices.lines().count() > reflected_slices,
        "the provider made slices of its own for the reflected Services"
    );
    let counted = refract_e2e::metric(
        &p.remote_admin,
        r#"refract_remote_tenant_usage{tenant="origin",resource="objects/EndpointSlice"}"#,
    )
    .await;
    assert_eq!(
        counted, 2.0,
        "the tenant's EndpointSlices, as its quota counts them"
    );

    // Both connections as the tenant's fence on the provider judges them (the test nodes'
    // network plugin does not enforce NetworkPolicy; `netpol` reads it as one that does).
    let fence: serde_json::Value = serde_json::from_str(
        &kubectl_get(
            &p.provider,
            &[
                "-n",
                twin,
                "networkpolicy",
                "refract-tenant-fence",
                "-o",
                "json",
            ],
        )
        .expect("the tenant's network fence"),
    )
    .unwrap();
    let twin_labels: BTreeMap<String, String> = serde_json::from_str(
        &kubectl_get(
            &p.provider,
            &["namespace", twin, "-o", "jsonpath={.metadata.labels}"],
        )
        .unwrap(),
    )
    .unwrap();
    let backend_pod = Endpoint {
        ip: backend_real.parse().unwrap(),
        pod: Some(PodAt {
            namespace: twin.into(),
            namespace_labels: twin_labels,
            labels: [("app".to_string(), "backend".to_string())].into(),
        }),
    };
    let outside = |ip: &str| Endpoint {
        ip: ip.parse().unwrap(),
        pod: None,
    };
    let judged = |from: &Endpoint, to: &Endpoint| {
        allowed(
            std::slice::from_ref(&fence),
            &Connection {
                from,
                to,
                port: 8080,
                protocol: "TCP",
            },
        )
    };
    let cases = [
        (
            "origin client -> offloaded backend",
            judged(&outside(&frontdesk_seen), &backend_pod),
            true,
        ),
        (
            "offloaded backend -> origin server",
            judged(
                &backend_pod,
                &outside(&frontdesk_seen_by_provider(&frontdesk_ip)),
            ),
            true,
        ),
        (
            "an address outside ingressAllowed -> offloaded backend",
            judged(&outside("10.122.0.9"), &backend_pod),
            false,
        ),
    ];
    for (what, got, want) in cases {
        println!(
            "the fence: {what}: {}",
            if got { "allowed" } else { "denied" }
        );
        assert_eq!(got, want, "{what}");
    }
}

/// Waits until origin pod `name` runs; its IP and node.
async fn running(p: &Peering, name: &str) -> (String, String) {
    p.eventually(WAIT, &format!("pod {name} Running and Ready with an IP"), || {
        let out = kubectl_get(
            &p.origin,
            &[
                "-n",
                "shop",
                "pod",
                name,
                "-o",
                "jsonpath={.status.phase} {.status.podIP} {.spec.nodeName} {.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        )?;
        match out.split(' ').collect::<Vec<_>>()[..] {
            ["Running", ip, node, "True"] if !ip.is_empty() => {
                Some((ip.to_string(), node.to_string()))
            }
            _ => None,
        }
    })
    .await
}

/// `ip` (in `real`) as it is seen through the remapping into `seen`.
fn seen_as(ip: &str, real: &str, seen: &str) -> String {
    let rules = refract_core::remap::Remapping(vec![format!("{real}={seen}").parse().unwrap()]);
    rules.map_str(ip)
}

/// The origin pod `ip` as the provider addresses it.
fn frontdesk_seen_by_provider(ip: &str) -> String {
    seen_as(ip, ORIGIN_PODS, ORIGIN_SEEN)
}
