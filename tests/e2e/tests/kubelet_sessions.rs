//! A tenant that opens as many kubelet sessions as the remote agent allows and never reads
//! them holds no more than their windows: the agent's memory stays within a bound, another
//! tenant's acks stay as fast, the abusing tenant's own reflection stream still moves, and so
//! does the connection the sessions hold. The agent runs with `--max-kubelet-sessions` at the
//! most its flag accepts (60) and the tenant's quota raised to match, the worst case the window
//! budget (`refract_core::limits`) must hold.
//!
//! The abuser speaks the wire itself, as a local agent would with the same windows: its
//! reflection stream on one connection, and on another 60 `ContainerLogs` calls with `follow`
//! on a pod that writes about 100 KiB of log a second, none of them read.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use refract_e2e::wire::connect;
use refract_e2e::{ack_p95, busybox, kubectl_get, rss_kib, Peering};
use refract_testkit::procfs::cpu_seconds;
use refract_wire::proto::kubelet_client::KubeletClient;
use refract_wire::proto::{LogsRequest, Outcome, PodRef, PodStatsRequest};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(90);
/// The flag's ceiling (`refract_core::limits::MAX_KUBELET_SESSIONS`).
const SESSIONS: usize = refract_core::limits::MAX_KUBELET_SESSIONS as usize;
/// What the unread sessions may add to the agent's resident memory.
const RSS_BOUND_KIB: u64 = 64 * 1024;

fn logs_of(pod: &str) -> LogsRequest {
    LogsRequest {
        pod: Some(PodRef {
            namespace: "shop-mallory".into(),
            name: pod.into(),
        }),
        follow: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn unread_kubelet_sessions_cost_their_windows_and_no_one_else_anything() {
    let mut p = Peering::start_offloading().await.expect("peering");
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(
        policy.path(),
        format!("tenants:\n  mallory:\n    quota:\n      kubeletSessions: {SESSIONS}\n"),
    )
    .unwrap();
    p.remote_flags
        .push(format!("--policy={}", policy.path().display()));
    p.restart_remote_with(format!("--max-kubelet-sessions={SESSIONS}"))
        .await;

    let mut bob = p.bystander("bob").await;
    // Mallory's stream on one connection and her kubelet calls on another, as a local agent
    // makes them.
    let mut mallory = p.bystander("mallory").await;
    let stop = CancellationToken::new();
    let calls = connect(
        &p.remote_addr,
        "provider",
        &p.certs.dir.join("mallory"),
        &stop,
    )
    .await
    .unwrap();
    let talker = json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": "talker", "namespace": "shop-mallory"},
        "spec": {"pod": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": busybox(),
            "command": ["sh", "-c", "while true; do head -c 6000 /dev/urandom | base64; sleep 0.05; done"]}]}}});
    let answer = mallory.upsert(&talker).await.unwrap();
    assert_eq!(answer.outcome, Outcome::Applied, "{answer:?}");
    p.eventually(WAIT, "mallory's talker Running on the provider", || {
        let phase = kubectl_get(
            &p.provider,
            &[
                "-n",
                "shop-mallory",
                "pod",
                "talker",
                "-o",
                "jsonpath={.status.phase}",
            ],
        )?;
        (phase == "Running").then_some(())
    })
    .await;

    let pid = p.remote_pid();
    let alone = ack_p95(&mut bob, "shop-bob", 50).await;
    let own_alone = ack_p95(&mut mallory, "shop-mallory", 20).await;
    let rss_before = rss_kib(pid);

    let mut held = Vec::new();
    for i in 0..SESSIONS {
        let call = KubeletClient::new(calls.clone())
            .container_logs(logs_of("talker"))
            .await
            .unwrap_or_else(|e| panic!("session {}: {e}", i + 1));
        held.push(call.into_inner());
    }
    let Err(refused) = KubeletClient::new(calls.clone())
        .container_logs(logs_of("talker"))
        .await
    else {
        panic!("session {} was opened", SESSIONS + 1);
    };
    println!(
        "session {}: {:?} {}",
        SESSIONS + 1,
        refused.code(),
        refused.message()
    );
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);

    // The windows fill within seconds; past a minute, nothing on the way may time the held
    // sessions out or trip over them. Then the agent must be idle, not spinning on them.
    tokio::time::sleep(Duration::from_secs(65)).await;
    // Every session's window is full, and the connection still moves: the connection window
    // holds all of theirs and more (`refract_core::limits`).
    let started = Instant::now();
    let stats = tokio::time::timeout(
        Duration::from_secs(10),
        KubeletClient::new(calls.clone()).pod_stats(PodStatsRequest {}),
    )
    .await
    .expect("a call on the sessions' connection is answered")
    .map(|r| r.into_inner().pods.len());
    println!(
        "PodStats on the connection of the {SESSIONS} full sessions: {stats:?} in {:?}",
        started.elapsed()
    );
    let cpu = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let busy = (cpu_seconds(pid) - cpu) / 5.0;

    let during = ack_p95(&mut bob, "shop-bob", 50).await;
    let own_during = ack_p95(&mut mallory, "shop-mallory", 20).await;
    let rss_during = rss_kib(pid);
    let grew = rss_during.saturating_sub(rss_before);
    println!(
        "{SESSIONS} unread kubelet sessions held 70 s: remote agent RSS {rss_before} KiB -> {rss_during} KiB (+{grew} KiB, bound +{RSS_BOUND_KIB} KiB), CPU {:.0}% while they are held; bob's ack p95 {alone:?} alone, {during:?} during; mallory's own acks p95 {own_alone:?} before, {own_during:?} during",
        busy * 100.0
    );
    assert!(grew <= RSS_BOUND_KIB, "+{grew} KiB");
    assert!(
        during <= alone * 2 + Duration::from_millis(20),
        "{during:?} against {alone:?}"
    );
    assert!(
        own_during <= own_alone * 2 + Duration::from_millis(100),
        "the tenant's own reflection stream stalled behind its sessions: {own_during:?}"
    );
    assert!(busy < 0.10, "the agent spins on held sessions: {busy}");

    // Each held session still has what it was sent, from the log's first line.
    let first = held[0].message().await.unwrap().expect("a chunk");
    assert!(!first.data.is_empty());
    drop(held);
    stop.cancel();
}
