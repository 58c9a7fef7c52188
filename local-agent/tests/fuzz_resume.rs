//! Fuzz-style property of resuming ([`refract_local_agent::resume`]): whatever the provider says
//! it holds (honest or not, in Welcome and in inventory pages), and in whatever order the
//! producers' messages come, every object's latest Upsert is either sent or answered, once the
//! hold limit has passed; nothing panics and nothing stays held.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeMap;
use std::time::Instant;

use proptest::prelude::*;
use refract_core::hash::{bucket_digest, bytes_hash};
use refract_local_agent::resume::{Resume, Step, HOLD_LIMIT};
use refract_testkit::fuzz::config;
use refract_wire::proto::{
    local_message, BucketDigest, Delete, Inventory, InventoryEntry, LocalMessage, ObjectRef,
    SnapshotComplete, Upsert,
};

const NAMESPACES: [&str; 2] = ["a", "b"];
const NAMES: [&str; 3] = ["x", "y", "z"];

#[derive(Debug, Clone)]
enum Op {
    Upsert(usize, usize, u8),
    Delete(usize, usize),
    Snapshot(usize),
    Page(usize, Vec<(usize, u8)>, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..3usize, 0..3u8).prop_map(|(n, o, d)| Op::Upsert(n, o, d)),
        1 => (0..2usize, 0..3usize).prop_map(|(n, o)| Op::Delete(n, o)),
        2 => (0..2usize).prop_map(Op::Snapshot),
        2 => (0..2usize, prop::collection::vec((0..3usize, 0..3u8), 0..4), any::<bool>())
            .prop_map(|(n, e, l)| Op::Page(n, e, l)),
    ]
}

/// What the provider says it holds of one namespace: nothing, or some objects (name, data) with
/// an honest digest, or with a made-up digest and count.
type Described = Option<(Vec<(usize, u8)>, bool, u32)>;

fn described() -> impl Strategy<Value = Described> {
    prop::option::of((
        prop::collection::vec((0..3usize, 0..3u8), 0..4),
        any::<bool>(),
        0..6u32,
    ))
}

fn object(ns: usize, name: usize) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: NAMESPACES[ns].into(),
        name: NAMES[name].into(),
    }
}

fn json(data: u8) -> Vec<u8> {
    format!(r#"{{"data":"{data}"}}"#).into_bytes()
}

fn bucket(ns: usize, held: &[(usize, u8)], honest: bool, count: u32) -> BucketDigest {
    let entries: BTreeMap<&str, String> = held
        .iter()
        .map(|(n, d)| (NAMES[*n], bytes_hash(&json(*d))))
        .collect();
    BucketDigest {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: NAMESPACES[ns].into(),
        count: if honest { entries.len() as u32 } else { count },
        digest: if honest {
            bucket_digest(entries.iter().map(|(n, h)| (*n, h.as_str())))
        } else {
            format!("made-up-{count}")
        },
    }
}

fn message(kind: local_message::Kind) -> LocalMessage {
    LocalMessage { kind: Some(kind) }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_latest_upsert_is_sent_or_answered(
        welcome in prop::collection::vec(described(), 2),
        ops in prop::collection::vec(op(), 0..40),
    ) {
        let buckets = welcome
            .iter()
            .enumerate()
            .filter_map(|(ns, d)| d.as_ref().map(|(held, honest, count)| bucket(ns, held, *honest, *count)))
            .collect();
        let start = Instant::now();
        let mut resume = Resume::new(buckets, start);
        let mut steps: Vec<Step> = Vec::new();
        // (namespace, name) → the revision of its latest Upsert and where the steps stood then,
        // or None after a Delete.
        let mut latest: BTreeMap<(usize, usize), Option<(String, usize)>> = BTreeMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            let out = match op {
                Op::Upsert(ns, name, data) => {
                    let revision = format!("r{i}");
                    latest.insert((ns, name), Some((revision.clone(), steps.len())));
                    resume.outgoing(message(local_message::Kind::Upsert(Upsert {
                        object: Some(object(ns, name)),
                        revision,
                        object_json: json(data),
                        origin_uid: String::new(),
                        awaited: false,
                        trace_parent: String::new(),
                    })), start)
                }
                Op::Delete(ns, name) => {
                    latest.insert((ns, name), None);
                    resume.outgoing(message(local_message::Kind::Delete(Delete {
                        object: Some(object(ns, name)),
                        revision: String::new(),
                        grace_period_seconds: None,
                    })), start)
                }
                Op::Snapshot(ns) => resume.outgoing(message(local_message::Kind::SnapshotComplete(SnapshotComplete {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    namespace: NAMESPACES[ns].into(),
                    resumed: false,
                })), start),
                Op::Page(ns, entries, last) => resume.inventory(Inventory {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    namespace: NAMESPACES[ns].into(),
                    entries: entries.iter().map(|(n, d)| InventoryEntry {
                        name: NAMES[*n].into(),
                        origin_hash: bytes_hash(&json(*d)),
                    }).collect(),
                    last,
                }),
            };
            steps.extend(out);
        }
        steps.extend(resume.expire(start + HOLD_LIMIT * 3));
        prop_assert_eq!(resume.pending(), 0);
        for ((ns, name), wanted) in latest {
            let Some((revision, from)) = wanted else { continue };
            let delivered = steps[from..].iter().any(|step| match step {
                Step::Ack(ack) => ack.revision == revision && ack.object == Some(object(ns, name)),
                Step::Send(LocalMessage { kind: Some(local_message::Kind::Upsert(u)) }) => u.revision == revision,
                _ => false,
            });
            prop_assert!(delivered, "the latest Upsert of {}/{} ({}) was neither sent nor answered", NAMESPACES[ns], NAMES[name], revision);
        }
    }
}
