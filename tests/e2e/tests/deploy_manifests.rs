//! The kustomize trees of `deploy/` render with `kubectl kustomize`, and the cert-manager
//! overlays fit the agents they go with: every Secret a Deployment mounts is a Certificate's
//! (but the tenant's client certificate, which comes from the provider), the webhook's CA is
//! injected from a Certificate that exists, and each Certificate carries a Refract identity.
//! cert-manager itself is not installed here (no network), so this is what can be checked.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::path::Path;

use refract_e2e::run_ok;
use serde_json::Value;

fn render(dir: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(dir);
    let yaml = run_ok("kubectl", &["kustomize", path.to_str().unwrap()]);
    serde_yaml_ng::Deserializer::from_str(&yaml)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn mounted_secrets(objects: &[Value]) -> Vec<String> {
    of_kind(objects, "Deployment")
        .iter()
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v["secret"]["secretName"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn deploy_renders_and_the_cert_manager_overlays_fit_the_agents() {
    for dir in [
        "local-agent",
        "remote-agent",
        "test/local-agent",
        "test/remote-agent",
    ] {
        assert!(!render(dir).is_empty(), "deploy/{dir} renders nothing");
    }
    for (dir, not_issued_here) in [
        ("cert-manager/origin", Some("refract-local-agent-tls")),
        ("cert-manager/provider", None),
    ] {
        let objects = render(dir);
        let certificates = of_kind(&objects, "Certificate");
        let issued: Vec<&str> = certificates
            .iter()
            .filter_map(|c| c["spec"]["secretName"].as_str())
            .collect();
        for secret in mounted_secrets(&objects) {
            if Some(secret.as_str()) == not_issued_here {
                continue;
            }
            assert!(
                issued.contains(&secret.as_str()),
                "{dir}: Secret {secret} is mounted but no Certificate issues it"
            );
        }
        for c in &certificates {
            if c["spec"]["isCA"] == true {
                continue;
            }
            let uris = c["spec"]["uris"].as_array().cloned().unwrap_or_default();
            assert!(
                uris.len() == 1
                    && uris[0]
                        .as_str()
                        .unwrap()
                        .starts_with("spiffe://refract/cluster/"),
                "{dir}: Certificate {} has no Refract identity",
                c["metadata"]["name"]
            );
            assert_eq!(c["metadata"]["namespace"], "refract-system");
        }
    }
    // The one Secret the origin overlay mounts but does not issue comes from the provider: the
    // provider overlay's comments copy it under exactly that name.
    let provider_comments = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/cert-manager/provider/certificates.yaml"),
    )
    .unwrap();
    assert!(
        provider_comments.contains("name: \"refract-local-agent-tls\", namespace: \"refract-system\""),
        "deploy/cert-manager/provider copies the tenant Secret under another name than the origin mounts"
    );
    let origin = render("cert-manager/origin");
    let webhook = of_kind(&origin, "MutatingWebhookConfiguration")[0];
    let from = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("the webhook's CA is injected");
    let (ns, name) = from.split_once('/').unwrap();
    assert!(of_kind(&origin, "Certificate")
        .iter()
        .any(|c| c["metadata"]["namespace"] == ns && c["metadata"]["name"] == name));
    assert_eq!(
        webhook["webhooks"][0]["namespaceSelector"]["matchLabels"]["liqo.io/scheduling-enabled"],
        "true"
    );
}

/// deploy/monitoring fits the agents: each PodMonitor selects the pods of one agent's
/// Deployment by its pod template's labels, on a port that Deployment names, sending the token
/// of a ServiceAccount that the kustomization binds to `get /metrics`; the dashboard ships in
/// a ConfigMap Grafana's sidecar picks up.
#[test]
fn the_monitoring_kustomization_scrapes_both_agents_with_a_bound_token() {
    let monitoring = render("monitoring");
    let monitors = of_kind(&monitoring, "PodMonitor");
    assert_eq!(monitors.len(), 2);
    for agent in ["local-agent", "remote-agent"] {
        let deployment = render(agent)
            .into_iter()
            .find(|o| o["kind"] == "Deployment")
            .unwrap();
        let pod = &deployment["spec"]["template"];
        let monitor = monitors
            .iter()
            .find(|m| {
                m["spec"]["selector"]["matchLabels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .all(|(k, v)| pod["metadata"]["labels"][k] == *v)
            })
            .unwrap_or_else(|| panic!("no PodMonitor selects the {agent}'s pods"));
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        let ports: Vec<&Value> = pod["spec"]["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        assert!(
            ports.iter().any(|p| p["name"] == endpoint["port"]),
            "the {agent}'s pods have no port {}",
            endpoint["port"]
        );
        assert_eq!(
            monitor["metadata"]["namespace"],
            deployment["metadata"]["namespace"]
        );
        let secret = endpoint["bearerTokenSecret"]["name"].as_str().unwrap();
        let token = of_kind(&monitoring, "Secret")
            .into_iter()
            .find(|s| s["metadata"]["name"] == secret)
            .expect("the PodMonitors' token Secret");
        let account = token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
            .as_str()
            .unwrap();
        let binding = of_kind(&monitoring, "ClusterRoleBinding")[0];
        assert!(binding["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == account && s["namespace"] == token["metadata"]["namespace"]));
    }
    let dashboard = of_kind(&monitoring, "ConfigMap")[0];
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    serde_json::from_str::<Value>(dashboard["data"]["dashboard.json"].as_str().unwrap())
        .expect("the dashboard is JSON");
    assert_eq!(of_kind(&monitoring, "PrometheusRule").len(), 1);
}
