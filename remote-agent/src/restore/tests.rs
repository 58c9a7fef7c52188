//! What the restorer does with a change the watch of tenant objects reports, against a mocked
//! provider API and an outbox with or without the tenant's stream.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use kube::api::{DynamicObject, ObjectMeta, PartialObjectMeta};
use kube::runtime::watcher;
use refract_core::keys::{
    DESIRED_HASH_ANNOTATION, ORIGIN_LABEL, TENANT_NAMESPACE_LABEL, TENANT_REMOVAL_ANNOTATION,
};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, Outcome, RemoteMessage};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::Status;

use super::fights::FightRule;
use super::{check, spawn_restorer, Cleared, Drift};
use crate::apply::desired::Keep;
use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use crate::mock_api::{applier, bodies, provider, writes, Log};
use crate::objects::Meta;
use crate::outbox::Outbox;
use crate::registry::Registry;

const NAMESPACE: Allowed = Allowed::Namespace;
const CONFIG_MAP: Allowed = Allowed::Reflected(Kind::ConfigMap);
const CLAIM: Allowed = Allowed::Reflected(Kind::PersistentVolumeClaim);

fn tenant() -> ClusterId {
    ClusterId::parse("origin").unwrap()
}

fn mk_key(kind: Allowed, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        tenant: tenant(),
        kind,
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// The watch's view of `key`'s object at `resource_version`, labelled as the tenant's.
fn mk_meta(key: &ObjectKey, resource_version: &str, annotations: &[(&str, &str)]) -> Meta {
    let owned = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    PartialObjectMeta {
        types: None,
        metadata: ObjectMeta {
            name: Some(key.name.clone()),
            namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
            resource_version: Some(resource_version.into()),
            labels: Some(owned(&[(ORIGIN_LABEL, key.tenant.as_str())])),
            annotations: Some(owned(annotations)),
            ..ObjectMeta::default()
        },
        _phantom: std::marker::PhantomData::<DynamicObject>,
    }
}

/// The twin namespace `shop-origin` as the tenant last sent it, remembered whole as written
/// at resourceVersion 5.
fn remembered_namespace(applier: &Applier) -> ObjectKey {
    let key = mk_key(NAMESPACE, "", "shop-origin");
    let object = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop-origin", "annotations": {"refract.io/original-name": "shop"}},
    });
    applier
        .desired
        .remember(key.clone(), &object, Keep::Whole, Some("5".into()));
    key
}

/// The ConfigMap `settings` the tenant sent, remembered by its hash as written at
/// resourceVersion 5.
fn remembered_config_map(applier: &Applier) -> ObjectKey {
    remembered_config_map_named(applier, "settings")
}

fn remembered_config_map_named(applier: &Applier, name: &str) -> ObjectKey {
    let key = mk_key(CONFIG_MAP, "shop-origin", name);
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "shop-origin",
                     "annotations": {DESIRED_HASH_ANNOTATION: "h1"}},
        "data": {"a": "b"},
    });
    applier
        .desired
        .remember(key.clone(), &object, Keep::HashAndKeys, Some("5".into()));
    key
}

/// An outbox whose sender serves the tenant's open stream, buffering `room` messages; the
/// guard ends the session.
fn connected(
    room: usize,
) -> (
    Outbox,
    mpsc::Receiver<Result<RemoteMessage, Status>>,
    tokio_util::sync::DropGuard,
) {
    let outbox = Outbox::default();
    let (tx, rx) = mpsc::channel(room);
    let done = tokio_util::sync::CancellationToken::new();
    outbox.spawn_sender(tenant(), "s1".into(), tx, Registry::default(), done.clone());
    (outbox, rx, done.drop_guard())
}

/// The next message on the stream, waiting for it a little.
async fn next(
    rx: &mut mpsc::Receiver<Result<RemoteMessage, Status>>,
) -> Result<RemoteMessage, Status> {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a message within 5 s")
        .expect("the stream is open")
}

/// Whether nothing more comes on the stream for a moment.
async fn quiet(rx: &mut mpsc::Receiver<Result<RemoteMessage, Status>>) -> bool {
    tokio::time::timeout(Duration::from_millis(200), rx.recv())
        .await
        .is_err()
}

