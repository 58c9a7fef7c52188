//! The outbox's decisions, without a session: what is sent, what an ack answers, what a new
//! session forgets.

use std::time::{Duration, Instant};

use refract_core::options::Kind;
use refract_wire::proto::{Ack, ObjectRef, Outcome, Upsert};

use super::ledger::{AckState, Admit, Ledger, Origin, Producer, RemoteKey, Request, Times};
use crate::key::Key;

fn mk_key(ns: &str, name: &str) -> Key {
    Key {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn mk_origin(producer: Producer, ns: &str, name: &str) -> Origin {
    Origin::new(producer, mk_key(ns, name))
}

fn mk_ref(kind: &str, ns: &str, name: &str) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: kind.into(),
        namespace: ns.into(),
        name: name.into(),
    }
}

fn mk_upsert(kind: &str, ns: &str, name: &str, body: &str, revision: &str, uid: &str) -> Upsert {
    Upsert {
        object: Some(mk_ref(kind, ns, name)),
        revision: revision.into(),
        object_json: body.as_bytes().to_vec(),
        origin_uid: uid.into(),
        awaited: false,
        trace_parent: String::new(),
    }
}

fn mk_ack(kind: &str, ns: &str, name: &str, revision: &str, outcome: Outcome) -> Ack {
    Ack {
        object: Some(mk_ref(kind, ns, name)),
        revision: revision.into(),
        outcome: outcome as i32,
        message: format!("{outcome:?}"),
        awaited: false,
        restores: 0,
    }
}

/// The ledger's reading of the provider's ack of `kind` `ns/name` at `revision`.
fn answer(
    l: &mut Ledger,
    kind: &str,
    ns: &str,
    name: &str,
    revision: &str,
    outcome: Outcome,
) -> Option<super::ledger::Answer> {
    l.answer(&mk_ack(kind, ns, name, revision, outcome))
}

/// Offloads pod `apps/web` (UID `uid-web`) as ShadowPod `apps-o/web` on session 1.
fn offload_web(l: &mut Ledger, now: Instant) -> Origin {
    let pod = mk_origin(Producer::Pods, "apps", "web");
    let up = mk_upsert("ShadowPod", "apps-o", "web", "{}", "5", "uid-web");
    record(l, 1, pod.clone(), &up, now);
    pod
}

/// Records `upsert` as the outbox does, hashing it first.
fn record(l: &mut Ledger, generation: u64, origin: Origin, upsert: &Upsert, now: Instant) -> Admit {
    let hash = refract_core::hash::bytes_hash(&upsert.object_json);
    let times = Times {
        noticed: now,
        sent: now,
    };
    l.upsert(generation, origin, upsert, hash, times)
}

const CONFIGMAPS: Producer = Producer::Objects(Kind::ConfigMap);
const SECRETS: Producer = Producer::Objects(Kind::Secret);

#[test]
fn the_same_bytes_are_sent_once_per_session_and_again_on_the_next() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let cm = mk_origin(CONFIGMAPS, "shop", "a");
    let up = mk_upsert("ConfigMap", "shop-o", "a", "{\"v\":1}", "10", "u1");
    assert_eq!(record(&mut l, 1, cm.clone(), &up, now), Admit::Send);
    assert_eq!(record(&mut l, 1, cm.clone(), &up, now), Admit::AlreadySent);
    let changed = mk_upsert("ConfigMap", "shop-o", "a", "{\"v\":2}", "11", "u1");
    assert_eq!(record(&mut l, 1, cm.clone(), &changed, now), Admit::Send);
    // A new session has been sent nothing.
    assert_eq!(record(&mut l, 2, cm.clone(), &changed, now), Admit::Send);
    // What a replaced session's producer still offers is not recorded.
    assert_eq!(record(&mut l, 1, cm.clone(), &up, now), Admit::Stale);
    assert_eq!(l.get(&cm).unwrap().revision, "11");
}

#[test]
fn an_ack_records_its_state_and_reaches_the_producer_of_that_object() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let cm = mk_origin(CONFIGMAPS, "shop", "a");
    record(
        &mut l,
        1,
        cm.clone(),
        &mk_upsert("ConfigMap", "shop-o", "a", "{}", "10", "u1"),
        now,
    );
    assert_eq!(l.get(&cm).unwrap().state, AckState::Pending);
    let a = answer(&mut l, "ConfigMap", "shop-o", "a", "10", Outcome::Applied).unwrap();
    assert_eq!(a.origin, cm);
    assert_eq!(a.request, Request::Upsert);
    assert_eq!(a.origin_uid, "u1");
    assert_eq!(l.get(&cm).unwrap().state, AckState::Applied);
    // An object this session never sent concerns nobody.
    assert!(answer(&mut l, "ConfigMap", "shop-o", "b", "1", Outcome::Applied).is_none());
}

