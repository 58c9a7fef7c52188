//! A reflected copy that someone on the provider keeps rewriting, end to end: two real control
//! planes, both agent binaries with their default flags, a provider-side "controller" that
//! patches the copy every 200 ms with kubectl, and what the origin, Inspect (grpcurl) and the
//! metrics say of it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use refract_e2e::{json_of, kubectl_get, kubectl_stdin, metric, Peering};

const WAIT: Duration = Duration::from_secs(60);

/// The ConfigMap `fought`'s `v` on the provider.
fn provider_value(p: &Peering, twin: &str) -> Option<String> {
    kubectl_get(
        &p.provider,
        &["-n", twin, "configmap/fought", "-o", "jsonpath={.data.v}"],
    )
}

async fn until_provider_value(p: &Peering, twin: &str, expect: &str) {
    p.eventually(
        WAIT,
        &format!("configmap/fought v={expect:?} on the provider"),
        || (provider_value(p, twin).as_deref() == Some(expect)).then_some(()),
    )
    .await
}

/// The messages of the origin's events of `reason` on ConfigMap `fought`, once there is one.
async fn until_event(p: &Peering, reason: &str) -> String {
    p.eventually(
        WAIT,
        &format!("a {reason} event on configmap/fought"),
        || {
            let selector =
                format!("involvedObject.name=fought,involvedObject.kind=ConfigMap,reason={reason}");
            let messages = kubectl_get(
                &p.origin,
                &[
                    "-n",
                    "shop",
                    "events",
                    "--field-selector",
                    &selector,
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
            )?;
            (!messages.is_empty()).then_some(messages)
        },
    )
    .await
}

/// What Inspect lists of `fought`.
fn inspected(p: &Peering, twin: &str) -> serde_json::Value {
    let listed = json_of(&p.grpcurl_with(
        Some("client"),
        Some(r#"{"clusterId":"origin","kind":"ConfigMap"}"#),
        &["refract.v1.Inspect/ListObjects"],
    ))
    .unwrap();
    listed["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["object"]["name"] == "fought" && o["object"]["namespace"] == twin)
        .cloned()
        .unwrap_or_else(|| panic!("Inspect does not list fought: {listed}"))
}

/// Asks Inspect, with the tenant's own certificate, to end `fought`'s quarantine.
fn clear_quarantine(p: &Peering, twin: &str) -> serde_json::Value {
    json_of(&p.grpcurl_with(
        Some("client"),
        Some(&format!(
            r#"{{"clusterId":"origin","object":{{"kind":"ConfigMap","namespace":"{twin}","name":"fought"}}}}"#
        )),
        &["refract.v1.Inspect/ClearQuarantine"],
    ))
    .unwrap()
}

/// Patches the copy on the provider every 200 ms until `stop`, as a controller that owns the
/// same field would.
fn spawn_controller(
    p: &Peering,
    twin: &str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    let kubeconfig = p.provider.kubeconfig.display().to_string();
    let twin = twin.to_string();
    std::thread::spawn(move || {
        let mut writes = 0;
        while !stop.load(Ordering::Relaxed) {
            writes += 1;
            let patch = format!(r#"{{"data":{{"v":"controller-{writes}"}}}}"#);
            let _ = std::process::Command::new("kubectl")
                .args(["--kubeconfig", &kubeconfig, "-n", &twin])
                .args(["patch", "configmap", "fought", "-p", &patch])
                .output();
            std::thread::sleep(Duration::from_millis(200));
        }
        writes
    })
}

#[tokio::test]
async fn a_copy_a_provider_controller_keeps_rewriting_is_reported_quarantined_and_cleared() {
    let p = Peering::start(false).await.expect("peering");
    p.extend("shop", "{}");
    let twin = "shop-origin";
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fought, namespace: shop}\ndata: {v: origin}\n",
    );
    until_provider_value(&p, twin, "origin").await;

    // One edit on the provider: restored, and the origin told.
    p.provider_kubectl(&[
        "-n",
        twin,
        "patch",
        "configmap",
        "fought",
        "-p",
        r#"{"data":{"v":"edited"}}"#,
    ]);
    until_provider_value(&p, twin, "origin").await;
    let drifted = until_event(&p, "ReflectionDrifted").await;
    println!("origin event ReflectionDrifted: {drifted}");
    assert!(
        drifted.contains("restored (once in this fight)"),
        "{drifted}"
    );
    assert_eq!(inspected(&p, twin)["restores"], 1);

    // A controller that keeps rewriting it: restored five times within a minute (the
    // default), then quarantined.
    let stop = Arc::new(AtomicBool::new(false));
    let controller = spawn_controller(&p, twin, stop.clone());
    let quarantined = until_event(&p, "ReflectionQuarantined").await;
    println!("origin event ReflectionQuarantined: {quarantined}");
    assert!(
        quarantined.contains("no longer restored (quarantined)"),
        "{quarantined}"
    );
    let listed = inspected(&p, twin);
    println!("Inspect ListObjects: {listed}");
    assert_eq!(listed["restores"], 6, "{listed}");
    assert!(
        listed["quarantinedSince"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{listed}"
    );
    let admin = &p.remote_admin;
    let restores = r#"refract_remote_drift_restores_total{tenant="origin",kind="ConfigMap"}"#;
    assert_eq!(
        metric(
            admin,
            r#"refract_remote_drift_quarantines_total{tenant="origin",kind="ConfigMap"}"#
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            admin,
            r#"refract_remote_drift_quarantined_objects{tenant="origin"}"#
        )
        .await,
        1.0
    );
    let restored_before = metric(admin, restores).await;
    assert_eq!(restored_before, 6.0);

    // The fight is over: the controller goes on for three seconds and nobody restores.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let writes = controller.join().unwrap();
    assert_eq!(metric(admin, restores).await, restored_before);
    let left = provider_value(&p, twin).unwrap_or_default();
    println!("the controller wrote {writes} times; the copy is left as it wrote it: v={left}");
    assert_eq!(left, format!("controller-{writes}"));

    // Cleared by an operator through Inspect: restored at once.
    let cleared = clear_quarantine(&p, twin);
    println!("ClearQuarantine: {cleared}");
    assert_eq!(cleared["cleared"], true, "{cleared}");
    until_provider_value(&p, twin, "origin").await;
    let listed = inspected(&p, twin);
    assert!(listed.get("quarantinedSince").is_none(), "{listed}");
    assert_eq!(
        metric(
            admin,
            r#"refract_remote_drift_quarantined_objects{tenant="origin"}"#
        )
        .await,
        0.0
    );
    // Clearing again finds nothing to clear.
    let again = clear_quarantine(&p, twin);
    assert!(again.get("cleared").is_none(), "{again}");
}
