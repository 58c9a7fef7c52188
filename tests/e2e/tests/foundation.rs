//! The foundation end to end: two real control planes, both agent binaries, certificates made
//! with `refract-certs`, checked with `grpcurl` and `kubectl` as an operator would.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{bin, json_of, kubectl_stdin, run_ok, Peering};

fn tenant_connected(p: &Peering) -> Option<serde_json::Value> {
    let out = p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"]);
    let v = json_of(&out).ok()?;
    let t = v["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["clusterId"] == "origin")?
        .clone();
    (t["connected"] == true).then_some(t)
}

#[tokio::test]
async fn grpcurl_sees_services_and_the_connected_tenant() {
    let p = Peering::start(false).await.expect("peering");
    let tenant = p
        .eventually(Duration::from_secs(30), "tenant origin connected", || {
            tenant_connected(&p)
        })
        .await;
    assert_eq!(tenant["agentVersion"], env!("CARGO_PKG_VERSION"));

    let list = p.grpcurl(Some("client"), &["list"]);
    let services = String::from_utf8_lossy(&list.stdout);
    for s in [
        "refract.v1.Reflection",
        "refract.v1.Inspect",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.lines().any(|l| l == s),
            "`grpcurl list` lacks {s}: {services}"
        );
    }
    let described = p.grpcurl(Some("client"), &["describe", "refract.v1.Reflection"]);
    assert!(String::from_utf8_lossy(&described.stdout).contains(
        "rpc Sync ( stream .refract.v1.LocalMessage ) returns ( stream .refract.v1.RemoteMessage )"
    ));

    let health = json_of(&p.grpcurl(Some("client"), &["grpc.health.v1.Health/Check"])).unwrap();
    assert_eq!(health["status"], "SERVING");
    let health = json_of(&p.grpcurl_with(
        Some("client"),
        Some(r#"{"service":"refract.v1.Reflection"}"#),
        &["grpc.health.v1.Health/Check"],
    ))
    .unwrap();
    assert_eq!(health["status"], "SERVING");

    // A tenant may not look at another tenant.
    let other = p.grpcurl_with(
        Some("client"),
        Some(r#"{"clusterId":"someone-else"}"#),
        &["refract.v1.Inspect/ListObjects"],
    );
    assert!(!other.status.success());
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("PermissionDenied"),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
}

#[tokio::test]
async fn wrong_expired_and_missing_client_certificates_are_refused() {
    let p = Peering::start(false).await.expect("peering");
    p.eventually(Duration::from_secs(30), "tenant origin connected", || {
        tenant_connected(&p)
    })
    .await;

    // A certificate for the same identity from another CA with the same name as ours.
    let other = refract_e2e::Certs::new(&p.dir.path().join("other"));
    let foreign = other.issue("foreign", "origin", "client", &[]);
    std::fs::copy(p.certs.dir.join("ca/ca.crt"), foreign.join("ca.crt")).unwrap();
    std::fs::create_dir_all(p.certs.dir.join("foreign")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(foreign.join(f), p.certs.dir.join("foreign").join(f)).unwrap();
    }
    // An expired certificate from the right CA.
    p.certs.issue(
        "expired",
        "origin",
        "client",
        &["--not-before", "2020-01-01T00:00:00Z", "--days", "1"],
    );
    let inspect = run_ok(
        bin("refract-certs"),
        &[
            "inspect",
            p.certs.dir.join("expired/tls.crt").to_str().unwrap(),
        ],
    );
    assert!(inspect.contains("EXPIRED"), "{inspect}");

    // grpcurl only sees the connection fail; the remote agent's log says why.
    for (client, why) in [
        (Some("foreign"), "invalid peer certificate: BadSignature"),
        (Some("expired"), "certificate expired"),
        (None, "no certificates"),
    ] {
        let before = p.remote_log().matches(why).count();
        let out = p.grpcurl(client, &["list"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{client:?} was accepted: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.to_lowercase().contains("failed to dial"),
            "{client:?}: {stderr}"
        );
        p.eventually(
            Duration::from_secs(5),
            &format!("remote agent logging {why:?} for {client:?}"),
            || (p.remote_log().matches(why).count() > before).then_some(()),
        )
        .await;
    }
    // And the good tenant is still connected.
    assert!(tenant_connected(&p).is_some());
}

#[tokio::test]
async fn local_agent_reconnects_when_the_remote_agent_process_restarts() {
    let mut p = Peering::start(false).await.expect("peering");
    p.eventually(Duration::from_secs(30), "first connection", || {
        tenant_connected(&p)
    })
    .await;
    let status = p.remote.take().unwrap().stop().await;
    assert!(
        status.success(),
        "remote agent exited with {status} on SIGTERM"
    );
    p.start_remote();
    p.eventually(Duration::from_secs(30), "reconnection", || {
        tenant_connected(&p)
    })
    .await;
    assert!(p.local_log().contains("reconnecting"), "{}", p.local_log());
}

#[tokio::test]
async fn deploy_bases_pass_server_side_dry_run() {
    let cp = refract_testkit::ControlPlane::start(refract_testkit::Options::named("deploy"))
        .await
        .unwrap();
    let kc = cp.kubeconfig.to_str().unwrap().to_string();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
    run_ok(
        "kubectl",
        &["--kubeconfig", &kc, "create", "namespace", "refract-system"],
    );
    for base in ["remote-agent", "local-agent"] {
        let path = format!("{root}/{base}");
        // Kubernetes 1.20 serves PodDisruptionBudget as policy/v1beta1 only (the same fields):
        // the base's policy/v1 budget goes in under that version, as refractctl applies it.
        let rendered = run_ok("kubectl", &["kustomize", &path]).replace(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget",
            "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget",
        );
        let stdout = kubectl_stdin(&cp, &["apply", "--dry-run=server", "-f", "-"], &rendered);
        for kind in [
            "serviceaccount",
            "clusterrole.rbac",
            "clusterrolebinding.rbac",
            "deployment.apps",
            "service/",
            "customresourcedefinition.apiextensions.k8s.io/",
        ] {
            assert!(stdout.contains(kind), "{base}: no {kind} in {stdout}");
        }
        if base == "local-agent" {
            assert!(stdout.contains("mutatingwebhookconfiguration"), "{stdout}");
            assert!(stdout.contains("poddisruptionbudget"), "{stdout}");
        }
    }
}