/// The object and outcome of an Ack, if `message` is one.
fn ack_of(message: Result<RemoteMessage, Status>) -> (String, Outcome) {
    match message.unwrap().kind {
        Some(remote_message::Kind::Ack(ack)) => (
            ack.object.unwrap().name,
            Outcome::try_from(ack.outcome).unwrap(),
        ),
        other => panic!("not an Ack: {other:?}"),
    }
}

/// A fights ledger with the default rule, telling the tenant through `outbox`.
fn drift(outbox: &Outbox) -> Drift {
    ledger(outbox, FightRule::default()).0
}

fn ledger(outbox: &Outbox, rule: FightRule) -> (Drift, Cleared) {
    Drift::new(
        rule,
        crate::metrics::DriftMetrics::default(),
        outbox.clone(),
    )
}

/// The watch reports `key` at resourceVersion `rv`: changed by someone, unless `rv` is what
/// the agent wrote.
async fn seen_at(applier: &Applier, outbox: &Outbox, key: &ObjectKey, rv: &str) {
    let meta = mk_meta(key, rv, &[]);
    check(applier, &drift(outbox), key.kind, &meta, Some(rv)).await
}

/// The object, outcome and restore count of an Ack.
fn notice_of(message: Result<RemoteMessage, Status>) -> (String, Outcome, u32) {
    match message.unwrap().kind {
        Some(remote_message::Kind::Ack(ack)) => (
            ack.object.unwrap().name,
            Outcome::try_from(ack.outcome).unwrap(),
            ack.restores,
        ),
        other => panic!("not an Ack: {other:?}"),
    }
}

/// The writes of tenant objects, without those of the namespace's quota (written with a
/// namespace restored).
fn object_writes(log: &Log) -> Vec<(Method, String)> {
    let quota = format!("/{}", crate::quota::backstop::NAME);
    writes(log)
        .into_iter()
        .filter(|(_, path)| !path.ends_with(&quota))
        .collect()
}

fn no_requests(log: &Log) -> bool {
    log.lock().unwrap().is_empty()
}

#[tokio::test]
async fn a_namespace_edited_on_the_provider_is_put_back_from_its_whole_desired_state() {
    let path = "/api/v1/namespaces/shop-origin";
    let written = json!({"metadata": {"resourceVersion": "8"}});
    let (client, log) = provider(vec![(Method::PATCH, path, 200, written)]);
    let applier = applier(client);
    let key = remembered_namespace(&applier);
    let (outbox, mut rx, _session) = connected(4);

    seen_at(&applier, &outbox, &key, "7").await;

    assert_eq!(object_writes(&log), [(Method::PATCH, path.to_string())]);
    let body = &bodies(&log, Method::PATCH, path)[0];
    // Only over the copy that was seen: a newer write of the tenant's is never undone.
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    assert_eq!(body["metadata"]["labels"][ORIGIN_LABEL], "origin");
    assert_eq!(
        body["metadata"]["annotations"]["refract.io/original-name"],
        "shop"
    );
    assert!(body["metadata"]["annotations"][DESIRED_HASH_ANNOTATION].is_string());
    // The restore is the agent's own write: its watch event restores nothing again.
    assert_eq!(applier.desired.needs_restore(&key, Some("8"), None), None);
    // The origin is not asked for it, only told, this being the fight's first restore.
    assert_eq!(
        notice_of(next(&mut rx).await),
        ("shop-origin".to_string(), Outcome::Drifted, 1)
    );
    assert!(quiet(&mut rx).await);
}

#[tokio::test]
async fn the_agents_own_write_seen_by_the_watch_is_left_alone() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_namespace(&applier);
    let (outbox, mut rx, _session) = connected(4);

    seen_at(&applier, &outbox, &key, "5").await;

    assert!(no_requests(&log));
    assert!(quiet(&mut rx).await);
}

