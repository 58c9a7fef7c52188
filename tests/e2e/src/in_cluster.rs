//! Both agents deployed in-cluster from `deploy/` the way users deploy them: their images
//! pulled by reference from a registry (testkit's, on loopback) by real nodes that run kube-proxy (testkit's `with_own_network`), two replicas
//! each with pod networking behind their Services, each under its own ServiceAccount with
//! exactly the RBAC of `deploy/`, no admin kubeconfig, the peering's certificates in Secrets
//! minted by `refract-certs --secret`. The test overlays (`deploy/test/`, plus this run's
//! addresses) change only what a testkit cluster lacks: a load balancer (the remote agent's
//! Service is a NodePort) and policy/v1 (Kubernetes 1.20).

use std::path::{Path, PathBuf};
use std::time::Duration;

use refract_testkit::{ControlPlane, Options};

use crate::{
    eventually, grpcurl, kubectl, kubectl_get, kubectl_stdin, kubectl_stdin_output, run,
    until_node_ready, Certs,
};

/// Two clusters with both agents running in them, connected.
pub struct InCluster {
    /// The origin, with the local agent's two replicas.
    pub origin: ControlPlane,
    /// The provider, with the remote agent's two replicas.
    pub provider: ControlPlane,
    /// The peering's certificate authority and certificates.
    pub certs: Certs,
    /// A client certificate of tenant `origin` for `grpcurl` (its folder).
    pub operator: PathBuf,
    /// Where the origin reaches the remote agent: the provider node's address and the
    /// Service's node port.
    pub remote_endpoint: String,
    /// What `Inspect/ListTenants` said once the tenant was connected.
    pub tenants: String,
    _dir: tempfile::TempDir,
}

impl InCluster {
    /// `grpcurl ... Inspect/ListTenants` through the remote agent's Service, as the operator.
    pub fn list_tenants(&self) -> String {
        self.inspector().list_tenants()
    }

    /// What [`InCluster::list_tenants`] needs, to take to another thread.
    pub fn inspector(&self) -> Inspector {
        Inspector {
            ca: self.certs.dir.join("ca/ca.crt"),
            client: self.operator.clone(),
            endpoint: self.remote_endpoint.clone(),
        }
    }
}

/// The remote agent's Inspect service, called with `grpcurl` as the operator.
#[derive(Clone)]
pub struct Inspector {
    ca: PathBuf,
    client: PathBuf,
    endpoint: String,
}

impl Inspector {
    /// `grpcurl ... Inspect/ListTenants`; its output.
    pub fn list_tenants(&self) -> String {
        list_tenants(&self.ca, &self.client, &self.endpoint)
    }
}

