//! Per-tenant quotas on the provider, with the remote agent at the flags `deploy/` ships plus a
//! policy file: a tenant at its CPU quota gets its next origin pod Pending with the reason
//! (`ProviderQuotaExceeded`, and a Warning event) while another tenant's pods still run, and
//! the pod is taken once the tenant holds less, and a tenant speaking the wire itself is
//! refused a pod past its pod quota; objects over the per-kind count or the byte quota
//! are refused with a Warning event on the origin object; the twin namespace carries the quota
//! as a ResourceQuota; the usage shows in the metrics and in the virtual node's capacity.
//! And a tenant pipelining writes beside another is held to its write rate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::wire::Wire;
use refract_e2e::{busybox, kubectl, kubectl_stdin, metric, origin_get, provider_get, Peering};
use refract_wire::proto::Outcome;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

const POLICY: &str = "tenants:\n  origin:\n    quota:\n      objectsPerKind: 4\n      bytes: 200Ki\n      hard: {pods: 10, requests.cpu: 250m}\n  bystander:\n    quota:\n      hard: {pods: 3}\n";

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: apps}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
        busybox()
    )
}

fn origin_pod_state(p: &Peering, name: &str) -> Option<String> {
    origin_get(
        p,
        &[
            "-n",
            "apps",
            "pod",
            name,
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
        ],
    )
}

fn events_with_reason(p: &Peering, reason: &str) -> String {
    origin_get(
        p,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            &format!("reason={reason}"),
            "-o",
            "jsonpath={range .items[*]}{.involvedObject.kind}/{.involvedObject.name}: {.message}{\"\\n\"}{end}",
        ],
    )
    .unwrap_or_default()
}

/// `jsonpath` of the twin namespace's ResourceQuota.
fn twin_quota(p: &Peering, jsonpath: &str) -> Option<String> {
    provider_get(
        p,
        &[
            "-n",
            "apps-origin",
            "resourcequota",
            "refract-tenant-quota",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ],
    )
}

/// The tenant's ConfigMaps in its twin namespace (not the provider's own kube-root-ca.crt).
fn provider_config_maps(p: &Peering) -> usize {
    provider_get(p, &["-n", "apps-origin", "configmaps", "-o", "name"])
        .unwrap_or_default()
        .lines()
        .filter(|l| *l != "configmap/kube-root-ca.crt")
        .count()
}

