//! A tenant that opens as many kubelet sessions as the remote agent allows and never reads
//! them holds no more than their windows: the agent's memory stays within a bound, another
//! tenant's acks stay as fast, and the abusing tenant's own reflection stream, which shares
//! the link with the sessions, still moves. The agent runs with `--max-kubelet-sessions` at
//! the most its flag accepts (60), the worst case the window budget must hold.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use refract_e2e::wire::Wire;
use refract_e2e::{busybox, kubectl, kubectl_get, kubectl_stdin, rss_kib, Peering};
use refract_wire::proto::Outcome;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
/// The flag's ceiling (`refract_core::limits::MAX_KUBELET_SESSIONS`).
const SESSIONS: usize = refract_core::limits::MAX_KUBELET_SESSIONS as usize;
/// What the unread sessions may add to the agent's resident memory.
const RSS_BOUND_KIB: u64 = 64 * 1024;

/// The 99th percentile of `n` ConfigMap upserts of bob's, 50 ms apart.
async fn ack_p99(bob: &mut Wire, n: usize) -> Duration {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{}", i % 5), "namespace": "shop-bob"}, "data": {"i": format!("{n}-{i}")}});
        let started = Instant::now();
        let answer = bob.upsert(&cm).await.unwrap();
        assert_eq!(answer.outcome, Outcome::Applied, "{}", answer.message);
        took.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    took.sort();
    took[(n * 99).div_ceil(100) - 1]
}

/// `kubectl logs -f` of the chatty pod at the origin, its output never read: once the pipe is
/// full, kubectl stops reading, and so, window by window, does everything back to the
/// provider's kubelet.
fn unread_follower(p: &Peering) -> Child {
    Command::new("kubectl")
        .arg(format!("--kubeconfig={}", p.origin.kubeconfig.display()))
        .args(["-n", "chatty", "logs", "-f", "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl")
}

/// How long a ConfigMap created at the origin takes to reach the provider.
async fn reflection_latency(p: &Peering, name: &str) -> Duration {
    let started = Instant::now();
    kubectl(&p.origin, &["-n", "chatty", "create", "configmap", name]);
    p.eventually(WAIT, &format!("configmap {name} on the provider"), || {
        kubectl_get(&p.provider, &["-n", "chatty-origin", "configmap", name]).map(|_| ())
    })
    .await;
    started.elapsed()
}

#[tokio::test]
async fn unread_kubelet_sessions_cost_their_windows_and_no_one_else_anything() {
    let mut p = Peering::start_offloading().await.expect("peering");
    p.restart_remote_with(format!("--max-kubelet-sessions={SESSIONS}"))
        .await;
    let image = busybox();
    p.extend("chatty", "{podOffloadingStrategy: Remote}");
    // About 100 KiB of log a second: every session's window is full within seconds.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: talker, namespace: chatty}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: "{image}"
    command: ["sh", "-c", "while true; do head -c 6000 /dev/urandom | base64; sleep 0.05; done"]
"#
        ),
    );
    p.eventually(WAIT, "talker Running at the origin", || {
        let phase = kubectl_get(
            &p.origin,
            &["-n", "chatty", "pod", "talker", "-o", "jsonpath={.status.phase}"],
        )?;
        (phase == "Running").then_some(())
    })
    .await;

    let mut bob = p.bystander("bob").await;
    let pid = p.remote_pid();
    let alone = ack_p99(&mut bob, 50).await;
    let own_alone = reflection_latency(&p, "before").await;
    let rss_before = rss_kib(pid);

    let mut followers: Vec<Child> = (0..SESSIONS).map(|_| unread_follower(&p)).collect();
    // Every session open and its windows filled.
    p.eventually(WAIT, &format!("{SESSIONS} kubelet sessions open"), || {
        let out = p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"]);
        let sessions = String::from_utf8_lossy(&out.stdout)
            .matches("\"ContainerLogs\"")
            .count();
        (sessions >= SESSIONS).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;

    // One more is refused, and says why.
    let extra = unread_follower(&p);
    let refused = tokio::task::spawn_blocking(move || extra.wait_with_output().unwrap())
        .await
        .unwrap();
    let refused_with = String::from_utf8_lossy(&refused.stderr).into_owned();
    println!("session {}: {}", SESSIONS + 1, refused_with.trim());
    assert!(!refused.status.success());
    assert!(refused_with.contains("kubelet"), "{refused_with}");

    let during = ack_p99(&mut bob, 50).await;
    let own_during = reflection_latency(&p, "during").await;
    let rss_during = rss_kib(pid);
    let grew = rss_during.saturating_sub(rss_before);
    println!(
        "{SESSIONS} unread kubelet sessions: remote agent RSS {rss_before} KiB -> {rss_during} KiB (+{grew} KiB, bound +{RSS_BOUND_KIB} KiB); bob's ack p99 {alone:?} alone, {during:?} during; the abusing tenant's own ConfigMap reached the provider in {own_alone:?} before, {own_during:?} during"
    );
    for follower in &mut followers {
        assert!(
            follower.try_wait().unwrap().is_none(),
            "every session stays open, held by its window"
        );
    }
    assert!(grew <= RSS_BOUND_KIB, "+{grew} KiB");
    assert!(
        during <= alone * 2 + Duration::from_millis(20),
        "{during:?} against {alone:?}"
    );
    assert!(
        own_during <= Duration::from_secs(10),
        "the tenant's own reflection stream stalled behind its sessions: {own_during:?}"
    );
    for mut follower in followers {
        let _ = follower.kill();
        let _ = follower.wait();
    }
}
