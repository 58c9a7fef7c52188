//! `deploy/cert-manager/` applied as its comments say: `kubectl apply -k` of the provider and
//! origin overlays (with only what `deploy/test/` changes for a testkit cluster, and the
//! endpoint name replaced as the provider's comment asks), the tenant's Secret copied to the
//! origin with the very command the provider overlay's comment gives, then both agents up from
//! the Secrets the Certificates made, the webhook's caBundle injected, a pod offloaded, and the
//! peering shown and ended by `refractctl`.
//!
//! cert-manager itself cannot be installed here (its images are on a registry this machine
//! cannot reach): testkit's stand-in (`refract_testkit::fake_cert_manager`) issues the
//! overlays' Certificates from their Issuers into Secrets of cert-manager's layout and injects
//! the CA as cainjector does. What this checks is that the overlays, their comments and the
//! agents fit together; not cert-manager's renewal.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]

use std::time::Duration;

use refract_e2e::in_cluster::{
    agent_state, api_port, apply_test_overlay_of, args_patch, deploy_args, node_ip,
    remote_endpoint, start_clusters,
};
use refract_e2e::{
    bin, busybox, eventually, kubectl, kubectl_get, kubectl_stdin, kubectl_stdin_output, run,
};
use refract_testkit::{fake_cert_manager, ControlPlane};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(180);

/// The command the provider overlay's comment gives for copying the tenant's Secret to the
/// origin, as written there (the `#   ` lines after "e.g.").
fn copy_command_from_the_comment() -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/cert-manager/provider/certificates.yaml"),
    )
    .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.ends_with(" e.g."))
        .skip(1)
        .take_while(|l| l.starts_with("#   "))
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    assert!(
        !lines.is_empty(),
        "the provider overlay's comment no longer gives the copy command"
    );
    // As a shell reads the lines: each ends in a continuation backslash.
    lines.join("\n")
}

/// Starts the stand-in for cert-manager in `cp`.
async fn cert_manager_in(cp: &ControlPlane, stop: &CancellationToken) {
    let client = cp.client().await.expect("a client");
    fake_cert_manager::install_crds(&client)
        .await
        .expect("the cert-manager CRDs");
    tokio::spawn(fake_cert_manager::run(client, stop.clone()));
}

fn deployment_available(cp: &ControlPlane, name: &str) -> Option<()> {
    let ready = kubectl_get(
        cp,
        &[
            "-n",
            "refract-system",
            "deployment",
            name,
            "-o",
            "jsonpath={.status.availableReplicas}",
        ],
    )?;
    (ready == "2").then_some(())
}

