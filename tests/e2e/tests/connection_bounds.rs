//! No client can hold the remote agent's connections: one that completes its handshake and
//! sends nothing is closed after 10 s; one identity holds at most 16 connections; one source
//! address at most 64, handshaking or not. Meanwhile another tenant's stream, open before the
//! abuse, is answered as fast as before, and the agent's memory stays put.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use refract_e2e::wire::{tls_connection, Wire};
use refract_e2e::{rss_kib, Peering};
use refract_wire::proto::Outcome;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

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

/// Whether the server closes `conn` within `within`.
async fn closed_within(conn: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, conn.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Those of `conns` the server has not closed 300 ms after they were all opened, and how many
/// it closed.
async fn split_closed<C: tokio::io::AsyncRead + Unpin>(conns: Vec<C>) -> (Vec<C>, usize) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut open = Vec::new();
    let mut closed = 0;
    for mut conn in conns {
        if closed_within(&mut conn, Duration::from_millis(5)).await {
            closed += 1;
        } else {
            open.push(conn);
        }
    }
    (open, closed)
}

#[tokio::test]
async fn no_client_can_hold_the_agents_connections() {
    let p = Peering::start(false).await.expect("peering");
    let stop = CancellationToken::new();
    let mut bob = p.bystander("bob").await;
    let pid = p.remote_pid();
    let alone = ack_p99(&mut bob, 50).await;
    let rss_before = rss_kib(pid);

    // A connection that handshakes and sends no HTTP/2 preface is closed after 10 s.
    let mallory = p.certs.issue("mallory", "mallory", "client", &[]);
    let started = Instant::now();
    let mut stalled = tls_connection(&p.remote_addr, "provider", &mallory, &stop)
        .await
        .unwrap();
    assert!(closed_within(&mut stalled, Duration::from_secs(15)).await);
    let stalled_for = started.elapsed();
    println!("a connection that sent nothing was closed after {stalled_for:?}");
    assert!(stalled_for >= Duration::from_secs(9), "{stalled_for:?}");

    // One identity: 16 connections held, the 17th to 20th closed at once.
    let mut conns = Vec::new();
    for _ in 0..20 {
        conns.push(
            tls_connection(&p.remote_addr, "provider", &mallory, &stop)
                .await
                .unwrap(),
        );
    }
    let (held, refused) = split_closed(conns).await;
    println!(
        "one identity: {} connections held, {} closed at once",
        held.len(),
        refused
    );
    assert_eq!((held.len(), refused), (16, 4));
    drop(held);

    // One address: raw TCP connections that never start TLS; past 64 (bob's and the local
    // agent's included) each is closed at once.
    let mut sockets = Vec::new();
    for _ in 0..100 {
        sockets.push(
            tokio::net::TcpStream::connect(&p.remote_addr)
                .await
                .unwrap(),
        );
    }
    let (sockets, closed) = split_closed(sockets).await;
    println!(
        "one address: {} raw connections held, {closed} closed at once",
        sockets.len()
    );
    assert!(
        sockets.len() <= 64 && closed >= 36,
        "{} held",
        sockets.len()
    );

    // Bob, connected before, is answered as fast as before while they are held.
    let during = ack_p99(&mut bob, 50).await;
    let rss_after = rss_kib(pid);
    println!(
        "bob's ack p99: {alone:?} alone, {during:?} with the address's connections held; remote agent RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(
        during <= alone * 2 + Duration::from_millis(20),
        "bob's acks: p99 {during:?} during, {alone:?} before"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the remote agent grew from {rss_before} to {rss_after} KiB"
    );
    drop(sockets);
    stop.cancel();
}