fn list_tenants(ca: &Path, client: &Path, endpoint: &str) -> String {
    let out = run(
        grpcurl(),
        &[
            "-max-time",
            "5",
            "-cacert",
            ca.to_str().unwrap(),
            "-cert",
            client.join("tls.crt").to_str().unwrap(),
            "-key",
            client.join("tls.key").to_str().unwrap(),
            endpoint,
            "refract.v1.Inspect/ListTenants",
        ],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An origin and a provider, each with a real node on a network of its own with kube-proxy,
/// pulling its agent's image from the test's registry.
pub async fn start_clusters() -> (ControlPlane, ControlPlane) {
    let origin_options = Options::named("origin")
        .with_node("10.100.0.0/16", &["local-agent"])
        .expect("origin node images")
        .with_own_network();
    let provider_options = Options::named("provider")
        .with_node("10.200.0.0/16", &["remote-agent"])
        .expect("provider node images")
        .with_own_network();
    tokio::try_join!(
        ControlPlane::start(origin_options),
        ControlPlane::start(provider_options)
    )
    .expect("control planes with real nodes")
}

/// Starts both clusters with real nodes, deploys both agents from `deploy/` and waits until
/// both Deployments are Available and the tenant is connected.
pub async fn deploy() -> InCluster {
    let (origin, provider) = start_clusters().await;
    let dir = tempfile::Builder::new()
        .prefix("refract-in-cluster-")
        .tempdir()
        .unwrap();
    let certs = Certs::new(dir.path());

    // The provider: the remote agent's serving certificate for the address the origin reaches
    // it at (the node's, with the Service's node port), then deploy/remote-agent as it is.
    let provider_node = node_ip(&provider);
    kubectl(&provider, &["create", "namespace", "refract-system"]);
    secret(
        &provider,
        &certs,
        "refract-remote-agent-tls",
        "provider",
        "server",
        &["--ip", &provider_node],
    );
    apply_overlay(&provider, dir.path(), "remote-agent", &[]);
    let remote_endpoint = remote_endpoint(&provider, &provider_node);
    println!("the remote agent's Service: NodePort {remote_endpoint}");

    // The origin: the client and webhook certificates, then deploy/local-agent pointed at it.
    kubectl(&origin, &["create", "namespace", "refract-system"]);
    tenant_certificate_by_two_admins(&origin, &provider, &certs, dir.path()).await;
    // The API server calls the webhook through its Service, checking this name.
    secret(
        &origin,
        &certs,
        "refract-local-agent-webhook-tls",
        "origin-webhook",
        "server",
        &["--dns", "refract-local-agent.refract-system.svc"],
    );
    // The virtual node's kubelet API, at the leading replica's pod IP (the API servers of these
    // clusters, like most, do not check a kubelet's serving certificate).
    secret(
        &origin,
        &certs,
        "refract-local-agent-kubelet-tls",
        "origin-kubelet",
        "server",
        &["--dns", "refract-local-agent.refract-system.svc"],
    );
    use base64::Engine;
    let ca_bundle = base64::engine::general_purpose::STANDARD
        .encode(std::fs::read(certs.dir.join("ca/ca.crt")).unwrap());
    apply_overlay(
        &origin,
        dir.path(),
        "local-agent",
        &[
            args_patch(
                "refract-local-agent",
                deploy_args(
                    "local-agent",
                    &[
                        ("--remote", format!("https://{remote_endpoint}")),
                        ("--home-api-server-host", "127.0.0.1".into()),
                        ("--home-api-server-port", api_port(&origin)),
                    ],
                    &["--remote-pod-remap=10.200.0.0/16=10.71.0.0/16".into()],
                ),
            ),
            serde_json::json!({
                "kind": "MutatingWebhookConfiguration",
                "name": "refract-local-agent",
                "ops": [
                    {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca_bundle},
                    {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": ca_bundle},
                ]
            }),
        ],
    );

    // Both Deployments become Available: the probes pass once each agent has synced.
    for (cp, agent) in [(&provider, "remote-agent"), (&origin, "local-agent")] {
        eventually(
            WAIT,
            &format!("deployment refract-{agent} Available"),
            || {
                let s = kubectl_get(
                    cp,
                    &[
                        "-n",
                        "refract-system",
                        "deployment",
                        &format!("refract-{agent}"),
                        "-o",
                        "jsonpath={.status.availableReplicas}",
                    ],
                )?;
                (s == "2").then_some(())
            },
            || agent_state(cp, agent),
        )
        .await;
    }
    // Each replica runs the image its node pulled from the registry: the kubelet reports the
    // digest the registry served (an imported image would have no repository digest).
    for (cp, agent) in [(&provider, "remote-agent"), (&origin, "local-agent")] {
        let image = pushed_image(agent);
        let ids = kubectl(
            cp,
            &[
                "-n",
                "refract-system",
                "get",
                "pods",
                "-l",
                &format!("app.kubernetes.io/name=refract-{agent}"),
                "-o",
                "jsonpath={range .items[*]}{.status.containerStatuses[0].imageID}{\"\\n\"}{end}",
            ],
        );
        let repository = image.rsplit_once(':').unwrap().0;
        for id in ids.lines() {
            assert!(
                id.starts_with(&format!("{repository}@sha256:")),
                "{agent} runs {id:?}, not {image} from the registry"
            );
        }
        println!(
            "{agent}: both replicas run {image}, pulled as {}",
            ids.lines().next().unwrap_or_default()
        );
    }
    let pod_sa = kubectl_get(
        &origin,
        &[
            "-n",
            "refract-system",
            "pods",
            "-o",
            "jsonpath={.items[0].spec.serviceAccountName}",
        ],
    )
    .unwrap();
    assert_eq!(pod_sa, "refract-local-agent");

    // The pair is connected: the remote agent shows the tenant to grpcurl with its certificate.
    let client = certs.issue("operator", "origin", "client", &[]);
    let connected = || {
        let text = list_tenants(&certs.dir.join("ca/ca.crt"), &client, &remote_endpoint);
        text.contains("\"connected\": true").then_some(text)
    };
    let tenants = eventually(WAIT, "tenant origin connected", connected, || {
        agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent")
    })
    .await;
    // Connected is not yet schedulable: the virtual node turns Ready when the remote agent's
    // first capacity report arrives, a moment after the link comes up. A user waits for it.
    until_node_ready(&origin, WAIT, || {
        agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent")
    })
    .await;
    InCluster {
        origin,
        provider,
        certs,
        operator: client,
        remote_endpoint,
        tenants,
        _dir: dir,
    }
}

/// The tenant's client certificate as two admins make it, neither holding the other's
/// kubeconfig or key: the origin's admin makes the key and a request (`refract-certs
/// request`), the provider's admin submits the request as a CertificateSigningRequest and
/// approves it with `kubectl certificate approve`, the remote agent signs it with the peering
/// CA kept in the provider's Secret `refract-peering-ca`, and the origin's admin puts the
/// certificate beside the key in the Secret deploy/local-agent mounts. The CA key goes to the
/// provider only; the tenant's key to the origin only.
async fn tenant_certificate_by_two_admins(
    origin: &ControlPlane,
    provider: &ControlPlane,
    certs: &Certs,
    dir: &Path,
) {
    let ca = certs.dir.join("ca");
    let ca_crt = ca.join("ca.crt").display().to_string();
    // The provider's admin keeps the peering CA in the provider (cert-manager's CA layout).
    kubectl(
        provider,
        &[
            "-n",
            "refract-system",
            "create",
            "secret",
            "tls",
            "refract-peering-ca",
            "--cert",
            &ca_crt,
            "--key",
            ca.join("ca.key").to_str().unwrap(),
        ],
    );
    // The origin's admin: a key that stays here, and a request to send.
    let origin_admin = dir.join("origin-admin");
    let out = run(
        crate::bin("refract-certs"),
        &[
            "request",
            "--cluster-id",
            "origin",
            "--out",
            origin_admin.to_str().unwrap(),
            "--manifest",
        ],
    );
    assert!(
        out.status.success(),
        "refract-certs request: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "$ refract-certs request --cluster-id origin --out origin-admin --manifest\n{}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    // The provider's admin: the request (no key) submitted and approved.
    let manifest = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!manifest.contains("PRIVATE KEY"));
    let created = kubectl_stdin_output(provider, &["create", "-f", "-"], &manifest);
    assert!(
        created.status.success(),
        "kubectl create csr: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    println!(
        "$ kubectl create -f csr.yaml\n{}",
        String::from_utf8_lossy(&created.stdout).trim()
    );
    println!(
        "$ kubectl certificate approve refract-tenant-origin\n{}",
        kubectl(
            provider,
            &["certificate", "approve", "refract-tenant-origin"]
        )
        .trim()
    );
    let signed = eventually(
        WAIT,
        "the remote agent to sign refract-tenant-origin",
        || {
            kubectl_get(
                provider,
                &[
                    "csr",
                    "refract-tenant-origin",
                    "-o",
                    "jsonpath={.status.certificate}",
                ],
            )
            .filter(|c| !c.is_empty())
        },
        || {
            kubectl(provider, &["get", "csr", "-o", "wide"])
                + &agent_state(provider, "remote-agent")
        },
    )
    .await;
    use base64::Engine;
    let cert = base64::engine::general_purpose::STANDARD
        .decode(signed.trim())
        .expect("the certificate is base64");
    std::fs::write(origin_admin.join("tls.crt"), &cert).unwrap();
    println!(
        "$ kubectl get csr refract-tenant-origin\n{}",
        kubectl(provider, &["get", "csr", "refract-tenant-origin"]).trim()
    );
    // A request for more than one identity (a Refract name and a DNS name of the provider's
    // API), approved by mistake, is refused by the signer, not signed.
    let greedy = dir.join("greedy");
    std::fs::create_dir_all(&greedy).unwrap();
    let out = run(
        "openssl",
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            greedy.join("tls.key").to_str().unwrap(),
            "-out",
            greedy.join("tls.csr").to_str().unwrap(),
            "-subj",
            "/CN=mallory",
            "-addext",
            "subjectAltName=URI:spiffe://refract/cluster/mallory,DNS:kubernetes.default.svc",
        ],
    );
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let request = std::fs::read(greedy.join("tls.csr")).unwrap();
    let manifest = format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: refract-tenant-mallory}}\nspec:\n  signerName: refract.io/tenant-client\n  usages: [client auth]\n  request: {}\n",
        base64::engine::general_purpose::STANDARD.encode(request)
    );
    kubectl_stdin(provider, &["create", "-f", "-"], &manifest);
    kubectl(
        provider,
        &["certificate", "approve", "refract-tenant-mallory"],
    );
    let refused = eventually(
        WAIT,
        "the remote agent to refuse refract-tenant-mallory",
        || {
            kubectl_get(
                provider,
                &[
                    "csr",
                    "refract-tenant-mallory",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Failed\")].message}",
                ],
            )
            .filter(|m| !m.is_empty())
        },
        || kubectl(provider, &["get", "csr", "-o", "wide"]),
    )
    .await;
    println!("refract-tenant-mallory (two names, approved): Failed: {refused}");
    assert!(
        refused.contains("exactly one Refract identity"),
        "{refused}"
    );
    let certificate = kubectl(
        provider,
        &[
            "get",
            "csr",
            "refract-tenant-mallory",
            "-o",
            "jsonpath={.status.certificate}",
        ],
    );
    assert!(
        certificate.trim().is_empty(),
        "a refused request got a certificate"
    );

    // The origin's admin: the certificate and the CA certificate beside the key.
    kubectl(
        origin,
        &[
            "-n",
            "refract-system",
            "create",
            "secret",
            "generic",
            "refract-local-agent-tls",
            &format!(
                "--from-file=tls.crt={}",
                origin_admin.join("tls.crt").display()
            ),
            &format!(
                "--from-file=tls.key={}",
                origin_admin.join("tls.key").display()
            ),
            &format!("--from-file=ca.crt={ca_crt}"),
        ],
    );
}