#[test]
fn a_secret_and_a_token_secret_are_told_apart_by_the_provider_object() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let secret = mk_origin(SECRETS, "shop", "creds");
    let token = mk_origin(Producer::Tokens, "shop", "web");
    record(
        &mut l,
        1,
        secret.clone(),
        &mk_upsert("Secret", "shop-o", "creds", "{}", "1", "s"),
        now,
    );
    record(
        &mut l,
        1,
        token.clone(),
        &mk_upsert("Secret", "shop-o", "web-token", "{}", "2", "p"),
        now,
    );
    let a = answer(
        &mut l,
        "Secret",
        "shop-o",
        "web-token",
        "2",
        Outcome::Denied,
    )
    .unwrap();
    assert_eq!(a.origin, token);
    assert_eq!(l.get(&token).unwrap().state, AckState::Refused);
    assert_eq!(l.get(&secret).unwrap().state, AckState::Pending);
}

#[test]
fn a_pod_and_its_token_secret_share_the_uid_and_resolve_apart() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let pod = offload_web(&mut l, now);
    let token = mk_origin(Producer::Tokens, "apps", "web");
    record(
        &mut l,
        1,
        token.clone(),
        &mk_upsert("Secret", "apps-o", "web-token", "{}", "5", "uid-web"),
        now,
    );
    assert_eq!(l.by_uid(Producer::Pods, "uid-web").unwrap().0, &pod);
    assert_eq!(l.by_uid(Producer::Tokens, "uid-web").unwrap().0, &token);
    l.forget(&token);
    assert_eq!(l.by_uid(Producer::Pods, "uid-web").unwrap().0, &pod);
}

#[test]
fn a_transient_failure_forgets_the_object_so_that_it_is_sent_again() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let cm = mk_origin(CONFIGMAPS, "shop", "a");
    let up = mk_upsert("ConfigMap", "shop-o", "a", "{}", "10", "u1");
    record(&mut l, 1, cm.clone(), &up, now);
    let a = answer(&mut l, "ConfigMap", "shop-o", "a", "10", Outcome::Transient).unwrap();
    assert_eq!(a.outcome, Outcome::Transient);
    assert!(l.get(&cm).is_none());
    assert_eq!(record(&mut l, 1, cm, &up, now), Admit::Send);
}

#[test]
fn a_resend_request_forgets_a_sent_object_so_it_goes_again_and_is_no_answer() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let cm = mk_origin(CONFIGMAPS, "shop", "a");
    let up = mk_upsert("ConfigMap", "shop-o", "a", "{}", "10", "u1");
    record(&mut l, 1, cm.clone(), &up, now);
    answer(&mut l, "ConfigMap", "shop-o", "a", "10", Outcome::Applied);
    assert_eq!(record(&mut l, 1, cm.clone(), &up, now), Admit::AlreadySent);
    // Asked for again (the copy was edited on the provider), whatever revision it was sent at.
    let a = answer(&mut l, "ConfigMap", "shop-o", "a", "", Outcome::Resend).unwrap();
    assert_eq!((a.origin, a.outcome), (cm.clone(), Outcome::Resend));
    assert_eq!(a.times, None, "not an answer: no latency to observe");
    assert_eq!(record(&mut l, 1, cm, &up, now), Admit::Send);
    // Objects it was never sent, and objects being deleted, are not asked for.
    assert!(answer(&mut l, "ConfigMap", "shop-o", "other", "", Outcome::Resend).is_none());
    let pod = offload_web(&mut l, now);
    l.delete(1, &pod).unwrap();
    assert!(answer(&mut l, "ShadowPod", "apps-o", "web", "", Outcome::Resend).is_none());
}

#[test]
fn an_ack_of_an_older_revision_changes_nothing() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let cm = mk_origin(CONFIGMAPS, "shop", "a");
    record(
        &mut l,
        1,
        cm.clone(),
        &mk_upsert("ConfigMap", "shop-o", "a", "{\"v\":1}", "10", "u"),
        now,
    );
    record(
        &mut l,
        1,
        cm.clone(),
        &mk_upsert("ConfigMap", "shop-o", "a", "{\"v\":2}", "11", "u"),
        now,
    );
    // The first failed transiently, but the second is on its way: nothing to resend.
    assert!(answer(&mut l, "ConfigMap", "shop-o", "a", "10", Outcome::Transient).is_none());
    assert_eq!(l.get(&cm).unwrap().state, AckState::Pending);
    answer(&mut l, "ConfigMap", "shop-o", "a", "11", Outcome::Applied);
    assert_eq!(l.get(&cm).unwrap().state, AckState::Applied);
}

