//! Both agents running in-cluster, deployed from `deploy/` the way users deploy them (see
//! `refract_e2e::in_cluster`): a namespace offloaded, pods running on the provider's node,
//! logs, exec and stats at the origin, each agent's identity fenced, `/metrics` behind the
//! cluster's tokens, `kubectl rollout restart` of each agent during a burst, and `refractctl
//! status` and `unpeer` of this peering that refractctl did not make.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use refract_e2e::churn::{self, ProviderWrites};
use refract_e2e::in_cluster::{self, agent_logs, agent_state, lease_holder_ip, WAIT};
use refract_e2e::{
    bin, busybox, can_i, eventually, http_get, kubectl, kubectl_get, kubectl_stdin, run,
    until_extended,
};
use refract_testkit::ControlPlane;

#[tokio::test]
async fn both_agents_run_in_cluster_from_deploy_under_their_own_identities() {
    let pair = in_cluster::deploy().await;
    let (origin, provider) = (&pair.origin, &pair.provider);
    let tenants = &pair.tenants;
    println!("grpcurl Inspect/ListTenants:\n{tenants}");

    // refractctl sees a peering applied with `kubectl apply -k` as it sees its own: the same
    // labels, the provider from the agent's --remote-cluster-id, deploy/'s Secret names.
    let okc = origin.kubeconfig.display().to_string();
    let status = run(
        bin("refractctl"),
        &["status", "--origin-kubeconfig", &okc, "-o", "json"],
    );
    let report = String::from_utf8_lossy(&status.stdout).into_owned();
    println!(
        "$ refractctl status -o json (a kubectl apply -k peering)\n{report}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&report).expect("status -o json");
    let peering = &report["peerings"][0];
    assert_eq!(peering["provider"], "provider", "{report}");
    assert_eq!(
        peering["localAgent"]["deployment"],
        "refract-system/refract-local-agent"
    );
    assert_eq!(peering["link"]["state"], "connected", "{report}");
    assert_eq!(status.status.code(), Some(0), "status of a working peering");

    // A namespace offloaded: a ConfigMap reflected, a Deployment's pods running as real
    // containers on the provider's node and Running at the origin on the virtual node.
    kubectl_stdin(
        origin,
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
    until_extended(origin, "apps", WAIT, || {
        agent_state(origin, "local-agent") + &agent_state(provider, "remote-agent")
    })
    .await;
    kubectl_stdin(
        origin,
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
                provider,
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
        || agent_state(provider, "remote-agent"),
    )
    .await;
    // The tenant's quota in its twin namespace, written under deploy/'s RBAC.
    eventually(
        WAIT,
        "the twin namespace's ResourceQuota",
        || {
            let pods = kubectl_get(
                provider,
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
        || agent_state(provider, "remote-agent"),
    )
    .await;
    // Its network fence, written under deploy/'s RBAC: the tenant's own namespaces in.
    eventually(
        WAIT,
        "the twin namespace's NetworkPolicy",
        || {
            let from = kubectl_get(
                provider,
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
        || agent_state(provider, "remote-agent"),
    )
    .await;
    let origin_pods = eventually(
        WAIT,
        "two web pods Running at the origin on the virtual node",
        || {
            let out = kubectl_get(origin, &["-n", "apps", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName} {.status.podIP}{\"\\n\"}{end}"])?;
            let lines: Vec<String> = out.lines().map(str::to_string).collect();
            (lines.len() == 2
                && lines
                    .iter()
                    .all(|l| l.contains(" Running refract-provider 10.71.")))
            .then_some(lines)
        },
        || agent_state(origin, "local-agent") + &agent_state(provider, "remote-agent"),
    )
    .await;
    println!("origin pods:\n{}", origin_pods.join("\n"));
    let provider_pods = kubectl(
        provider,
        &["-n", "apps-origin", "get", "pods", "-o", "wide"],
    );
    println!("provider pods:\n{provider_pods}");
    let first = origin_pods[0].split(' ').next().unwrap();
    let output = eventually(
        WAIT,
        "the container's output on the provider",
        || {
            let logs = kubectl_get(
                provider,
                &[
                    "--raw",
                    &format!("/api/v1/namespaces/apps-origin/pods/{first}/log"),
                ],
            )?;
            logs.contains("served by").then_some(logs)
        },
        || agent_state(provider, "remote-agent"),
    )
    .await;
    println!("kubectl logs {first} (provider): {}", output.trim());

    // The same log and an exec from the origin, through the in-cluster agent's kubelet API.
    let origin_logs = eventually(
        WAIT,
        "kubectl logs at the origin",
        || {
            let logs = kubectl_get(
                origin,
                &[
                    "--raw",
                    &format!("/api/v1/namespaces/apps/pods/{first}/log"),
                ],
            )?;
            logs.contains("served by").then_some(logs)
        },
        || agent_state(origin, "local-agent"),
    )
    .await;
    println!("kubectl logs {first} (origin): {}", origin_logs.trim());
    assert_eq!(origin_logs.trim(), output.trim());
    let exec = kubectl(
        origin,
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
    let bridge = refract_e2e::metrics_api::bridge_address(provider).unwrap();
    let _metrics = refract_e2e::metrics_api::serve(provider, "localhost", bridge)
        .await
        .expect("the provider's metrics API");
    let stats = eventually(
        WAIT,
        "the offloaded pod's memory in the virtual node's stats",
        || {
            let raw = kubectl_get(
                origin,
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
        || agent_state(origin, "local-agent") + &agent_state(provider, "remote-agent"),
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
            can_i(provider, user, verb, what, ns),
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
        lease_holder_ip(provider, "refract-tenant-origin")
    );
    assert_eq!(
        http_get(&admin, "/readyz", None).await.0,
        200,
        "probes stay open"
    );
    let (status, body) = http_get(&admin, "/metrics", None).await;
    println!("GET /metrics without a token: {status} {}", body.trim());
    assert_eq!(status, 401);
    // deploy/monitoring applied as a Prometheus Operator user applies it. The operator is not
    // run here: its two CRDs stand in, reduced to what the API server needs to store the
    // PodMonitors and the PrometheusRule. What a PodMonitor would send is the token of the
    // ServiceAccount the kustomization makes; an account without the binding gets 403.
    kubectl_stdin(provider, &["apply", "-f", "-"], &operator_crds_stand_in());
    kubectl(
        provider,
        &[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
    );
    let monitoring = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/monitoring");
    let applied = kubectl(provider, &["apply", "-k", monitoring]);
    println!(
        "kubectl apply -k deploy/monitoring:\n{}",
        applied.trim_end()
    );
    for kind in ["podmonitor", "prometheusrule", "configmap"] {
        let names = kubectl(
            provider,
            &[
                "-n",
                "refract-system",
                "get",
                kind,
                "-o",
                "name",
                "-l",
                "app.kubernetes.io/component=monitoring",
            ],
        );
        assert!(!names.trim().is_empty(), "deploy/monitoring made no {kind}");
    }
    kubectl(provider, &["create", "namespace", "monitoring"]);
    kubectl(
        provider,
        &["-n", "monitoring", "create", "serviceaccount", "nobody"],
    );
    let nobody = account_token(provider, "monitoring", "nobody").await;
    let (status, body) = http_get(&admin, "/metrics", Some(&nobody)).await;
    println!(
        "GET /metrics as monitoring/nobody: {status} {}",
        body.trim()
    );
    assert_eq!(status, 403);
    let reader = account_token(provider, "refract-system", "refract-metrics-reader").await;
    let (status, body) = http_get(&admin, "/metrics", Some(&reader)).await;
    println!("GET /metrics with the PodMonitors' token (refract-system/refract-metrics-reader): {status}");
    assert_eq!(status, 200);
    assert!(body.contains("refract_remote_tenant_usage"), "{body}");
    assert!(
        body.contains("refract_remote_certificate_expiry_timestamp_seconds{certificate=\"link\"}"),
        "{body}"
    );

    rollouts_during_a_burst(origin, provider).await;
    settings_edited_in_place(origin, provider).await;

    // ... and unpeers it: graceful, then deploy/'s names for the local agent and its Secrets.
    let pkc = provider.kubeconfig.display().to_string();
    let unpeer = run(
        bin("refractctl"),
        &[
            "unpeer",
            "--origin-kubeconfig",
            &okc,
            "--provider-kubeconfig",
            &pkc,
            "--provider-id",
            "provider",
            "--timeout",
            "3m",
        ],
    );
    let said = String::from_utf8_lossy(&unpeer.stdout).into_owned();
    println!(
        "$ refractctl unpeer (a kubectl apply -k peering)\n{said}{}",
        String::from_utf8_lossy(&unpeer.stderr)
    );
    assert!(unpeer.status.success(), "refractctl unpeer failed");
    for step in [
        "Deployment refract-system/refract-local-agent deleted",
        "Secret refract-system/refract-local-agent-tls deleted",
        "provider: no namespace of tenant origin is left",
    ] {
        assert!(said.contains(step), "unpeer did not say {step:?}");
    }
    let left = kubectl(
        provider,
        &[
            "get",
            "namespaces",
            "-l",
            "refract.io/tenant=origin",
            "-o",
            "name",
        ],
    );
    assert!(left.trim().is_empty(), "left on the provider: {left}");
}

/// The operator edits deploy/'s settings ConfigMap: the kubelet refreshes the mounted file and
/// the leading local agent puts the change in force with no restart: a label newly skipped
/// leaves the reflected copy, and the new sharing percentage is logged as in force (what the
/// virtual node then offers may be capped by the tenant's quota on the provider).
async fn settings_edited_in_place(origin: &ControlPlane, provider: &ControlPlane) {
    kubectl_stdin(
        origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: labelled, namespace: apps, labels: {cost-centre: \"42\"}}\ndata: {k: v}\n",
    );
    let copy_labels = || {
        kubectl_get(
            provider,
            &[
                "-n",
                "apps-origin",
                "configmap",
                "labelled",
                "-o",
                "jsonpath={.metadata.labels}",
            ],
        )
    };
    eventually(
        WAIT,
        "ConfigMap labelled on the provider with its label",
        || copy_labels().filter(|l| l.contains("cost-centre")),
        || agent_logs(origin, "local-agent"),
    )
    .await;
    let edited = "offloading:\n  reflection:\n    skip: {labels: [cost-centre], annotations: []}\ncontrollerManager:\n  config:\n    resourceSharingPercentage: 45\n";
    let patch = serde_json::json!({"data": {"reflection.yaml": edited}}).to_string();
    kubectl(
        origin,
        &[
            "-n",
            "refract-system",
            "patch",
            "configmap",
            "refract-local-agent-settings",
            "--type=merge",
            "-p",
            &patch,
        ],
    );
    let edited_at = std::time::Instant::now();
    eventually(
        Duration::from_secs(240),
        "the skipped label gone from the copy after the ConfigMap edit",
        || copy_labels().filter(|l| !l.contains("cost-centre")),
        || agent_logs(origin, "local-agent"),
    )
    .await;
    let took = edited_at.elapsed();
    let logs = agent_logs(origin, "local-agent");
    let changed = logs
        .lines()
        .find(|l| l.contains("settings changed; in force from now on"))
        .expect("the change is logged");
    for said in ["sharing percentage 90 -> 45", "skipped labels +cost-centre"] {
        assert!(changed.contains(said), "{said:?} missing from {changed}");
    }
    println!(
        "kubectl patch configmap refract-local-agent-settings: in force after {took:.0?} with no restart; {changed}"
    );
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
        let (written, duplicates) = writes.settled(before).await;
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
/// The Prometheus Operator's PodMonitor and PrometheusRule CRDs, with no schema beyond "an
/// object": enough for the API server to store what deploy/monitoring applies.
fn operator_crds_stand_in() -> String {
    ["podmonitors:PodMonitor", "prometheusrules:PrometheusRule"]
        .iter()
        .map(|pair| {
            let (plural, kind) = pair.split_once(':').unwrap();
            format!(
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {plural}.monitoring.coreos.com\nspec:\n  group: monitoring.coreos.com\n  scope: Namespaced\n  names: {{plural: {plural}, kind: {kind}}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}\n---\n"
            )
        })
        .collect()
}

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
