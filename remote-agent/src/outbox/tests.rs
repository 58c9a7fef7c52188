//! The provider outbox's decisions, without channels or a cluster.

use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, Capacity, Event, PodStatus, RemoteMessage};

use super::ledger::{Ledger, Put, Subject, Topic, MAX_EVENTS};

fn mk_tenant(id: &str) -> ClusterId {
    ClusterId::parse(id).unwrap()
}

fn mk_status(name: &str, phase: &str) -> RemoteMessage {
    RemoteMessage {
        kind: Some(remote_message::Kind::PodStatus(PodStatus {
            origin_uid: format!("uid-{name}"),
            namespace: "apps".into(),
            name: name.into(),
            status_json: format!(r#"{{"phase":"{phase}"}}"#).into_bytes().into(),
            recreations: 0,
            sent_unix_millis: 0,
        })),
    }
}

fn mk_capacity(cpu: &str) -> RemoteMessage {
    RemoteMessage {
        kind: Some(remote_message::Kind::Capacity(Capacity {
            free: [("cpu".to_string(), cpu.to_string())].into(),
            ..Default::default()
        })),
    }
}

/// Puts `name`'s status in `phase` (its hash is the phase).
/// True when the session lacks it.
fn put_status(ledger: &mut Ledger, tenant: &ClusterId, name: &str, phase: &str) -> bool {
    let put = ledger.put(
        tenant,
        Subject::pod("apps", name),
        phase.into(),
        mk_status(name, phase),
    );
    put == Put::Due
}

fn mk_event(namespace: &str, name: &str, count: i32) -> RemoteMessage {
    RemoteMessage {
        kind: Some(remote_message::Kind::Event(Event {
            involved: None,
            origin_uid: String::new(),
            event_json: format!(
                r#"{{"metadata":{{"namespace":"{namespace}","name":"{name}"}},"count":{count}}}"#
            )
            .into_bytes(),
        })),
    }
}

/// Puts event `namespace/name` at `count` (its hash is the count).
fn put_event(
    ledger: &mut Ledger,
    tenant: &ClusterId,
    namespace: &str,
    name: &str,
    count: i32,
) -> Put {
    ledger.put(
        tenant,
        Subject::event(namespace, name),
        count.to_string(),
        mk_event(namespace, name, count),
    )
}

/// Sends everything `session` lacks; returns the subjects and hashes sent, in order.
fn drain(ledger: &mut Ledger, tenant: &ClusterId, session: &str) -> Vec<(Subject, String)> {
    let mut sent = Vec::new();
    while let Some(due) = ledger.next(tenant, session) {
        sent.push((due.subject.clone(), due.hash.clone()));
        ledger.delivered(tenant, session, due.subject, due.hash);
    }
    sent
}

#[test]
fn a_state_recorded_while_the_tenant_is_away_is_sent_when_it_connects() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    assert!(
        !put_status(&mut ledger, &tenant, "web", "Running"),
        "no session to wake"
    );
    assert!(ledger.open(&tenant, "s1"), "the new session lacks it");
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        vec![(Subject::pod("apps", "web"), "Running".to_string())]
    );
    assert_eq!(ledger.next(&tenant, "s1"), None, "sent once");
}

#[test]
fn only_a_change_is_sent_again_and_a_change_undone_before_sending_is_not() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    ledger.open(&tenant, "s1");
    assert!(put_status(&mut ledger, &tenant, "web", "Pending"));
    drain(&mut ledger, &tenant, "s1");
    assert!(
        !put_status(&mut ledger, &tenant, "web", "Pending"),
        "the same state again is nothing new"
    );
    assert!(put_status(&mut ledger, &tenant, "web", "Running"));
    assert!(
        !put_status(&mut ledger, &tenant, "web", "Pending"),
        "back to what the session has"
    );
    assert_eq!(drain(&mut ledger, &tenant, "s1"), vec![]);
    assert!(put_status(&mut ledger, &tenant, "web", "Succeeded"));
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        vec![(Subject::pod("apps", "web"), "Succeeded".to_string())]
    );
}