/// How long each step may take.
pub const WAIT: Duration = Duration::from_secs(120);

/// The workspace's `deploy/` folder.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `target` relative to `from` (both absolute): kustomize takes bases by relative path only.
fn relative(from: &Path, target: &Path) -> String {
    let up = from.components().count() - 1;
    let target = target.canonicalize().expect("deploy folder");
    format!(
        "{}{}",
        "../".repeat(up),
        target.display().to_string().trim_start_matches('/')
    )
}

/// Writes an overlay of `deploy/test/<agent>` with this run's JSON patches and applies it.
/// `agent`'s image as pushed to the test's registry (testkit pushes it once per process).
fn pushed_image(agent: &str) -> String {
    let catalog = refract_testkit::images::catalog(true).expect("the agents' images");
    refract_testkit::images::reference(&catalog, agent).unwrap()
}

/// Applies `deploy/test/<agent>` with the agent's image from the test's registry, as a user
/// points deploy/'s kustomization at their registry (an `images:` entry), and `patches`.
fn apply_overlay(cp: &ControlPlane, dir: &Path, agent: &str, patches: &[serde_json::Value]) {
    let overlay = dir.join(agent);
    std::fs::create_dir_all(&overlay).unwrap();
    let base = relative(&overlay, &deploy_dir().join("test").join(agent));
    write_overlay(&overlay, agent, &[base], &[], patches);
    kubectl(cp, &["apply", "-k", overlay.to_str().unwrap()]);
}