#[tokio::test]
async fn a_config_map_changed_on_the_provider_is_asked_of_the_origin_once() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_config_map(&applier);
    let (outbox, mut rx, _session) = connected(4);

    let meta = mk_meta(&key, "7", &[(DESIRED_HASH_ANNOTATION, "h1")]);
    check(&applier, &drift(&outbox), CONFIG_MAP, &meta, Some("7")).await;

    assert!(no_requests(&log), "the provider keeps only its hash");
    assert_eq!(
        ack_of(next(&mut rx).await),
        ("settings".to_string(), Outcome::Resend)
    );
    assert!(quiet(&mut rx).await, "asked once");
    // Its next Upsert is written even though the copy still carries that hash, and a
    // reconnect's inventory leaves it out.
    assert!(applier.desired.drifted(&key));
}

#[tokio::test]
async fn a_full_stream_is_asked_when_it_has_room() {
    let (client, _log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_config_map(&applier);
    let (outbox, mut rx, _session) = connected(1);
    // Two requests for a stream with room for one: the second waits for the reader.
    let other = remembered_config_map_named(&applier, "other");

    seen_at(&applier, &outbox, &key, "7").await;
    seen_at(&applier, &outbox, &other, "7").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut asked = vec![ack_of(next(&mut rx).await).0, ack_of(next(&mut rx).await).0];
    asked.sort();
    assert_eq!(asked, ["other", "settings"]);
    assert!(quiet(&mut rx).await);
}

#[tokio::test]
async fn a_tenant_not_connected_gets_the_copy_through_its_next_sessions_inventory() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_config_map(&applier);

    seen_at(&applier, &Outbox::default(), &key, "7").await;

    assert!(no_requests(&log));
    assert!(applier.desired.drifted(&key), "left out of its inventory");
}

#[tokio::test]
async fn a_claim_deleted_on_the_provider_is_not_recreated_but_a_config_map_is_asked_for() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let claim = mk_key(CLAIM, "shop-origin", "data");
    applier.desired.remember(
        claim.clone(),
        &json!({"metadata": {"name": "data"}}),
        Keep::Hash,
        Some("5".into()),
    );
    let config_map = remembered_config_map(&applier);
    let (outbox, mut rx, _session) = connected(4);
    let (changes, watch) = mpsc::channel(4);
    let (drift, cleared) = ledger(&outbox, FightRule::default());
    spawn_restorer(applier.clone(), drift, cleared, watch);

    let deleted = |key: &ObjectKey| watcher::Event::Delete(mk_meta(key, "6", &[]));
    changes.send((CLAIM, deleted(&claim))).await.unwrap();
    changes
        .send((CONFIG_MAP, deleted(&config_map)))
        .await
        .unwrap();

    assert_eq!(
        ack_of(next(&mut rx).await),
        ("settings".to_string(), Outcome::Resend)
    );
    assert!(quiet(&mut rx).await, "nothing asked for the claim");
    assert!(!applier.desired.drifted(&claim));
    assert!(no_requests(&log));
}

#[tokio::test]
async fn a_tenant_being_removed_is_forgotten_and_nothing_of_it_comes_back() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let namespace = remembered_namespace(&applier);
    let config_map = remembered_config_map(&applier);
    let (outbox, mut rx, _session) = connected(4);

    let marked = mk_meta(&namespace, "7", &[(TENANT_REMOVAL_ANNOTATION, "unpeered")]);
    check(&applier, &drift(&outbox), NAMESPACE, &marked, Some("7")).await;
    check(
        &applier,
        &drift(&outbox),
        CONFIG_MAP,
        &mk_meta(&config_map, "7", &[]),
        None,
    )
    .await;

    assert!(no_requests(&log));
    assert!(quiet(&mut rx).await);
    assert_eq!(applier.desired.needs_restore(&namespace, None, None), None);
}

#[tokio::test]
async fn an_object_not_labelled_as_a_tenants_is_not_the_restorers() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_namespace(&applier);
    let mut meta = mk_meta(&key, "7", &[]);
    meta.metadata.labels = None;
    let (outbox, mut rx, _session) = connected(4);

    check(&applier, &drift(&outbox), NAMESPACE, &meta, Some("7")).await;

    assert!(no_requests(&log));
    assert!(quiet(&mut rx).await);
}