#[tokio::test]
async fn a_tenant_at_its_quota_waits_with_the_reason_while_another_tenant_runs() {
    let mut p = Peering::start_offloading().await.expect("peering");
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(policy.path(), POLICY).unwrap();
    p.restart_remote_with(format!("--policy={}", policy.path().display()))
        .await;
    p.until_node_ready(WAIT).await;

    // The virtual node offers no more than the quota: 250m of CPU, 10 pods.
    p.eventually(WAIT, "the virtual node capped at the quota", || {
        let offered = origin_get(
            &p,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.allocatable.cpu} {.status.allocatable.pods}",
            ],
        )?;
        (offered == "250m 10").then_some(())
    })
    .await;
    p.extend("apps", "{podOffloadingStrategy: Remote}");
    p.eventually(WAIT, "the twin namespace's ResourceQuota", || {
        let hard = twin_quota(&p, "{.spec.hard.pods} {.spec.hard.requests\\.cpu}")?;
        (hard == "10 250m").then_some(())
    })
    .await;

    // Bytes: one ConfigMap larger than the whole byte quota.
    let big = "x".repeat(250 * 1024);
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big, namespace: apps}}\ndata: {{blob: {big}}}\n"),
    );
    let refused_bytes = p
        .eventually(WAIT, "the big ConfigMap refused for quota.bytes", || {
            let events = events_with_reason(&p, "ProviderQuotaExceeded");
            events
                .lines()
                .find(|l| l.starts_with("ConfigMap/big:") && l.contains("quota.bytes"))
                .map(str::to_owned)
        })
        .await;
    assert!(provider_get(&p, &["-n", "apps-origin", "configmap", "big"]).is_none());
    println!("bytes: {refused_bytes}");

    // Pods: the origin schedules them (they ask for no CPU), the provider counts the 100m
    // each gets by default: two fit in 250m, the third waits.
    for name in ["a", "b"] {
        kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod(name));
    }
    // Kubernetes' ResourceQuota may still count a pod that is gone when one is created, and
    // the ShadowPod controller's next attempt can then be a minute away (its backoff).
    p.eventually(2 * WAIT, "a and b Running at the origin", || {
        let a = origin_pod_state(&p, "a")?;
        let b = origin_pod_state(&p, "b")?;
        (a.starts_with("Running") && b.starts_with("Running")).then_some(())
    })
    .await;
    let cpu = provider_get(
        &p,
        &[
            "-n",
            "apps-origin",
            "pod",
            "a",
            "-o",
            "jsonpath={.spec.containers[0].resources.requests.cpu}",
        ],
    );
    assert_eq!(
        cpu.as_deref(),
        Some("100m"),
        "the LimitRange's default request"
    );
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod("c"));
    let waiting = p
        .eventually(WAIT, "c Pending ProviderQuotaExceeded", || {
            let state = origin_pod_state(&p, "c")?;
            (state == "Pending ProviderQuotaExceeded").then_some(state)
        })
        .await;
    let event = p
        .eventually(WAIT, "a Warning event on c", || {
            events_with_reason(&p, "ProviderQuotaExceeded")
                .lines()
                .find(|l| l.starts_with("Pod/c:"))
                .map(str::to_owned)
        })
        .await;
    assert!(
        event.contains("quota.hard.requests.cpu is 250m, the tenant holds 200m"),
        "{event}"
    );
    assert!(provider_get(&p, &["-n", "apps-origin", "shadowpod", "c"]).is_none());
    let admin = p.remote_admin.clone();
    let usage = metric(
        &admin,
        r#"refract_remote_tenant_usage{tenant="origin",resource="requests.cpu"}"#,
    )
    .await;
    let limit = metric(
        &admin,
        r#"refract_remote_tenant_quota{tenant="origin",resource="requests.cpu"}"#,
    )
    .await;
    assert_eq!((usage, limit), (0.2, 0.25));
    // Inspect, as the tenant sees itself with grpcurl.
    let listed = p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"]);
    let tenants: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let cpu = tenants["tenants"][0]["quota"]
        .as_array()
        .and_then(|q| q.iter().find(|u| u["resource"] == "requests.cpu"))
        .cloned()
        .unwrap_or_else(|| panic!("no requests.cpu in {tenants}"));
    assert_eq!(
        (cpu["used"].as_f64(), cpu["limit"].as_f64()),
        (Some(0.2), Some(0.25)),
        "{cpu}"
    );
    println!("pods: c is {waiting}; {event}; metrics: requests.cpu {usage} of {limit}");

    // Another tenant on the same provider is not held back by this one's quota.
    let certs = p.certs.issue("bystander", "bystander", "client", &[]);
    let mut wire = Wire::open(&p.remote_addr, "provider", "bystander", &certs)
        .await
        .expect("the second tenant connects");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop-bystander",
        "annotations": {"refract.io/original-name": "shop"}}});
    let answer = wire.upsert(&ns).await.unwrap();
    assert_eq!(answer.outcome, Outcome::Applied, "{answer:?}");
    for name in ["one", "two", "three"] {
        let shadow = json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
            "metadata": {"name": name, "namespace": "shop-bystander"},
            "spec": {"pod": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": busybox(),
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]}}});
        let answer = wire.upsert(&shadow).await.unwrap();
        assert_eq!(answer.outcome, Outcome::Applied, "{name}: {answer:?}");
    }
    // At its own pod quota, a tenant speaking the wire itself is refused the next pod.
    let four = json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": "four", "namespace": "shop-bystander"},
        "spec": {"pod": {"containers": [{"name": "c", "image": busybox()}]}}});
    let answer = wire.upsert(&four).await.unwrap();
    assert_eq!(answer.outcome, Outcome::QuotaExceeded, "{answer:?}");
    assert!(
        answer
            .message
            .contains("quota.hard.pods is 3, the tenant holds 3"),
        "{answer:?}"
    );
    println!("the second tenant's fourth pod: {}", answer.message);
    p.eventually(WAIT, "the second tenant's three pods Running", || {
        let phases = provider_get(
            &p,
            &[
                "-n",
                "shop-bystander",
                "pods",
                "-o",
                "jsonpath={.items[*].status.phase}",
            ],
        )?;
        (phases == "Running Running Running").then_some(())
    })
    .await;

    // Room again: a goes, and c is taken within the quota retry's 30 s. Its pod starts once
    // Kubernetes' own count (the ResourceQuota's usage, which kube-controller-manager
    // recomputes when a pod goes) has let a go too, which this test does not time.
    kubectl(
        &p.origin,
        &["-n", "apps", "delete", "pod", "a", "--wait=false"],
    );
    let freed = std::time::Instant::now();
    p.eventually(WAIT, "c's ShadowPod written once a is gone", || {
        provider_get(&p, &["-n", "apps-origin", "shadowpod", "c", "-o", "name"]).map(drop)
    })
    .await;
    println!(
        "c taken by the provider {:.1?} after a was deleted; the second tenant's 3 pods ran meanwhile",
        freed.elapsed()
    );

    // Objects per kind: kube-root-ca.crt and three more ConfigMaps make four; a fifth waits.
    for i in 1..=4 {
        kubectl_stdin(
            &p.origin,
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{i}, namespace: apps}}\ndata: {{k: v}}\n"),
        );
    }
    let refused_count = p
        .eventually(WAIT, "a ConfigMap refused for quota.objectsPerKind", || {
            events_with_reason(&p, "ProviderQuotaExceeded")
                .lines()
                .find(|l| l.starts_with("ConfigMap/cm-") && l.contains("quota.objectsPerKind"))
                .map(str::to_owned)
        })
        .await;
    p.eventually(WAIT, "four ConfigMaps on the provider", || {
        (provider_config_maps(&p) == 4).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(provider_config_maps(&p), 4, "the count stays at the quota");
    println!("objects: {refused_count}");

    // A changed quota reaches the virtual node and the twin namespace without a restart.
    std::fs::write(policy.path(), POLICY.replace("250m", "400m")).unwrap();
    let changed = std::time::Instant::now();
    p.eventually(WAIT, "the virtual node offering the new quota", || {
        let cpu = origin_get(
            &p,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.allocatable.cpu}",
            ],
        )?;
        (cpu == "400m").then_some(())
    })
    .await;
    p.eventually(WAIT, "the ResourceQuota at the new quota", || {
        let cpu = twin_quota(&p, "{.spec.hard.requests\\.cpu}")?;
        (cpu == "400m").then_some(())
    })
    .await;
    println!(
        "quota changed to 400m: the virtual node and the ResourceQuota followed within {:.1?}",
        changed.elapsed()
    );
}

