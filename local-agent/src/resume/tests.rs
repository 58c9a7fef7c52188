use super::*;
use refract_wire::proto::InventoryEntry;

const CM: (&str, &str) = ("v1", "ConfigMap");

fn object(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef {
        api_version: CM.0.into(),
        kind: CM.1.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn upsert(namespace: &str, name: &str, data: &str) -> LocalMessage {
    LocalMessage {
        kind: Some(local_message::Kind::Upsert(Upsert {
            object: Some(object(namespace, name)),
            revision: format!("rv-{name}"),
            object_json: format!(r#"{{"data":"{data}"}}"#).into_bytes(),
            origin_uid: String::new(),
            awaited: false,
            trace_parent: String::new(),
        })),
    }
}

fn delete(namespace: &str, name: &str) -> LocalMessage {
    LocalMessage {
        kind: Some(local_message::Kind::Delete(Delete {
            object: Some(object(namespace, name)),
            revision: String::new(),
            grace_period_seconds: None,
        })),
    }
}

fn snapshot(namespace: &str, resumed: bool) -> LocalMessage {
    LocalMessage {
        kind: Some(local_message::Kind::SnapshotComplete(SnapshotComplete {
            api_version: CM.0.into(),
            kind: CM.1.into(),
            namespace: namespace.into(),
            resumed,
        })),
    }
}

fn hash_of(data: &str) -> String {
    bytes_hash(format!(r#"{{"data":"{data}"}}"#).as_bytes())
}

/// What the provider holds: `(name, data)` pairs of one namespace's ConfigMaps.
fn provider(namespace: &str, objects: &[(&str, &str)]) -> BucketDigest {
    let hashes: Vec<_> = objects.iter().map(|(n, d)| (*n, hash_of(d))).collect();
    BucketDigest {
        api_version: CM.0.into(),
        kind: CM.1.into(),
        namespace: namespace.into(),
        count: objects.len() as u32,
        digest: bucket_digest(hashes.iter().map(|(n, h)| (*n, h.as_str()))),
    }
}

fn inventory(namespace: &str, objects: &[(&str, &str)], last: bool) -> Inventory {
    Inventory {
        api_version: CM.0.into(),
        kind: CM.1.into(),
        namespace: namespace.into(),
        entries: objects
            .iter()
            .map(|(n, d)| InventoryEntry {
                name: n.to_string(),
                origin_hash: hash_of(d),
            })
            .collect(),
        last,
    }
}

/// The steps, shortened: "send upsert a", "ack a", "send delete a", "send snapshot",
/// "send snapshot resumed", "send inventory request".
fn shown(steps: &[Step]) -> Vec<String> {
    use local_message::Kind;
    steps
        .iter()
        .map(|s| match s {
            Step::Ack(a) => {
                assert_eq!(a.outcome, Outcome::Unchanged as i32);
                format!("ack {}", a.object.as_ref().unwrap().name)
            }
            Step::Send(m) => match &m.kind {
                Some(Kind::Upsert(u)) => format!("send upsert {}", u.object.as_ref().unwrap().name),
                Some(Kind::Delete(d)) => format!("send delete {}", d.object.as_ref().unwrap().name),
                Some(Kind::SnapshotComplete(s)) if s.resumed => "send snapshot resumed".into(),
                Some(Kind::SnapshotComplete(_)) => "send snapshot".into(),
                Some(Kind::InventoryRequest(_)) => "send inventory request".into(),
                other => format!("send {other:?}"),
            },
        })
        .collect()
}

fn feed(resume: &mut Resume, messages: Vec<LocalMessage>) -> Vec<String> {
    let now = Instant::now();
    let steps: Vec<Step> = messages
        .into_iter()
        .flat_map(|m| resume.outgoing(m, now))
        .collect();
    shown(&steps)
}

#[test]
fn without_a_description_everything_passes() {
    let mut resume = Resume::new(Vec::new(), Instant::now());
    let steps = feed(
        &mut resume,
        vec![upsert("a", "x", "1"), snapshot("a", false)],
    );
    assert_eq!(steps, ["send upsert x", "send snapshot"]);
    assert_eq!(resume.pending(), 0);
}

#[test]
fn an_unchanged_bucket_sends_nothing_and_answers_every_upsert() {
    let mut resume = Resume::new(
        vec![provider("a", &[("x", "1"), ("y", "2")])],
        Instant::now(),
    );
    let steps = feed(
        &mut resume,
        vec![
            upsert("a", "y", "2"),
            upsert("a", "x", "1"),
            snapshot("a", false),
        ],
    );
    assert_eq!(steps, ["ack x", "ack y"]);
    let tally = resume.tally();
    assert_eq!((tally.skipped_objects, tally.equal), (2, 1));
    assert!(tally.skipped_bytes > 0);
    assert_eq!(resume.pending(), 0);
    // Settled: later changes of the bucket pass at once.
    let later = feed(&mut resume, vec![upsert("a", "x", "3")]);
    assert_eq!(later, ["send upsert x"]);
}

#[test]
fn a_changed_bucket_sends_only_what_differs_and_deletes_what_is_gone() {
    let mut resume = Resume::new(
        vec![provider(
            "a",
            &[("same", "1"), ("changed", "old"), ("gone", "1")],
        )],
        Instant::now(),
    );
    let steps = feed(
        &mut resume,
        vec![
            upsert("a", "same", "1"),
            upsert("a", "changed", "new"),
            upsert("a", "new", "1"),
            snapshot("a", false),
        ],
    );
    assert_eq!(steps, ["send inventory request"]);
    // The first page alone settles nothing.
    let first = resume.inventory(inventory("a", &[("changed", "old")], false));
    assert!(first.is_empty());
    // An Upsert while the inventory comes is held with the rest.
    assert!(feed(&mut resume, vec![upsert("a", "same", "1")]).is_empty());
    let last = resume.inventory(inventory("a", &[("gone", "1"), ("same", "1")], true));
    assert_eq!(
        shown(&last),
        [
            "send upsert changed",
            "send upsert new",
            "ack same",
            "send delete gone",
            "send snapshot resumed"
        ]
    );
    assert_eq!(resume.tally().different, 1);
    assert_eq!(resume.pending(), 0);
}

#[test]
fn a_delete_drops_the_held_upsert_and_passes() {
    let mut resume = Resume::new(vec![provider("a", &[("x", "1")])], Instant::now());
    let steps = feed(
        &mut resume,
        vec![
            upsert("a", "x", "1"),
            delete("a", "x"),
            snapshot("a", false),
        ],
    );
    // x is gone locally, so the digests differ and the inventory decides.
    assert_eq!(steps, ["send delete x", "send inventory request"]);
    let last = resume.inventory(inventory("a", &[("x", "1")], true));
    assert_eq!(shown(&last), ["send delete x", "send snapshot resumed"]);
}

#[test]
fn other_buckets_and_messages_pass() {
    let mut resume = Resume::new(vec![provider("a", &[("x", "1")])], Instant::now());
    let steps = feed(
        &mut resume,
        vec![upsert("b", "x", "1"), snapshot("b", false)],
    );
    assert_eq!(steps, ["send upsert x", "send snapshot"]);
    assert_eq!(resume.pending(), 1);
}

#[test]
fn pages_nobody_asked_for_are_ignored() {
    let mut resume = Resume::new(vec![provider("a", &[("x", "1")])], Instant::now());
    assert!(resume
        .inventory(inventory("a", &[("x", "2")], true))
        .is_empty());
    assert!(resume
        .inventory(inventory("z", &[("x", "2")], true))
        .is_empty());
    assert_eq!(resume.pending(), 1);
}

#[test]
fn an_inventory_larger_than_announced_sends_the_bucket_in_full() {
    let mut resume = Resume::new(vec![provider("a", &[("x", "1")])], Instant::now());
    feed(
        &mut resume,
        vec![upsert("a", "x", "2"), snapshot("a", false)],
    );
    let steps = resume.inventory(inventory("a", &[("x", "1"), ("y", "1")], false));
    assert_eq!(shown(&steps), ["send upsert x", "send snapshot"]);
    assert_eq!(resume.pending(), 0);
}

#[test]
fn a_bucket_held_too_long_is_sent_in_full() {
    let start = Instant::now();
    let mut resume = Resume::new(
        vec![provider("a", &[("x", "1")]), provider("b", &[("y", "1")])],
        start,
    );
    assert!(resume.outgoing(upsert("a", "x", "1"), start).is_empty());
    assert_eq!(resume.next_deadline(), Some(start + HOLD_LIMIT));
    assert!(resume.expire(start + HOLD_LIMIT / 2).is_empty());
    let steps = resume.expire(start + HOLD_LIMIT);
    // The producers never finished a: no SnapshotComplete, so nothing is collected. b was
    // never touched (a namespace no longer extended): let go, nothing sent.
    assert_eq!(shown(&steps), ["send upsert x"]);
    assert_eq!(resume.tally().expired, 2);
    assert_eq!(resume.pending(), 0);
    assert_eq!(resume.next_deadline(), None);
}