#[tokio::test]
async fn a_twin_namespace_deleted_on_the_provider_comes_back_with_what_was_in_it() {
    let namespace_path = "/api/v1/namespaces/shop-origin";
    let shadow_path = "/apis/offloading.refract.io/v1alpha1/namespaces/shop-origin/shadowpods/web";
    let secret_path = "/api/v1/namespaces/shop-origin/secrets/web-token";
    let written = json!({"metadata": {"resourceVersion": "20"}});
    let shadow_now = json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": "web", "namespace": "shop-origin", "uid": "new-uid",
                     "labels": {ORIGIN_LABEL: "origin", "offloading.refract.io/destination": "provider"}},
        "spec": {"pod": {"containers": [{"name": "c", "image": "busybox"}]}}});
    let namespace_now = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop-origin", "labels": {TENANT_NAMESPACE_LABEL: "origin"}}});
    let (client, log) = provider(vec![
        (Method::PATCH, namespace_path, 200, written.clone()),
        (Method::GET, namespace_path, 200, namespace_now),
        (Method::PATCH, shadow_path, 200, written.clone()),
        (Method::GET, shadow_path, 200, shadow_now),
        (Method::PATCH, secret_path, 200, written),
    ]);
    let applier = applier(client);
    let namespace = remembered_namespace(&applier);
    remembered_config_map(&applier);
    let shadow = mk_key(Allowed::ShadowPod, "shop-origin", "web");
    applier.desired.remember(
        shadow,
        &json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
                "metadata": {"name": "web", "namespace": "shop-origin"},
                "spec": {"pod": {"containers": [{"name": "c", "image": "busybox"}]}}}),
        Keep::Whole,
        Some("5".into()),
    );
    let secret = mk_key(Allowed::Reflected(Kind::Secret), "shop-origin", "web-token");
    applier.desired.remember(
        secret,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "web-token", "namespace": "shop-origin",
                             "labels": {"offloading.refract.io/service-account-name": "default"},
                             "annotations": {"offloading.refract.io/service-account-for-pod-name": "web"},
                             "ownerReferences": [{"apiVersion": "offloading.refract.io/v1alpha1",
                                                  "kind": "ShadowPod", "name": "web", "uid": "old-uid"}]},
                "data": {"token": "dG9rZW4="}}),
        Keep::Whole,
        Some("5".into()),
    );
    let (outbox, mut rx, _session) = connected(4);

    let deleted = PartialObjectMeta {
        metadata: ObjectMeta {
            resource_version: None,
            ..mk_meta(&namespace, "9", &[]).metadata
        },
        ..mk_meta(&namespace, "9", &[])
    };
    check(&applier, &drift(&outbox), NAMESPACE, &deleted, None).await;

    let patched: Vec<String> = object_writes(&log)
        .into_iter()
        .map(|(_, path)| path)
        .collect();
    assert_eq!(
        patched,
        [namespace_path, shadow_path, secret_path],
        "the namespace, then its ShadowPod before the Secret it owns"
    );
    let secret_body = &bodies(&log, Method::PATCH, secret_path)[0];
    assert_eq!(
        secret_body["metadata"]["ownerReferences"][0]["uid"], "new-uid",
        "owned by the ShadowPod as it is now, not the one deleted"
    );
    let mut said = vec![
        notice_of(next(&mut rx).await),
        notice_of(next(&mut rx).await),
    ];
    said.sort();
    assert_eq!(
        said,
        [
            ("settings".to_string(), Outcome::Resend, 0),
            ("shop-origin".to_string(), Outcome::Drifted, 1),
        ],
        "the namespace's restore is reported; what was in it is restored without a report"
    );
}

/// A provider that answers every write of the twin namespace `shop-origin` with
/// resourceVersion 8.
fn namespace_provider() -> (Applier, Log) {
    let path = "/api/v1/namespaces/shop-origin";
    let written = json!({"metadata": {"resourceVersion": "8"}});
    let (client, log) = provider(vec![(Method::PATCH, path, 200, written)]);
    (applier(client), log)
}

