//! Fuzz-style properties of what reaches the virtual node's kubelet endpoint for `kubectl
//! exec`, `attach` and `port-forward`: SPDY frames and their compressed header blocks, as the
//! origin's API server relays them. A panic ends the local agent, so whatever arrives must
//! decode or be refused, and a session fed anything must end when its input does.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use refract_testkit::fuzz::{config, mutated};
use refract_wire::spdy::frame::{self, Frame, FRAME_HEADER_BYTES};
use refract_wire::spdy::headers::{HeaderDecoder, HeaderEncoder};
use refract_wire::spdy::Role;
use tokio::io::AsyncWriteExt;

/// A client's opening of an exec session and a port-forward: streams with headers, data, a
/// ping and a reset, as `kubectl` sends them through the API server.
fn valid_frames() -> Vec<u8> {
    let header = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut encoder = HeaderEncoder::new();
    let mut out = BytesMut::new();
    for frame in [
        Frame::SynStream {
            stream_id: 1,
            fin: false,
            headers: vec![header("streamtype", "error")],
        },
        Frame::SynStream {
            stream_id: 3,
            fin: false,
            headers: vec![
                header("streamtype", "data"),
                header("port", "8080"),
                header("requestid", "0"),
            ],
        },
        Frame::Data {
            stream_id: 3,
            fin: true,
            data: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
        },
        Frame::Ping { id: 1 },
        Frame::RstStream {
            stream_id: 1,
            status: frame::RST_CANCEL,
        },
    ] {
        frame::encode(&frame, &mut encoder, &mut out).unwrap();
    }
    out.to_vec()
}

/// Decodes `bytes` frame by frame, as a session reads them, until they end or one is refused.
fn decode_all(mut bytes: &[u8]) {
    let mut headers = HeaderDecoder::new();
    while let Some((head, rest)) = bytes.split_first_chunk::<FRAME_HEADER_BYTES>() {
        let Ok(len) = frame::payload_len(head) else {
            return;
        };
        let Some((payload, rest)) = rest.split_at_checked(len) else {
            return;
        };
        if frame::decode(head, Bytes::copy_from_slice(payload), &mut headers).is_err() {
            return;
        }
        bytes = rest;
    }
}

/// Runs a server session whose peer sends `bytes` and then closes its side: the session must
/// end (a panic in its reader would leave it open). Returns how many streams it accepted.
fn session_ends(bytes: Vec<u8>) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let (session, mut accepted) = refract_wire::spdy::start(ours, Role::Server);
        // Take every stream the peer opens, and read what the session answers.
        let streams = tokio::spawn(async move {
            let mut count = 0;
            while accepted.recv().await.is_some() {
                count += 1;
            }
            count
        });
        let (mut answers, mut peer) = tokio::io::split(peer);
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut answers, &mut tokio::io::sink()).await;
        });
        let _ = peer.write_all(&bytes).await;
        let _ = peer.shutdown().await;
        tokio::time::timeout(Duration::from_secs(5), session.closed())
            .await
            .expect("the session ends when its input does");
        streams.await.unwrap()
    })
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        mutated(valid_frames(), 16),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn frames_decode_or_are_refused(bytes in input()) {
        decode_all(&bytes);
    }

    #[test]
    fn a_session_fed_anything_ends_with_its_input(bytes in input()) {
        let _ = session_ends(bytes);
    }
}

#[test]
fn the_valid_frames_decode_as_sent() {
    let bytes = valid_frames();
    let mut headers = HeaderDecoder::new();
    let mut rest = bytes.as_slice();
    let mut kinds = Vec::new();
    while let Some((head, tail)) = rest.split_first_chunk::<FRAME_HEADER_BYTES>() {
        let len = frame::payload_len(head).unwrap();
        let (payload, tail) = tail.split_at(len);
        kinds.push(frame::decode(head, Bytes::copy_from_slice(payload), &mut headers).unwrap());
        rest = tail;
    }
    assert_eq!(kinds.len(), 5);
    assert_eq!(
        session_ends(bytes.clone()),
        2,
        "the session accepts both streams"
    );
    assert!(
        matches!(&kinds[1], Frame::SynStream { stream_id: 3, headers, .. } if headers.contains(&("port".into(), "8080".into())))
    );
}