#[test]
fn a_delete_forgets_the_object_and_its_confirmation_names_the_origin_and_uid() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let pod = offload_web(&mut l, now);
    let remote = l.delete(1, &pod).unwrap();
    assert_eq!(remote.name, "web");
    assert!(l.get(&pod).is_none());
    assert!(l.delete(1, &pod).is_none(), "nothing left to delete");
    let failed = answer(&mut l, "ShadowPod", "apps-o", "web", "", Outcome::Transient).unwrap();
    assert_eq!(failed.request, Request::Delete);
    let done = answer(&mut l, "ShadowPod", "apps-o", "web", "", Outcome::Applied).unwrap();
    assert_eq!(
        (done.request, done.origin, done.origin_uid.as_str()),
        (Request::Delete, pod, "uid-web")
    );
    assert!(answer(&mut l, "ShadowPod", "apps-o", "web", "", Outcome::Applied).is_none());
}

#[test]
fn indexes_follow_a_replaced_object_and_are_not_taken_from_another() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let pod = mk_origin(Producer::Pods, "apps", "web");
    record(
        &mut l,
        1,
        pod.clone(),
        &mk_upsert("ShadowPod", "apps-o", "web", "{}", "1", "old"),
        now,
    );
    // The same name, a new pod (a new UID): the old UID resolves no more.
    record(
        &mut l,
        1,
        pod.clone(),
        &mk_upsert("ShadowPod", "apps-o", "web", "{\"n\":1}", "2", "new"),
        now,
    );
    assert!(l.by_uid(Producer::Pods, "old").is_none());
    assert_eq!(l.by_uid(Producer::Pods, "new").unwrap().0, &pod);
    // Another origin object sent as the same provider object takes its index; forgetting the
    // first must not remove the second's.
    let other = mk_origin(Producer::Pods, "apps", "web-2");
    record(
        &mut l,
        1,
        other.clone(),
        &mk_upsert("ShadowPod", "apps-o", "web", "{}", "3", "u2"),
        now,
    );
    l.forget(&pod);
    let remote = RemoteKey::new("ShadowPod", "apps-o", "web");
    assert_eq!(l.by_remote(&remote).unwrap().0, &other);
}

#[test]
fn a_namespace_no_longer_extended_is_forgotten_for_that_producer_only() {
    let mut l = Ledger::default();
    let now = Instant::now();
    let a = mk_origin(CONFIGMAPS, "shop", "a");
    let b = mk_origin(CONFIGMAPS, "other", "b");
    let pod = mk_origin(Producer::Pods, "shop", "web");
    record(
        &mut l,
        1,
        a.clone(),
        &mk_upsert("ConfigMap", "shop-o", "a", "{}", "1", "1"),
        now,
    );
    record(
        &mut l,
        1,
        b.clone(),
        &mk_upsert("ConfigMap", "other-o", "b", "{}", "1", "2"),
        now,
    );
    record(
        &mut l,
        1,
        pod.clone(),
        &mk_upsert("ShadowPod", "shop-o", "web", "{}", "1", "3"),
        now,
    );
    l.forget_namespace(CONFIGMAPS, "shop");
    assert!(l.get(&a).is_none());
    assert!(l.get(&b).is_some());
    assert!(l.get(&pod).is_some());
    assert_eq!(l.keys(CONFIGMAPS), vec![mk_key("other", "b")]);
}

#[test]
fn unacked_counts_pending_upserts_and_the_oldest_age() {
    let mut l = Ledger::default();
    let t0 = Instant::now();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let at = t0 + Duration::from_secs(i as u64);
        let up = mk_upsert("ConfigMap", "shop-o", name, "{}", "1", name);
        record(&mut l, 1, mk_origin(CONFIGMAPS, "shop", name), &up, at);
    }
    answer(&mut l, "ConfigMap", "shop-o", "a", "1", Outcome::Applied);
    answer(&mut l, "ConfigMap", "shop-o", "c", "1", Outcome::Conflict);
    let (count, oldest) = l.unacked(t0 + Duration::from_secs(10));
    assert_eq!((count, oldest), (1, Duration::from_secs(9)));
}

#[test]
fn an_answer_carries_when_its_change_was_queued_and_sent() {
    let mut l = Ledger::default();
    let noticed = Instant::now();
    let sent = noticed + Duration::from_secs(3);
    let up = mk_upsert("ConfigMap", "shop-o", "a", "{}", "1", "u");
    let hash = refract_core::hash::bytes_hash(&up.object_json);
    let times = Times { noticed, sent };
    l.upsert(1, mk_origin(CONFIGMAPS, "shop", "a"), &up, hash, times);
    let answer = answer(&mut l, "ConfigMap", "shop-o", "a", "1", Outcome::Applied);
    assert_eq!(answer.and_then(|a| a.times), Some(times));
}