/// Applies the kustomization `deploy/<base>` (an overlay of deploy/<agent>, such as
/// `cert-manager/provider`) with what `deploy/test/<agent>` changes for a testkit cluster (its
/// files copied beside: an overlay cannot reach files outside its folder), the agent's image
/// from the test's registry, and `patches`.
pub fn apply_test_overlay_of(
    cp: &ControlPlane,
    dir: &Path,
    base: &str,
    agent: &str,
    patches: &[serde_json::Value],
) {
    let overlay = dir.join(base.replace('/', "-"));
    std::fs::create_dir_all(&overlay).unwrap();
    let test_dir = deploy_dir().join("test").join(agent);
    let test: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(test_dir.join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let copied = |list: &serde_json::Value| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().or_else(|| v["path"].as_str()))
            .filter(|file| !file.starts_with(".."))
            .map(|file| {
                std::fs::copy(test_dir.join(file), overlay.join(file)).unwrap();
                file.to_string()
            })
            .collect()
    };
    let mut resources = vec![relative(&overlay, &deploy_dir().join(base))];
    resources.extend(copied(&test["resources"]));
    let file_patches = copied(&test["patches"]);
    write_overlay(&overlay, agent, &resources, &file_patches, patches);
    kubectl(cp, &["apply", "-k", overlay.to_str().unwrap()]);
}