#[test]
fn a_reconnect_gets_every_latest_state_again_capacity_first_and_the_old_session_nothing() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    ledger.open(&tenant, "s1");
    put_status(&mut ledger, &tenant, "a", "Running");
    put_status(&mut ledger, &tenant, "b", "Running");
    ledger.put(&tenant, Subject::capacity(), "4".into(), mk_capacity("4"));
    drain(&mut ledger, &tenant, "s1");
    put_status(&mut ledger, &tenant, "b", "Failed");

    assert!(ledger.open(&tenant, "s2"));
    assert_eq!(ledger.next(&tenant, "s1"), None, "replaced");
    let sent = drain(&mut ledger, &tenant, "s2");
    assert_eq!(
        sent,
        vec![
            (Subject::capacity(), "4".to_string()),
            (Subject::pod("apps", "a"), "Running".to_string()),
            (Subject::pod("apps", "b"), "Failed".to_string()),
        ]
    );
    // The old session's late bookkeeping and its end change nothing for the new one.
    ledger.delivered(&tenant, "s1", Subject::pod("apps", "a"), "Gone".into());
    ledger.close(&tenant, "s1");
    assert!(put_status(&mut ledger, &tenant, "a", "Succeeded"));
    assert_eq!(drain(&mut ledger, &tenant, "s2").len(), 1);
}

#[test]
fn a_subject_whose_object_is_gone_is_never_sent_again() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    ledger.open(&tenant, "s1");
    put_status(&mut ledger, &tenant, "web", "Running");
    ledger.remove(&Subject::pod("apps", "web"));
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        vec![],
        "removed before sending"
    );
    ledger.close(&tenant, "s1");
    assert!(
        !ledger.open(&tenant, "s2"),
        "nothing kept for the next session"
    );
    assert_eq!(ledger.count(&tenant, Topic::PodStatus), 0);
}

#[test]
fn tenants_are_told_only_their_own_states() {
    let mut ledger = Ledger::default();
    let (a, b) = (mk_tenant("a"), mk_tenant("b"));
    ledger.open(&a, "sa");
    ledger.open(&b, "sb");
    assert!(put_status(&mut ledger, &a, "web", "Running"));
    assert_eq!(drain(&mut ledger, &b, "sb"), vec![]);
    assert_eq!(drain(&mut ledger, &a, "sa").len(), 1);
    assert_eq!(
        ledger.next(&a, "sb"),
        None,
        "a session id of another tenant"
    );
}

#[test]
fn a_closed_session_is_woken_by_nothing_and_keeps_the_latest_state() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    ledger.open(&tenant, "s1");
    ledger.close(&tenant, "s1");
    assert!(!put_status(&mut ledger, &tenant, "web", "Running"));
    assert_eq!(ledger.next(&tenant, "s1"), None);
    assert_eq!(ledger.count(&tenant, Topic::PodStatus), 1);
}

#[test]
fn capacity_is_not_kept_for_an_absent_tenant_since_it_would_be_stale() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    ledger.open(&tenant, "s1");
    ledger.put(&tenant, Subject::capacity(), "4".into(), mk_capacity("4"));
    put_status(&mut ledger, &tenant, "web", "Running");
    ledger.close(&tenant, "s1");
    assert_eq!(ledger.count(&tenant, Topic::Capacity), 0);
    ledger.open(&tenant, "s2");
    assert_eq!(
        drain(&mut ledger, &tenant, "s2"),
        vec![(Subject::pod("apps", "web"), "Running".to_string())],
        "the pods' statuses are still current: their producer kept them"
    );
}

#[test]
fn an_event_is_sent_once_per_count_and_after_the_objects_it_is_about() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    ledger.open(&tenant, "s1");
    assert_eq!(
        put_event(&mut ledger, &tenant, "apps", "web.1", 1),
        Put::Due
    );
    put_status(&mut ledger, &tenant, "web", "Running");
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        [
            (Subject::pod("apps", "web"), "Running".to_string()),
            (Subject::event("apps", "web.1"), "1".to_string()),
        ]
    );
    assert_eq!(
        put_event(&mut ledger, &tenant, "apps", "web.1", 1),
        Put::Held
    );
    assert_eq!(
        put_event(&mut ledger, &tenant, "apps", "web.1", 2),
        Put::Due
    );
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        [(Subject::event("apps", "web.1"), "2".to_string())]
    );
}