#[tokio::test]
async fn a_restore_that_changes_nothing_is_not_drift() {
    let path = "/api/v1/namespaces/shop-origin";
    // Server-side apply over a copy whose own fields were not touched writes nothing: the
    // answer is the version seen.
    let (client, log) = provider(vec![(
        Method::PATCH,
        path,
        200,
        json!({"metadata": {"resourceVersion": "7"}}),
    )]);
    let applier = applier(client);
    let key = remembered_namespace(&applier);
    let (outbox, mut rx, _session) = connected(4);
    let drift = drift(&outbox);

    let meta = mk_meta(&key, "7", &[]);
    check(&applier, &drift, NAMESPACE, &meta, Some("7")).await;

    assert_eq!(object_writes(&log).len(), 1, "the restore was tried");
    assert_eq!(drift.view(&key), None, "not counted");
    assert!(quiet(&mut rx).await, "nor told");
}

#[tokio::test]
async fn a_copy_rewritten_again_and_again_is_quarantined_until_cleared() {
    let (applier, log) = namespace_provider();
    let key = remembered_namespace(&applier);
    let (outbox, mut rx, _session) = connected(8);
    let (drift, cleared) = ledger(
        &outbox,
        FightRule {
            restores: 2,
            ..FightRule::default()
        },
    );
    let (changes, watch) = mpsc::channel(4);
    spawn_restorer(applier.clone(), drift.clone(), cleared, watch);
    let rewritten = |rv: &str| (NAMESPACE, watcher::Event::Apply(mk_meta(&key, rv, &[])));

    changes.send(rewritten("7")).await.unwrap();
    assert_eq!(
        notice_of(next(&mut rx).await),
        ("shop-origin".to_string(), Outcome::Drifted, 1),
        "the first restore is told"
    );
    changes.send(rewritten("9")).await.unwrap();
    assert!(
        quiet(&mut rx).await,
        "the second, within the window, is not"
    );
    changes.send(rewritten("10")).await.unwrap();
    let (name, outcome, restores) = notice_of(next(&mut rx).await);
    assert_eq!(
        (name.as_str(), outcome, restores),
        ("shop-origin", Outcome::Quarantined, 3)
    );
    let writes = object_writes(&log).len();
    assert_eq!(writes, 3);
    changes.send(rewritten("11")).await.unwrap();
    assert!(quiet(&mut rx).await, "a quarantined copy is left alone");
    assert_eq!(object_writes(&log).len(), writes, "and not written");
    let fight = drift.view(&key).unwrap();
    assert_eq!(fight.restores, 3);
    assert!(fight.quarantined_since.is_some());

    assert!(drift.clear(&key));
    assert_eq!(
        notice_of(next(&mut rx).await),
        ("shop-origin".to_string(), Outcome::Drifted, 1),
        "restored at once, as a new fight"
    );
    assert_eq!(object_writes(&log).len(), writes + 1);
    assert!(!drift.clear(&key), "nothing left to clear");
}

#[tokio::test]
async fn a_quarantine_ends_after_the_quiet_period() {
    let (applier, _log) = namespace_provider();
    let key = remembered_namespace(&applier);
    let (outbox, mut rx, _session) = connected(8);
    let (drift, cleared) = ledger(
        &outbox,
        FightRule {
            restores: 1,
            quiet: Duration::from_millis(400),
            ..FightRule::default()
        },
    );
    let (changes, watch) = mpsc::channel(4);
    spawn_restorer(applier.clone(), drift.clone(), cleared, watch);
    let rewritten = |rv: &str| (NAMESPACE, watcher::Event::Apply(mk_meta(&key, rv, &[])));

    changes.send(rewritten("7")).await.unwrap();
    assert_eq!(notice_of(next(&mut rx).await).1, Outcome::Drifted);
    changes.send(rewritten("9")).await.unwrap();
    assert_eq!(notice_of(next(&mut rx).await).1, Outcome::Quarantined);
    assert!(quiet(&mut rx).await, "not before the quiet period");
    assert_eq!(
        notice_of(next(&mut rx).await),
        ("shop-origin".to_string(), Outcome::Drifted, 1),
        "released and restored"
    );
    assert_eq!(drift.view(&key).map(|f| f.quarantined_since), Some(None));
}
