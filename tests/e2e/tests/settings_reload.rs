//! The local agent's settings files (`--reflection-config`, `--offloading-patch`) changed while
//! it runs, on a real provider node: a file that does not parse changes nothing (and a metric
//! says so); a valid change is in force within seconds with no restart: the virtual node's
//! share of the provider, a kind's policy (what it no longer allows is withdrawn), the skip
//! lists (reflected objects and running pods lose the label), the workers, and the offloading
//! patch (the ShadowPod of a running pod takes it, the pod keeps running); Secrets turned off
//! (withdrawn) and on again (sent anew); Services, whose watch EndpointSlices read, turned off
//! (withdrawn, their watch kept) and on again (sent anew); EndpointSlices, off since the
//! start, turned on: their reflector starts and the slice is sent.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{busybox, kubectl_stdin, metric, origin_get, provider_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

/// A container that runs until told to stop, and stops at once when told.
const SLEEPER: &str = r#"["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]"#;

const VALID: &str = "refract_local_settings_valid";
const RELOADS: &str = "refract_local_settings_reloads_total";

/// CPU in millicores of a quantity such as `3` or `1500m`.
fn millis(cpu: &str) -> u64 {
    match cpu.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => cpu.parse::<u64>().unwrap() * 1000,
    }
}

async fn until_virtual_cpu(p: &Peering, millicores: u64) {
    p.eventually(WAIT, &format!("virtual node CPU {millicores}m"), || {
        let cpu = origin_get(
            p,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.allocatable.cpu}",
            ],
        )?;
        (millis(&cpu) == millicores).then_some(())
    })
    .await;
}

/// The provider copy's labels in `tuned-origin`, as JSON; `None` while it does not exist.
fn provider_labels(p: &Peering, what: &str, name: &str) -> Option<serde_json::Value> {
    let out = provider_get(p, &["-n", "tuned-origin", what, name, "-o", "json"])?;
    let object: serde_json::Value = serde_json::from_str(&out).ok()?;
    Some(object["metadata"]["labels"].clone())
}

/// The provider pod `steady`'s phase and UID; `None` while it does not exist.
fn provider_pod(p: &Peering) -> Option<(String, String)> {
    let out = provider_get(
        p,
        &[
            "-n",
            "tuned-origin",
            "pod",
            "steady",
            "-o",
            "jsonpath={.status.phase} {.metadata.uid}",
        ],
    )?;
    let (phase, uid) = out.split_once(' ')?;
    Some((phase.to_string(), uid.to_string()))
}

/// The values file after the change: 25 %, ConfigMaps AllowList with 4 workers, EndpointSlices
/// on (off since the start), events off, label `team` skipped, and Secrets and Services
/// with `workers`.
fn changed_values(workers: u32) -> String {
    format!(
        "offloading:\n  reflection:\n    configmap: {{type: AllowList, workers: 4}}\n    secret: {{workers: {workers}}}\n    service: {{workers: {workers}}}\n    endpointslice: {{workers: 10}}\n    event: {{workers: 0}}\n    skip:\n      labels: [team]\ncontrollerManager:\n  config:\n    resourceSharingPercentage: 25\n"
    )
}