#[tokio::test]
async fn cert_manager_overlays_peer_as_their_comments_say() {
    let (origin, provider) = start_clusters().await;
    let stop = CancellationToken::new();
    cert_manager_in(&origin, &stop).await;
    cert_manager_in(&provider, &stop).await;
    let dir = tempfile::tempdir().unwrap();
    let okc = origin.kubeconfig.display().to_string();
    let pkc = provider.kubeconfig.display().to_string();

    // Provider: `kubectl apply -k deploy/cert-manager/provider`; "replace ... the endpoint
    // name": the origin reaches the remote agent at the node's address (a NodePort here).
    let provider_node = node_ip(&provider);
    apply_test_overlay_of(
        &provider,
        dir.path(),
        "cert-manager/provider",
        "remote-agent",
        &[serde_json::json!({
            "kind": "Certificate",
            "name": "refract-remote-agent",
            "ops": [
                {"op": "replace", "path": "/spec/dnsNames", "value": ["refract-remote-agent.refract-system.svc"]},
                {"op": "add", "path": "/spec/ipAddresses", "value": [provider_node]},
            ]
        })],
    );
    let remote_endpoint = remote_endpoint(&provider, &provider_node);

    // Origin: `kubectl apply -k deploy/cert-manager/origin`, the local agent's flags set as
    // deploy/README.md says.
    apply_test_overlay_of(
        &origin,
        dir.path(),
        "cert-manager/origin",
        "local-agent",
        &[args_patch(
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
        )],
    );

    // The tenant's Secret, copied with the command the comment gives.
    eventually(
        WAIT,
        "the tenant's certificate issued on the provider",
        || {
            kubectl_get(
                &provider,
                &[
                    "-n",
                    "refract-system",
                    "secret",
                    "refract-tenant-origin-client",
                    "-o",
                    "name",
                ],
            )
        },
        || {
            kubectl(
                &provider,
                &["-n", "refract-system", "get", "certificates,secrets"],
            )
        },
    )
    .await;
    let command = copy_command_from_the_comment()
        .replace("--kubeconfig provider", &format!("--kubeconfig {pkc}"))
        .replace("--kubeconfig origin", &format!("--kubeconfig {okc}"));
    println!("$ {command}");
    let copied = run("sh", &["-c", &command]);
    assert!(
        copied.status.success(),
        "the comment's copy command failed: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    println!("{}", String::from_utf8_lossy(&copied.stdout).trim());

    for (cp, name, agent) in [
        (&provider, "refract-remote-agent", "remote-agent"),
        (&origin, "refract-local-agent", "local-agent"),
    ] {
        eventually(
            WAIT,
            &format!("deployment {name} Available from the cert-manager Secrets"),
            || deployment_available(cp, name),
            || agent_state(cp, agent),
        )
        .await;
    }
    // cainjector's part: the webhook trusts the CA that issued its serving certificate.
    let ca = kubectl(
        &origin,
        &[
            "-n",
            "refract-system",
            "get",
            "secret",
            "refract-local-agent-webhook-tls",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ],
    );
    let bundles = kubectl(
        &origin,
        &[
            "get",
            "mutatingwebhookconfiguration",
            "refract-local-agent",
            "-o",
            "jsonpath={.webhooks[*].clientConfig.caBundle}",
        ],
    );
    assert_eq!(bundles, format!("{ca} {ca}"), "the webhooks' caBundle");

    // The peering works: refractctl finds it (deploy/'s names), connected and Ready.
    let status = eventually(
        WAIT,
        "refractctl status: connected and Ready",
        || {
            let out = run(bin("refractctl"), &["status", "--origin-kubeconfig", &okc]);
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
        || agent_state(&origin, "local-agent") + &agent_state(&provider, "remote-agent"),
    )
    .await;
    println!("$ refractctl status\n{status}");
    assert!(status.contains("refract-system/refract-local-agent 2/2 available"));

    // A pod offloaded: the API server called the webhook with the injected CA.
    kubectl_stdin(
        &origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {name: offloading, namespace: apps}\nspec: {podOffloadingStrategy: Remote}\n",
    );
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: apps}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: {}\n    command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n",
        busybox()
    );
    eventually(
        WAIT,
        "pod apps/web admitted by the webhook and Running on the provider",
        || {
            // Until the namespace is extended, the webhook may not admit it yet: asked again.
            let _ = kubectl_stdin_output(&origin, &["apply", "-f", "-"], &pod);
            let phase = kubectl_get(
                &provider,
                &[
                    "-n",
                    "apps-origin",
                    "pod",
                    "web",
                    "-o",
                    "jsonpath={.status.phase}",
                ],
            )?;
            (phase == "Running").then_some(())
        },
        || agent_state(&origin, "local-agent"),
    )
    .await;
    let node = kubectl(
        &origin,
        &[
            "-n",
            "apps",
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
    );
    assert_eq!(node, "refract-provider");

    // And ended by refractctl, though kustomize made it.
    let out = run(
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
    let said = String::from_utf8_lossy(&out.stdout);
    println!(
        "$ refractctl unpeer\n{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "refractctl unpeer failed");
    assert!(said.contains("Deployment refract-system/refract-local-agent deleted"));
    assert!(said.contains("provider: no namespace of tenant origin is left"));
    stop.cancel();
}
