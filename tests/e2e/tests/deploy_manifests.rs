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