#[tokio::test]
async fn reflection_settings_and_the_offloading_patch_change_while_the_local_agent_runs() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    let patch = dir.path().join("patch.yaml");
    std::fs::write(
        &values,
        "offloading:\n  reflection:\n    configmap: {workers: 1}\n    endpointslice: {workers: 0}\ncontrollerManager:\n  config:\n    resourceSharingPercentage: 50\n",
    )
    .unwrap();
    std::fs::write(
        &patch,
        "tolerations:\n- {key: first.example/pool, operator: Exists, effect: NoSchedule}\n",
    )
    .unwrap();
    let p = Peering::start_offloading_with(&[
        &format!("--reflection-config={}", values.display()),
        &format!("--offloading-patch={}", patch.display()),
    ])
    .await
    .expect("peering");
    p.until_node_ready(WAIT).await;
    let provider_cpu = millis(
        &provider_get(
            &p,
            &[
                "node",
                "localhost",
                "-o",
                "jsonpath={.status.allocatable.cpu}",
            ],
        )
        .expect("provider node"),
    );
    until_virtual_cpu(&p, provider_cpu * 50 / 100).await;

    p.extend("tuned", "{podOffloadingStrategy: Remote}");
    p.until_extended("tuned", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: plain, namespace: tuned, labels: {{team: a}}}}\ndata: {{k: v}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: allowed, namespace: tuned, labels: {{team: a}}, annotations: {{liqo.io/allow-reflection: \"true\"}}}}\ndata: {{k: v}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: steady, namespace: tuned, labels: {{team: a}}}}\nspec:\n  nodeSelector: {{liqo.io/type: virtual-node}}\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: {SLEEPER}}}]\n",
            busybox()
        ),
    );
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Secret\nmetadata: {name: early, namespace: tuned}\nstringData: {k: v}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: tuned}\nspec: {ports: [{port: 80}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: tuned, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.3.7]}]\nports: [{port: 8080, protocol: TCP}]\n",
    );
    p.eventually(WAIT, "the Service reflected", || {
        provider_get(&p, &["-n", "tuned-origin", "service", "web", "-o", "name"])
    })
    .await;
    p.eventually(WAIT, "the Secret reflected", || {
        provider_get(&p, &["-n", "tuned-origin", "secret", "early", "-o", "name"])
    })
    .await;
    p.eventually(WAIT, "both ConfigMaps reflected with their label", || {
        let plain = provider_labels(&p, "configmap", "plain")?;
        let allowed = provider_labels(&p, "configmap", "allowed")?;
        (plain["team"] == "a" && allowed["team"] == "a").then_some(())
    })
    .await;
    let pod_uid = p
        .eventually(WAIT, "the pod Running on the provider", || {
            let (phase, uid) = provider_pod(&p)?;
            (phase == "Running").then_some(uid)
        })
        .await;

    // A file that does not parse is refused whole: the last good settings stay in force.
    assert_eq!(metric(&p.local_admin, VALID).await, 1.0);
    std::fs::write(
        &values,
        "offloading:\n  reflection:\n    configmap: [broken\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while metric(&p.local_admin, VALID).await != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the broken file was not refused:\n{}",
            p.local_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        p.local_log().contains("settings file refused"),
        "the refusal is not logged"
    );
    assert_eq!(metric(&p.local_admin, RELOADS).await, 0.0);

    // EndpointSlices are off: the slice is not sent.
    assert!(
        provider_get(
            &p,
            &["-n", "tuned-origin", "endpointslice", "web-1", "-o", "name"]
        )
        .is_none(),
        "an EndpointSlice was reflected with EndpointSlices off"
    );

    // One change of the values file: share, policy, skip list, workers, events, Secrets and
    // Services turned off, and EndpointSlices, off since the start, turned on: all at once.
    std::fs::write(&values, changed_values(0)).unwrap();
    until_virtual_cpu(&p, provider_cpu * 25 / 100).await;
    p.eventually(
        WAIT,
        "the ConfigMap AllowList no longer allows withdrawn",
        || {
            provider_labels(&p, "configmap", "plain")
                .is_none()
                .then_some(())
        },
    )
    .await;
    p.eventually(WAIT, "the skipped label gone from the allowed copy", || {
        let labels = provider_labels(&p, "configmap", "allowed")?;
        labels.get("team").is_none().then_some(())
    })
    .await;
    p.eventually(WAIT, "the skipped label gone from the running pod", || {
        let labels = provider_labels(&p, "pod", "steady")?;
        labels.get("team").is_none().then_some(())
    })
    .await;
    assert_eq!(metric(&p.local_admin, VALID).await, 1.0);
    assert_eq!(metric(&p.local_admin, RELOADS).await, 1.0);
    let log = p.local_log();
    let changed = log
        .lines()
        .find(|l| l.contains("settings changed; in force from now on"))
        .expect("the change is logged");
    println!("local agent: {changed}");
    for said in [
        "sharing percentage 50 -> 25",
        "ConfigMap policy DenyList -> AllowList",
        "ConfigMap workers 1 -> 4",
        "Secret workers 3 -> 0",
        "Service workers 3 -> 0",
        "Event workers 3 -> 0",
        "skipped labels +team",
    ] {
        assert!(changed.contains(said), "{said:?} missing from {changed}");
    }
    assert!(
        changed.contains("EndpointSlice workers 0 -> 10"),
        "{changed}"
    );
    let slice = p
        .eventually(WAIT, "the EndpointSlice reflected once turned on", || {
            provider_get(
                &p,
                &[
                    "-n",
                    "tuned-origin",
                    "endpointslice",
                    "web-1",
                    "-o",
                    "jsonpath={.endpoints[*].addresses[0]}",
                ],
            )
        })
        .await;
    println!("EndpointSlice web-1 on the provider after EndpointSlices were turned on: addresses {slice}");
    let turned_on = p
        .local_log()
        .lines()
        .find(|l| l.contains("reflection of the kind turned on") && l.contains("EndpointSlice"))
        .map(str::to_string)
        .expect("turning EndpointSlices on is logged");
    println!("local agent: {turned_on}");
    assert!(
        log.contains("reflection workers resized"),
        "no resize logged"
    );
    // Secrets and Services turned off at once: the copies are withdrawn from the provider.
    p.eventually(WAIT, "the Secret withdrawn", || {
        provider_get(&p, &["-n", "tuned-origin", "secret", "early", "-o", "name"])
            .is_none()
            .then_some(())
    })
    .await;
    p.eventually(WAIT, "the Service withdrawn", || {
        provider_get(&p, &["-n", "tuned-origin", "service", "web", "-o", "name"])
            .is_none()
            .then_some(())
    })
    .await;

    // The offloading patch: the running pod's ShadowPod takes the new toleration; the pod
    // keeps running as it was placed.
    std::fs::write(
        &patch,
        "tolerations:\n- {key: second.example/pool, operator: Exists, effect: NoSchedule}\n",
    )
    .unwrap();
    let tolerations = p
        .eventually(WAIT, "the ShadowPod with the new toleration", || {
            let out = provider_get(
                &p,
                &[
                    "-n",
                    "tuned-origin",
                    "shadowpod",
                    "steady",
                    "-o",
                    "jsonpath={.spec.pod.tolerations}",
                ],
            )?;
            (out.contains("second.example/pool") && !out.contains("first.example/pool"))
                .then_some(out)
        })
        .await;
    println!("ShadowPod tolerations after the patch changed: {tolerations}");
    let after = provider_pod(&p).expect("the provider pod");
    assert_eq!(
        after,
        ("Running".to_string(), pod_uid),
        "the running pod was replaced"
    );
    assert_eq!(metric(&p.local_admin, RELOADS).await, 2.0);
    assert!(p.local_log().contains("offloading patch changed"));

    // Secrets and Services on again: the namespace's Secrets and Services are sent anew.
    std::fs::write(&values, changed_values(2)).unwrap();
    p.eventually(WAIT, "the Secret reflected again", || {
        provider_get(&p, &["-n", "tuned-origin", "secret", "early", "-o", "name"])
    })
    .await;
    p.eventually(WAIT, "the Service reflected again", || {
        provider_get(&p, &["-n", "tuned-origin", "service", "web", "-o", "name"])
    })
    .await;
    assert!(p.local_log().contains("reflection of the kind turned on"));
}
