//! Both agents running in-cluster, deployed from `deploy/` the way users deploy them: their
//! images imported into real nodes, two replicas each with pod networking behind their
//! Services (kube-proxy on nodes with a network of their own), each under its own
//! ServiceAccount with exactly the RBAC of `deploy/`, no admin kubeconfig, the peering's
//! certificates in Secrets minted by `refract-certs --secret`. The test overlays
//! (`deploy/test/`, plus this run's addresses) change only what a testkit cluster lacks: a
//! load balancer (the remote agent's Service is a NodePort) and policy/v1 (Kubernetes 1.20).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use refract_e2e::churn::{self, ProviderWrites};
use refract_e2e::{
    busybox, can_i, eventually, grpcurl, http_get, kubectl, kubectl_get, kubectl_stdin, run,
    until_extended, Certs,
};
use refract_testkit::{ControlPlane, Options};

const WAIT: Duration = Duration::from_secs(120);

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
fn apply_overlay(cp: &ControlPlane, dir: &Path, agent: &str, patches: &[serde_json::Value]) {
    let overlay = dir.join(agent);
    std::fs::create_dir_all(&overlay).unwrap();
    let mut kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\npatches:\n",
        relative(&overlay, &deploy_dir().join("test").join(agent))
    );
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
    kubectl(cp, &["apply", "-k", overlay.to_str().unwrap()]);
}

