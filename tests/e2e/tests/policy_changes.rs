//! The provider's policy file changed while the remote agent runs: a malformed file is refused
//! whole with the last good policy kept (and a metric says so), and a valid tightening is in
//! force at once and judges again what is already written: a running pod that no longer meets
//! the tenant's Pod Security level is reported (a `RefusedByPolicy` Warning event on the origin
//! pod) and left running, then removed once the policy says `removeRefused`, and the origin pod
//! shows why (Pending, `OffloadingDenied`, and a Warning event).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{busybox, kubectl_stdin, metric, origin_get, provider_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

fn remote_phase(p: &Peering) -> Option<String> {
    provider_get(
        p,
        &[
            "-n",
            "apps-origin",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.phase}",
        ],
    )
}

/// The origin pod's phase and reason, space-separated.
fn origin_phase_and_reason(p: &Peering) -> Option<String> {
    origin_get(
        p,
        &[
            "-n",
            "apps",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
        ],
    )
}

/// The messages of the origin pod's events of `reason`, space-separated.
fn web_events(p: &Peering, reason: &str) -> Option<String> {
    origin_get(
        p,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            &format!("involvedObject.name=web,reason={reason}"),
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
}

#[tokio::test]
async fn a_tightened_policy_removes_a_running_pod_it_now_refuses_and_a_bad_file_changes_nothing() {
    let mut p = Peering::start_offloading().await.expect("peering");
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(
        policy.path(),
        "tenants:\n  origin:\n    removeRefused: true\n",
    )
    .unwrap();
    p.restart_remote_with(format!("--policy={}", policy.path().display()))
        .await;
    p.until_node_ready(WAIT).await;
    p.extend("apps", "{podOffloadingStrategy: Remote}");
    // Runs as root: baseline allows it, restricted does not.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: apps}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
            busybox()
        ),
    );
    p.eventually(WAIT, "web Running on the provider", || {
        (remote_phase(&p)? == "Running").then_some(())
    })
    .await;
    let admin = p.remote_admin.clone();
    assert_eq!(
        metric(&admin, "refract_remote_policy_file_valid").await,
        1.0
    );

    // A typo: refused whole, naming the field; the pod runs on under the last good policy.
    std::fs::write(
        policy.path(),
        "tenants:\n  origin:\n    podSecurty: restricted\n    removeRefused: true\n",
    )
    .unwrap();
    p.eventually(WAIT, "the bad file refused", || {
        let log = p.remote_log();
        (log.contains("policy file refused; the last good policy stays in force")
            && log.contains("unknown field `podSecurty`"))
        .then_some(())
    })
    .await;
    let mut valid = 1.0;
    for _ in 0..20 {
        valid = metric(&admin, "refract_remote_policy_file_valid").await;
        if valid == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(valid, 0.0, "the metric says the file on disk is refused");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(remote_phase(&p).as_deref(), Some("Running"));

    // Tightened, without removeRefused: the running pod is judged again, refused and left
    // running, and the origin pod gets a Warning event saying so.
    std::fs::write(
        policy.path(),
        "tenants:\n  origin:\n    podSecurity: restricted\n",
    )
    .unwrap();
    let reported = p
        .eventually(WAIT, "a RefusedByPolicy event on the origin pod", || {
            let events = web_events(&p, "RefusedByPolicy")?;
            (!events.is_empty()).then_some(events)
        })
        .await;
    assert!(reported.contains("allowPrivilegeEscalation"), "{reported}");
    assert_eq!(remote_phase(&p).as_deref(), Some("Running"), "left running");
    let log = p.remote_log();
    let changed = log
        .lines()
        .find(|l| l.contains("policy file changed"))
        .expect("the change is logged");
    assert!(changed.contains("tenant origin changed"), "{changed}");
    println!("remote agent: {changed}");
    println!("reported, not removed: {reported}");

    // With removeRefused: judged again and removed.
    std::fs::write(
        policy.path(),
        "tenants:\n  origin:\n    podSecurity: restricted\n    removeRefused: true\n",
    )
    .unwrap();
    p.eventually(WAIT, "the refused pod removed from the provider", || {
        remote_phase(&p).is_none().then_some(())
    })
    .await;
    let message = p
        .eventually(WAIT, "a Warning event on the origin pod saying why", || {
            let events = web_events(&p, "OffloadingDenied")?;
            events
                .contains("removed after a policy change")
                .then_some(events)
        })
        .await;
    println!("origin pod event: {message}");
    assert!(message.contains("allowPrivilegeEscalation"), "{message}");
    // Pending with the reason, and no later status of the provider's going pod over it.
    p.eventually(WAIT, "the origin pod Pending with the reason", || {
        (origin_phase_and_reason(&p)? == "Pending OffloadingDenied").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = origin_phase_and_reason(&p);
    assert_eq!(status.as_deref(), Some("Pending OffloadingDenied"));
    assert_eq!(
        metric(&admin, "refract_remote_policy_file_valid").await,
        1.0
    );
    assert_eq!(
        metric(
            &admin,
            "refract_remote_policy_refusals_total{tenant=\"origin\"}"
        )
        .await,
        2.0,
        "refused once reported, once removed"
    );
}