/// Writes `overlay/kustomization.yaml`: `resources`, the agent's image from the test's
/// registry, the patch files `file_patches` (already in the folder) and the JSON `patches`.
fn write_overlay(
    overlay: &Path,
    agent: &str,
    resources: &[String],
    file_patches: &[String],
    patches: &[serde_json::Value],
) {
    let image = pushed_image(agent);
    let (name, tag) = image.rsplit_once(':').unwrap();
    let mut kustomization =
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
            .to_string();
    for resource in resources {
        kustomization.push_str(&format!("  - {resource}\n"));
    }
    kustomization.push_str(&format!(
        "images:\n  - name: refract.local/{agent}\n    newName: {name}\n    newTag: \"{tag}\"\npatches:\n"
    ));
    for file in file_patches {
        kustomization.push_str(&format!("  - path: {file}\n"));
    }
    for (i, patch) in patches.iter().enumerate() {
        let file = format!("patch-{i}.json");
        std::fs::write(
            overlay.join(&file),
            serde_json::to_vec_pretty(&patch["ops"]).unwrap(),
        )
        .unwrap();
        kustomization.push_str(&format!(
            "  - path: {file}\n    target: {{kind: {}, name: {}}}\n",
            patch["kind"].as_str().unwrap(),
            patch["name"].as_str().unwrap()
        ));
    }
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
}

/// The arguments `deploy/<agent>/deployment.yaml` gives the agent's container, each flag in
/// `changes` given this run's value instead, then `extra`.
pub fn deploy_args(agent: &str, changes: &[(&str, String)], extra: &[String]) -> Vec<String> {
    let path = deploy_dir().join(agent).join("deployment.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let deployment: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    let mut out: Vec<String> = args
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            let flag = a.split('=').next().unwrap();
            match changes.iter().find(|(f, _)| *f == flag) {
                Some((f, v)) => format!("{f}={v}"),
                None => a.to_string(),
            }
        })
        .collect();
    for (flag, _) in changes {
        assert!(
            out.iter().any(|a| a.starts_with(&format!("{flag}="))),
            "{flag} is not among deploy/{agent}'s arguments"
        );
    }
    out.extend_from_slice(extra);
    out
}