#[test]
fn events_while_the_tenant_is_away_reach_its_next_session_and_expired_ones_do_not() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    assert_eq!(put_event(&mut ledger, &tenant, "apps", "a", 1), Put::Held);
    assert_eq!(put_event(&mut ledger, &tenant, "apps", "b", 1), Put::Held);
    ledger.remove(&Subject::event("apps", "b"));
    ledger.open(&tenant, "s1");
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        [(Subject::event("apps", "a"), "1".to_string())]
    );
}

#[test]
fn a_namespace_no_longer_watched_takes_its_events_and_no_other() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    put_event(&mut ledger, &tenant, "apps", "a", 1);
    put_event(&mut ledger, &tenant, "apps-2", "b", 1);
    put_status(&mut ledger, &tenant, "web", "Running");
    ledger.remove_events_of(&tenant, "apps");
    assert_eq!(ledger.count(&tenant, Topic::Event), 1);
    assert_eq!(ledger.count(&tenant, Topic::PodStatus), 1);
}

#[test]
fn a_tenant_holds_at_most_max_events_and_is_told_once_when_it_reaches_them() {
    let mut ledger = Ledger::default();
    let (tenant, other) = (mk_tenant("origin"), mk_tenant("other"));
    for i in 0..MAX_EVENTS {
        assert_eq!(
            put_event(&mut ledger, &tenant, "apps", &format!("e{i}"), 1),
            Put::Held
        );
    }
    assert_eq!(
        put_event(&mut ledger, &tenant, "apps", "over", 1),
        Put::Refused { first: true }
    );
    assert_eq!(
        put_event(&mut ledger, &tenant, "apps", "over-again", 1),
        Put::Refused { first: false }
    );
    // A newer count of an event it holds is still recorded; so are other tenants' events and
    // the tenant's pod status.
    assert_eq!(put_event(&mut ledger, &tenant, "apps", "e0", 2), Put::Held);
    assert_eq!(put_event(&mut ledger, &other, "apps", "x", 1), Put::Held);
    assert!(!put_status(&mut ledger, &tenant, "web", "Running"));
    assert_eq!(ledger.count(&tenant, Topic::PodStatus), 1);
    // Room again once one expires.
    ledger.remove(&Subject::event("apps", "e1"));
    assert_eq!(
        put_event(&mut ledger, &tenant, "apps", "over", 1),
        Put::Held
    );
    assert_eq!(ledger.count(&tenant, Topic::Event), MAX_EVENTS);
}

#[test]
fn a_request_to_send_an_object_again_is_sent_once_and_not_to_a_later_session() {
    let mut ledger = Ledger::default();
    let tenant = mk_tenant("origin");
    let resend = || RemoteMessage { kind: None };
    let subject = Subject::notice("ConfigMap", "apps", "settings");
    ledger.open(&tenant, "s1");
    assert_eq!(
        ledger.put(&tenant, subject.clone(), String::new(), resend()),
        Put::Due
    );
    assert_eq!(
        ledger.put(&tenant, subject.clone(), String::new(), resend()),
        Put::Held,
        "asked already, not yet sent"
    );
    assert_eq!(
        drain(&mut ledger, &tenant, "s1"),
        [(subject.clone(), String::new())]
    );
    assert_eq!(
        ledger.count(&tenant, Topic::Notice),
        0,
        "forgotten once sent"
    );
    assert_eq!(
        ledger.put(&tenant, subject.clone(), String::new(), resend()),
        Put::Due,
        "changed again: asked again"
    );
    ledger.close(&tenant, "s1");
    ledger.open(&tenant, "s2");
    assert!(
        drain(&mut ledger, &tenant, "s2").is_empty(),
        "the next session's inventory leaves the copy out instead"
    );
}