/// The arguments `deploy/<agent>/deployment.yaml` gives the agent's container, each flag in
/// `changes` given this run's value instead, then `extra`.
fn deploy_args(agent: &str, changes: &[(&str, String)], extra: &[String]) -> Vec<String> {
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
fn args_patch(deployment: &str, args: Vec<String>) -> serde_json::Value {
    serde_json::json!({
        "kind": "Deployment",
        "name": deployment,
        "ops": [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    })
}

/// The address of `cp`'s real node (its InternalIP, on its own network).
fn node_ip(cp: &ControlPlane) -> String {
    cp.node
        .as_ref()
        .and_then(|n| n.network.as_ref())
        .expect("a real node with a network of its own")
        .node_ip()
        .to_string()
}

/// The pod IP of the `refract-<agent>` replica named by Lease `lease` in refract-system (the
/// one leading the peering, or serving the tenant).
fn lease_holder_ip(cp: &ControlPlane, lease: &str) -> String {
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

fn api_port(cp: &ControlPlane) -> String {
    cp.server.rsplit(':').next().unwrap().to_string()
}

/// The peering's certificate `name` as a Secret in `refract-system` of `cp`.
fn secret(cp: &ControlPlane, certs: &Certs, name: &str, id: &str, role: &str, extra: &[&str]) {
    let yaml = certs.issue_secret(name, "refract-system", id, role, extra);
    kubectl_stdin(cp, &["apply", "-f", "-"], &yaml);
}

/// What an operator looks at when an agent does not come up: its pod and its log.
fn agent_state(cp: &ControlPlane, agent: &str) -> String {
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

/// The logs of every replica of `refract-<agent>`.
fn agent_logs(cp: &ControlPlane, agent: &str) -> String {
    kubectl(
        cp,
        &[
            "-n",
            "refract-system",
            "logs",
            "-l",
            &format!("app.kubernetes.io/name=refract-{agent}"),
            "--tail=-1",
            "--prefix",
        ],
    )
}

#[tokio::test]
async fn both_agents_run_in_cluster_from_deploy_under_their_own_identities() {
    let origin_options = Options::named("origin")
        .with_node("10.100.0.0/16", &["local-agent"])
        .expect("origin node images")
        .with_own_network();
    let provider_options = Options::named("provider")
        .with_node("10.200.0.0/16", &["remote-agent"])
        .expect("provider node images")
        .with_own_network();
    let (origin, provider) = tokio::try_join!(
        ControlPlane::start(origin_options),
        ControlPlane::start(provider_options)
    )
    .expect("control planes with real nodes");
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
    let node_port = kubectl(
        &provider,
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
    let remote_endpoint = format!("{provider_node}:{}", node_port.trim());
    println!("the remote agent's Service: NodePort {remote_endpoint}");

    // The origin: the client and webhook certificates, then deploy/local-agent pointed at it.
    kubectl(&origin, &["create", "namespace", "refract-system"]);
    secret(
        &origin,
        &certs,
        "refract-local-agent-tls",
        "origin",
        "client",
        &[],
    );
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
        let out = run(
            grpcurl(),
            &[
                "-max-time",
                "5",
                "-cacert",
                certs.dir.join("ca/ca.crt").to_str().unwrap(),
                "-cert",
                client.join("tls.crt").to_str().unwrap(),
                "-key",
                client.join("tls.key").to_str().unwrap(),
                &remote_endpoint,
                "refract.v1.Inspect/ListTenants",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("\"connected\": true").then_some(text)
    };
    let tenants = eventually(WAIT, "tenant origin connected", connected, || {
        agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent")
    })
    .await;
    println!("grpcurl Inspect/ListTenants:\n{tenants}");

    // A namespace offloaded: a ConfigMap reflected, a Deployment's pods running as real
    // containers on the provider's node and Running at the origin on the virtual node.
    kubectl_stdin(
        &origin,
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: apps}
spec: {podOffloadingStrategy: Remote}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: apps}
data: {greeting: hello}
"#,
    );
    until_extended(&origin, "apps", WAIT, || {
        agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent")
    })
    .await;
    kubectl_stdin(
        &origin,
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
      containers:
        - name: web
          image: "{}"
          command: [sh, -c, 'echo "served by $(hostname)"; trap "exit 0" TERM; while true; do sleep 1; done']
          resources: {{requests: {{cpu: 50m, memory: 16Mi}}}}
"#,
            busybox()
        ),
    );
    eventually(
        WAIT,
        "ConfigMap settings on the provider",
        || {
            let v = kubectl_get(
                &provider,
                &[
                    "-n",
                    "apps-origin",
                    "configmap",
                    "settings",
                    "-o",
                    "jsonpath={.data.greeting}",
                ],
            )?;
            (v == "hello").then_some(())
        },
        || agent_state(&provider, "remote-agent"),
    )
    .await;
    // The tenant's quota in its twin namespace, written under deploy/'s RBAC.
    eventually(
        WAIT,
        "the twin namespace's ResourceQuota",
        || {
            let pods = kubectl_get(
                &provider,
                &[
                    "-n",
                    "apps-origin",
                    "resourcequota",
                    "refract-tenant-quota",
                    "-o",
                    "jsonpath={.spec.hard.pods}",
                ],
            )?;
            // Kubernetes writes quantities its own way: 1000 is 1k.
            (pods == "1k").then_some(())
        },
        || agent_state(&provider, "remote-agent"),
    )
    .await;
    // Its network fence, written under deploy/'s RBAC: the tenant's own namespaces in.
    eventually(
        WAIT,
        "the twin namespace's NetworkPolicy",
        || {
            let from = kubectl_get(
                &provider,
                &[
                    "-n",
                    "apps-origin",
                    "networkpolicy",
                    "refract-tenant-fence",
                    "-o",
                    "jsonpath={.spec.ingress[0].from[0].namespaceSelector.matchLabels}",
                ],
            )?;
            (from == r#"{"refract.io/tenant":"origin"}"#).then_some(())
        },
        || agent_state(&provider, "remote-agent"),
    )
    .await;
    let origin_pods = eventually(
        WAIT,
        "two web pods Running at the origin on the virtual node",
        || {
            let out = kubectl_get(&origin, &["-n", "apps", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName} {.status.podIP}{\"\\n\"}{end}"])?;
            let lines: Vec<String> = out.lines().map(str::to_string).collect();
            (lines.len() == 2
                && lines
                    .iter()
                    .all(|l| l.contains(" Running refract-provider 10.71.")))
            .then_some(lines)
        },
        || agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent"),
    )
    .await;
    println!("origin pods:\n{}", origin_pods.join("\n"));
    let provider_pods = kubectl(
        &provider,
        &["-n", "apps-origin", "get", "pods", "-o", "wide"],
    );
    println!("provider pods:\n{provider_pods}");
    let first = origin_pods[0].split(' ').next().unwrap();
    let output = eventually(
        WAIT,
        "the container's output on the provider",
        || {
            let logs = kubectl_get(
                &provider,
                &[
                    "--raw",
                    &format!("/api/v1/namespaces/apps-origin/pods/{first}/log"),
                ],
            )?;
            logs.contains("served by").then_some(logs)
        },
        || agent_state(&provider, "remote-agent"),
    )
    .await;
    println!("kubectl logs {first} (provider): {}", output.trim());

    // The same log and an exec from the origin, through the in-cluster agent's kubelet API.
    let origin_logs = eventually(
        WAIT,
        "kubectl logs at the origin",
        || {
            let logs = kubectl_get(
                &origin,
                &[
                    "--raw",
                    &format!("/api/v1/namespaces/apps/pods/{first}/log"),
                ],
            )?;
            logs.contains("served by").then_some(logs)
        },
        || agent_state(&origin, "local-agent"),
    )
    .await;
    println!("kubectl logs {first} (origin): {}", origin_logs.trim());
    assert_eq!(origin_logs.trim(), output.trim());
    let exec = kubectl(
        &origin,
        &[
            "-n",
            "apps",
            "exec",
            first,
            "--",
            "sh",
            "-c",
            "echo exec from the origin on $(hostname)",
        ],
    );
    println!("kubectl exec {first} (origin): {}", exec.trim());
    assert_eq!(exec.trim(), format!("exec from the origin on {first}"));

    // Pod stats at the origin from the provider's metrics.k8s.io, read by the in-cluster agent
    // as the tenant with deploy/'s RBAC (no nodes/proxy anywhere).
    let bridge = refract_e2e::metrics_api::bridge_address(&provider).unwrap();
    let _metrics = refract_e2e::metrics_api::serve(&provider, "localhost", bridge)
        .await
        .expect("the provider's metrics API");
    let stats = eventually(
        WAIT,
        "the offloaded pod's memory in the virtual node's stats",
        || {
            let raw = kubectl_get(
                &origin,
                &[
                    "--raw",
                    "/api/v1/nodes/refract-provider/proxy/stats/summary",
                ],
            )?;
            let v: serde_json::Value = serde_json::from_str(&raw).ok()?;
            let pod = v["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["name"] == first && p["podRef"]["namespace"] == "apps")?;
            let memory = pod["memory"]["workingSetBytes"].as_u64()?;
            (memory > 0).then(|| pod.to_string())
        },
        || agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent"),
    )
    .await;
    println!(
        "stats/summary at the origin for {first} (metrics.k8s.io, read as the tenant): {stats}"
    );

    // The remote agent's own identity writes no tenant object; each tenant's, in its own
    // namespaces only.
    let agent = "system:serviceaccount:refract-system:refract-remote-agent";
    let tenant = "system:serviceaccount:refract-system:tenant-origin";
    for (user, verb, what, ns, answer) in [
        (agent, "create", "pods", "apps-origin", "no"),
        (agent, "create", "pods/exec", "apps-origin", "no"),
        (agent, "create", "secrets", "kube-system", "no"),
        (agent, "delete", "pods", "kube-system", "no"),
        (agent, "create", "rolebindings", "apps-origin", "yes"),
        (agent, "get", "nodes/proxy", "default", "no"),
        (tenant, "get", "nodes/proxy", "default", "no"),
        (tenant, "list", "pods.metrics.k8s.io", "apps-origin", "yes"),
        (tenant, "list", "pods.metrics.k8s.io", "kube-system", "no"),
        (tenant, "create", "pods", "apps-origin", "yes"),
        (tenant, "create", "pods/exec", "apps-origin", "yes"),
        (tenant, "create", "pods", "kube-system", "no"),
        (tenant, "get", "secrets", "kube-system", "no"),
        (tenant, "patch", "resourcequotas", "apps-origin", "no"),
    ] {
        assert_eq!(
            can_i(&provider, user, verb, what, ns),
            answer,
            "can {user} {verb} {what} in {ns}?"
        );
    }

    // Neither agent was refused anything by its API server.
    for (cp, agent) in [(&origin, "local-agent"), (&provider, "remote-agent")] {
        let log = agent_logs(cp, agent);
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
            .collect();
        assert!(
            refused.is_empty(),
            "{agent} was refused by its API server:\n{}",
            refused.join("\n")
        );
    }

    // /metrics names tenants: only a token its cluster accepts, whose user may `get`
    // /metrics, reads it; Prometheus' account is given that right by deploy/monitoring.
    // The replica serving the tenant, at its pod IP (the machine routes the node's pods).
    let admin = format!(
        "{}:9090",
        lease_holder_ip(&provider, "refract-tenant-origin")
    );
    assert_eq!(
        http_get(&admin, "/readyz", None).await.0,
        200,
        "probes stay open"
    );
    let (status, body) = http_get(&admin, "/metrics", None).await;
    println!("GET /metrics without a token: {status} {}", body.trim());
    assert_eq!(status, 401);
    kubectl(&provider, &["create", "namespace", "monitoring"]);
    for account in ["prometheus", "nobody"] {
        kubectl(
            &provider,
            &["-n", "monitoring", "create", "serviceaccount", account],
        );
    }
    let reader = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/monitoring/metrics-reader.yaml"
    );
    kubectl(&provider, &["apply", "-f", reader]);
    let nobody = account_token(&provider, "monitoring", "nobody").await;
    let (status, body) = http_get(&admin, "/metrics", Some(&nobody)).await;
    println!(
        "GET /metrics as monitoring/nobody: {status} {}",
        body.trim()
    );
    assert_eq!(status, 403);
    let prometheus = account_token(&provider, "monitoring", "prometheus").await;
    let (status, body) = http_get(&admin, "/metrics", Some(&prometheus)).await;
    println!("GET /metrics as monitoring/prometheus: {status}");
    assert_eq!(status, 200);
    assert!(body.contains("refract_remote_tenant_usage"), "{body}");

    rollouts_during_a_burst(&origin, &provider).await;
}

/// `kubectl rollout restart` of each agent while 1,000 origin ConfigMaps change: the provider
/// ends with exactly the origin's state, written once per change and never with what it held,
/// and its pods are the same containers. Two replicas each, rolled as deploy/ rolls them
/// (`maxSurge: 1`, `maxUnavailable: 0`): a new replica is up before an old one stops, and a
/// stopping replica hands its Leases over (the local agent's peering, the remote agent's
/// tenants and controller), so no two lead at once.
async fn rollouts_during_a_burst(origin: &ControlPlane, provider: &ControlPlane) {
    const OBJECTS: usize = 1000;
    let origin_api: Api<ConfigMap> = Api::namespaced(origin.client().await.unwrap(), "apps");
    let provider_client = provider.client().await.unwrap();
    let provider_api: Api<ConfigMap> = Api::namespaced(provider_client.clone(), "apps-origin");
    let writes = ProviderWrites::watch(provider_client, "apps-origin");
    churn::create(&origin_api, OBJECTS).await;
    churn::converged(&provider_api, OBJECTS, 0, WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods = churn::provider_pods(provider, "apps-origin");
    for (round, cp, agent) in [(1, origin, "local-agent"), (2, provider, "remote-agent")] {
        let before = writes.count();
        let churning = {
            let origin_api = origin_api.clone();
            tokio::spawn(async move { churn::churn(&origin_api, OBJECTS, round).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let deployment = format!("deployment/refract-{agent}");
        let started = std::time::Instant::now();
        kubectl(
            cp,
            &["-n", "refract-system", "rollout", "restart", &deployment],
        );
        kubectl(
            cp,
            &[
                "-n",
                "refract-system",
                "rollout",
                "status",
                &deployment,
                "--timeout=120s",
            ],
        );
        let rolled = started.elapsed();
        churning.await.unwrap();
        let took = churn::converged(&provider_api, OBJECTS, round, WAIT).await;
        // Late duplicates would show within a moment of converging.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (written, duplicates) = (writes.count() - before, writes.duplicates());
        let pods_after = churn::provider_pods(provider, "apps-origin");
        println!(
            "kubectl rollout restart {deployment} during a churn of {OBJECTS}: rolled out in {rolled:.1?}, the provider converged {took:.1?} after the churn ended; provider writes {written}, duplicate writes {}, provider pods unchanged: {}",
            duplicates.len(),
            pods_after == pods
        );
        assert!(
            duplicates.is_empty(),
            "{agent} rollout: writes that changed nothing: {duplicates:?}"
        );
        assert_eq!(
            written, OBJECTS as u64,
            "{agent} rollout: one write per changed object"
        );
        assert_eq!(
            pods_after, pods,
            "{agent} rollout: the provider pods changed or restarted"
        );
    }
}

/// The token of ServiceAccount `namespace/name`, from the Secret Kubernetes 1.20 makes for it.
async fn account_token(cp: &ControlPlane, namespace: &str, name: &str) -> String {
    use base64::Engine as _;
    let encoded = eventually(
        WAIT,
        &format!("a token Secret for {namespace}/{name}"),
        || {
            let secret = kubectl_get(
                cp,
                &[
                    "-n",
                    namespace,
                    "serviceaccount",
                    name,
                    "-o",
                    "jsonpath={.secrets[0].name}",
                ],
            )
            .filter(|s| !s.is_empty())?;
            kubectl_get(
                cp,
                &[
                    "-n",
                    namespace,
                    "secret",
                    &secret,
                    "-o",
                    "jsonpath={.data.token}",
                ],
            )
            .filter(|t| !t.is_empty())
        },
        String::new,
    )
    .await;
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
    )
    .unwrap()
}
