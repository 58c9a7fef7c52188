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
use refract_e2e::{ack_p95, rss_kib, Peering};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

/// Whether the server closes `conn` within `within` (whatever it sends first, such as its
/// HTTP/2 settings, is read and dropped).
async fn closed_within(conn: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until_closed = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, until_closed).await.is_ok()
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

/// A peering, a bystander tenant, and what the bystander's acks and the agent's memory are
/// before any abuse.
struct Baseline {
    p: Peering,
    stop: CancellationToken,
    bob: Wire,
    pid: u32,
    alone: Duration,
    rss_before: u64,
}

impl Baseline {
    async fn measure() -> Self {
        let p = Peering::start(false).await.expect("peering");
        let mut bob = p.bystander("bob").await;
        let pid = p.remote_pid();
        let alone = ack_p95(&mut bob, "shop-bob", 50).await;
        let rss_before = rss_kib(pid);
        Self {
            p,
            stop: CancellationToken::new(),
            bob,
            pid,
            alone,
            rss_before,
        }
    }
}

#[tokio::test]
async fn no_client_can_hold_the_agents_connections() {
    let Baseline {
        p,
        stop,
        mut bob,
        pid,
        alone,
        rss_before,
    } = Baseline::measure().await;

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
    let during = ack_p95(&mut bob, "shop-bob", 50).await;
    let rss_after = rss_kib(pid);
    println!(
        "bob's ack p95: {alone:?} alone, {during:?} with the address's connections held; remote agent RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(
        during <= alone * 2 + Duration::from_millis(20),
        "bob's acks: p95 {during:?} during, {alone:?} before"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the remote agent grew from {rss_before} to {rss_after} KiB"
    );
    drop(sockets);
    stop.cancel();
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// An HPACK header block for a gRPC call (static-table names, literal values, no indexing).
fn grpc_request_headers() -> Vec<u8> {
    let literal = |index: u8, value: &str| {
        let mut b = vec![index, value.len() as u8];
        b.extend_from_slice(value.as_bytes());
        b
    };
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    block.extend(literal(0x04, "/refract.v1.Inspect/ListTenants")); // :path
    block.extend(literal(0x01, "localhost")); // :authority
    block.extend([0x0f, 0x10]); // content-type (static index 31)
    block.extend([16]);
    block.extend_from_slice(b"application/grpc");
    block
}

/// Writes `frames` to a fresh connection of `certs`' identity until the server stops taking
/// them; returns the bytes written (socket buffers take some after the server stopped
/// reading) and whether it closed the connection.
async fn flood(
    p: &Peering,
    certs: &std::path::Path,
    stop: &CancellationToken,
    mut frames: impl FnMut(u32) -> Vec<u8>,
    batches: u32,
) -> (usize, bool) {
    use tokio::io::AsyncWriteExt;
    let conn = tls_connection(&p.remote_addr, "provider", certs, stop)
        .await
        .unwrap();
    let (mut rx, mut tx) = tokio::io::split(conn);
    let mut start = PREFACE.to_vec();
    start.extend(frame(SETTINGS, 0, 0, &[]));
    tx.write_all(&start).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    });
    let mut sent = 0;
    for batch in 0..batches {
        let bytes = frames(batch);
        if tx.write_all(&bytes).await.is_err() || tx.flush().await.is_err() {
            break;
        }
        sent += bytes.len();
        if reader.is_finished() {
            break;
        }
    }
    let closed = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .map(|r| r.unwrap())
        .unwrap_or(false);
    (sent, closed)
}

#[tokio::test]
async fn rapid_reset_and_continuation_floods_cost_the_agent_nothing() {
    let Baseline {
        p,
        stop,
        mut bob,
        pid,
        alone,
        rss_before,
    } = Baseline::measure().await;
    let mallory = p.certs.issue("mallory", "mallory", "client", &[]);

    // Rapid reset: 100 streams opened and reset at once per batch, up to 100,000.
    let headers = grpc_request_headers();
    let (p_ref, stop_ref, mallory_ref) = (&p, &stop, &mallory);
    let resets = async move {
        flood(
            p_ref,
            mallory_ref,
            stop_ref,
            |batch| {
                let mut bytes = Vec::new();
                for i in 0..100u32 {
                    let stream = (batch * 100 + i) * 2 + 1;
                    bytes.extend(frame(HEADERS, END_HEADERS, stream, &headers));
                    bytes.extend(frame(RST_STREAM, 0, stream, &8u32.to_be_bytes()));
                }
                bytes
            },
            1000,
        )
        .await
    };
    let (resets, during_resets) = tokio::join!(resets, ack_p95(&mut bob, "shop-bob", 50));
    println!(
        "rapid reset: {} KiB of HEADERS+RST_STREAM pairs written (socket buffers included) until the agent closed the connection: {}; bob's ack p95 {alone:?} alone, {during_resets:?} during",
        resets.0 / 1024,
        resets.1
    );
    assert!(resets.1, "the connection was not closed");

    // CONTINUATION: a request's headers that never end.
    let padding: Vec<u8> = std::iter::repeat_n([0x00u8, 0x01, b'a', 0x01, b'b'], 16 * 1024 / 5)
        .flatten()
        .collect();
    let continuation = async {
        flood(
            &p,
            &mallory,
            &stop,
            |batch| {
                if batch == 0 {
                    frame(HEADERS, 0, 1, &grpc_request_headers())
                } else {
                    frame(CONTINUATION, 0, 1, &padding)
                }
            },
            10_000,
        )
        .await
    };
    let (continued, during_continuation) =
        tokio::join!(continuation, ack_p95(&mut bob, "shop-bob", 50));
    let rss_after = rss_kib(pid);
    println!(
        "CONTINUATION flood: {} KiB written (socket buffers included) until the agent closed the connection: {}; bob's ack p95 {during_continuation:?}; remote agent RSS {rss_before} KiB -> {rss_after} KiB",
        continued.0 / 1024,
        continued.1
    );
    assert!(continued.1, "the connection was not closed");
    for during in [during_resets, during_continuation] {
        assert!(
            during <= alone * 2 + Duration::from_millis(20),
            "bob's acks: p95 {during:?} during a flood, {alone:?} before"
        );
    }
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the remote agent grew from {rss_before} to {rss_after} KiB"
    );
    stop.cancel();
}