/// While another tenant writes, a tenant pipelining ConfigMaps starts at most
/// `--tenant-write-rate` of them a second (100 by default, after a quarter second's worth at
/// once), however many seats the provider has free; the other tenant, writing ten a second, is
/// never held by it. The remote agent runs with the flags `deploy/` ships.
#[tokio::test]
async fn a_tenant_pipelining_beside_another_is_held_to_its_write_rate() {
    use refract_e2e::wire::upsert_message;
    use refract_wire::proto::remote_message;

    const PIPELINED: usize = 600;
    let p = Peering::start(false).await.expect("peering");
    let mut noisy = p.bystander("noisy").await;
    let mut quiet = p.bystander("quiet").await;

    let stop = tokio_util::sync::CancellationToken::new();
    let quiet_writes = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut took = Vec::new();
            for i in 0.. {
                if stop.is_cancelled() {
                    break;
                }
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("q{}", i % 5), "namespace": "shop-quiet"},
                    "data": {"i": i.to_string()}});
                let started = std::time::Instant::now();
                let answer = quiet.upsert(&cm).await.expect("the quiet tenant's answer");
                assert_eq!(answer.outcome, Outcome::Applied, "{answer:?}");
                took.push(started.elapsed());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            took
        }
    });
    // The remote agent recounts the tenants writing every 250 ms.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let sender = noisy.sender();
    let started = std::time::Instant::now();
    let sending = tokio::spawn(async move {
        for i in 0..PIPELINED {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("n-{i:04}"), "namespace": "shop-noisy"},
                "data": {"i": i.to_string()}});
            sender
                .send(upsert_message(&cm, i as u64 + 1))
                .await
                .expect("the noisy tenant's stream is open");
        }
    });
    let mut answered = 0;
    while answered < PIPELINED {
        let message = tokio::time::timeout(Duration::from_secs(60), noisy.next_message())
            .await
            .expect("the noisy tenant's answers keep coming")
            .expect("the noisy tenant's stream")
            .expect("the remote agent keeps the noisy tenant's stream open");
        if let Some(remote_message::Kind::Ack(ack)) = message.kind {
            assert_eq!(ack.outcome, Outcome::Applied as i32, "{ack:?}");
            answered += 1;
        }
    }
    let took = started.elapsed();
    sending.await.unwrap();
    stop.cancel();
    let mut quiet_took = quiet_writes.await.unwrap();
    quiet_took.sort();
    let quiet_p99 = quiet_took[(quiet_took.len() * 99).div_ceil(100) - 1];
    println!(
        "{PIPELINED} ConfigMaps pipelined beside another tenant: {:.1} s ({:.0} a second); \
         the other tenant's {} writes meanwhile: p99 {quiet_p99:?}",
        took.as_secs_f64(),
        PIPELINED as f64 / took.as_secs_f64(),
        quiet_took.len()
    );
    // 25 at once, then 100 a second: at least 5.75 s for 600.
    assert!(
        took >= Duration::from_millis(5_500),
        "{PIPELINED} writes beside another tenant in {took:?}: not held to 100 a second"
    );
    assert!(
        quiet_p99 < Duration::from_secs(2),
        "the quiet tenant's writes waited: p99 {quiet_p99:?}"
    );
}