/// The JSON patch that gives a Deployment's only container `args`.
pub fn args_patch(deployment: &str, args: Vec<String>) -> serde_json::Value {
    serde_json::json!({
        "kind": "Deployment",
        "name": deployment,
        "ops": [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    })
}

/// Where the origin reaches the remote agent: the provider node's address and the node port
/// of the `refract-remote-agent` Service's `grpc` port.
pub fn remote_endpoint(provider: &ControlPlane, provider_node: &str) -> String {
    let node_port = kubectl(
        provider,
        &[
            "-n",
            "refract-system",
            "get",
            "service",
            "refract-remote-agent",
            "-o",
            "jsonpath={.spec.ports[?(@.name==\"grpc\")].nodePort}",
        ],
    );
    format!("{provider_node}:{}", node_port.trim())
}

/// The address of `cp`'s real node (its InternalIP, on its own network).
pub fn node_ip(cp: &ControlPlane) -> String {
    cp.node
        .as_ref()
        .and_then(|n| n.network.as_ref())
        .expect("a real node with a network of its own")
        .node_ip()
        .to_string()
}

/// The pod IP of the `refract-<agent>` replica named by Lease `lease` in refract-system (the
/// one leading the peering, or serving the tenant).
pub fn lease_holder_ip(cp: &ControlPlane, lease: &str) -> String {
    let holder = kubectl(
        cp,
        &[
            "-n",
            "refract-system",
            "get",
            "lease",
            lease,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    );
    kubectl(
        cp,
        &[
            "-n",
            "refract-system",
            "get",
            "pod",
            holder.trim(),
            "-o",
            "jsonpath={.status.podIP}",
        ],
    )
    .trim()
    .to_string()
}

/// The port of `cp`'s API server (on 127.0.0.1).
pub fn api_port(cp: &ControlPlane) -> String {
    cp.server.rsplit(':').next().unwrap().to_string()
}

/// The peering's certificate `name` as a Secret in `refract-system` of `cp`.
fn secret(cp: &ControlPlane, certs: &Certs, name: &str, id: &str, role: &str, extra: &[&str]) {
    let yaml = certs.issue_secret(name, "refract-system", id, role, extra);
    kubectl_stdin(cp, &["apply", "-f", "-"], &yaml);
}

/// What an operator looks at when an agent does not come up: its pod and its log.
pub fn agent_state(cp: &ControlPlane, agent: &str) -> String {
    let kc = cp.kubeconfig.display().to_string();
    let describe = run(
        "kubectl",
        &[
            "--kubeconfig",
            &kc,
            "-n",
            "refract-system",
            "describe",
            "pods",
        ],
    );
    let logs = run(
        "kubectl",
        &[
            "--kubeconfig",
            &kc,
            "-n",
            "refract-system",
            "logs",
            &format!("deployment/refract-{agent}"),
            "--tail=60",
        ],
    );
    format!(
        "--- {agent} pods ---\n{}\n--- {agent} log ---\n{}{}",
        String::from_utf8_lossy(&describe.stdout),
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    )
}

/// The logs of every replica of `refract-<agent>` that is not being deleted. A replica a
/// rollout replaced can linger a while as a pod being deleted whose container is gone, and
/// `kubectl logs -l` then fails as a whole ("container ... is terminated").
pub fn agent_logs(cp: &ControlPlane, agent: &str) -> String {
    let selector = format!("app.kubernetes.io/name=refract-{agent}");
    let pods = kubectl(
        cp,
        &[
            "-n",
            "refract-system",
            "get",
            "pods",
            "-l",
            &selector,
            "-o",
            "json",
        ],
    );
    let pods: serde_json::Value = serde_json::from_str(&pods).expect("kubectl prints JSON");
    let live = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|pod| pod["metadata"]["name"].as_str());
    live.map(|pod| {
        kubectl(
            cp,
            &["-n", "refract-system", "logs", pod, "--tail=-1", "--prefix"],
        )
    })
    .collect()
}
