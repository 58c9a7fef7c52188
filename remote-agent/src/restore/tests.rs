//! What the restorer does with a change the watch of tenant objects reports, against a mocked
//! provider API and a registry with or without the tenant's stream.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use kube::api::{DynamicObject, ObjectMeta, PartialObjectMeta};
use kube::runtime::watcher;
use refract_core::keys::{DESIRED_HASH_ANNOTATION, ORIGIN_LABEL, TENANT_REMOVAL_ANNOTATION};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, Outcome, RemoteMessage};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::Status;

use super::{check, spawn_restorer};
use crate::apply::desired::Keep;
use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use crate::mock_api::{applier, bodies, provider, writes, Log};
use crate::objects::Meta;
use crate::registry::{Registry, Session};

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

/// A ConfigMap the tenant sent, remembered by its hash as written at resourceVersion 5.
fn remembered_config_map(applier: &Applier) -> ObjectKey {
    let key = mk_key(CONFIG_MAP, "shop-origin", "settings");
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "shop-origin",
                     "annotations": {DESIRED_HASH_ANNOTATION: "h1"}},
        "data": {"a": "b"},
    });
    applier
        .desired
        .remember(key.clone(), &object, Keep::HashAndKeys, Some("5".into()));
    key
}

/// A registry in which the tenant's stream is open, buffering `room` messages.
fn connected(
    room: usize,
) -> (
    Registry,
    mpsc::Receiver<Result<RemoteMessage, Status>>,
    impl Drop,
) {
    let registry = Registry::default();
    let (tx, rx) = mpsc::channel(room);
    let guard = registry.connect(
        &tenant(),
        Session {
            agent_version: "test".into(),
            peer: None,
            session_id: "s1".into(),
            cert_not_after: time::OffsetDateTime::now_utc(),
        },
        tx,
    );
    (registry, rx, guard)
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

    check(
        &applier,
        &Registry::default(),
        NAMESPACE,
        &mk_meta(&key, "7", &[]),
        Some("7"),
    )
    .await;

    assert_eq!(writes(&log), [(Method::PATCH, path.to_string())]);
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
}

#[tokio::test]
async fn the_agents_own_write_seen_by_the_watch_is_left_alone() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_namespace(&applier);
    let (registry, mut rx, _guard) = connected(4);

    check(
        &applier,
        &registry,
        NAMESPACE,
        &mk_meta(&key, "5", &[]),
        Some("5"),
    )
    .await;

    assert!(no_requests(&log));
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn a_config_map_changed_on_the_provider_is_asked_of_the_connected_origin() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_config_map(&applier);
    let (registry, mut rx, _guard) = connected(4);

    let meta = mk_meta(&key, "7", &[(DESIRED_HASH_ANNOTATION, "h1")]);
    check(&applier, &registry, CONFIG_MAP, &meta, Some("7")).await;

    assert!(no_requests(&log), "the provider keeps only its hash");
    assert_eq!(
        ack_of(rx.try_recv().unwrap()),
        ("settings".to_string(), Outcome::Resend)
    );
    // Its next Upsert is written even though the copy still carries that hash, and a
    // reconnect's inventory leaves it out.
    assert!(applier.desired.drifted(&key));
}

#[tokio::test]
async fn a_tenant_not_connected_is_asked_nothing_until_its_next_session() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_config_map(&applier);

    check(
        &applier,
        &Registry::default(),
        CONFIG_MAP,
        &mk_meta(&key, "7", &[]),
        Some("7"),
    )
    .await;

    assert!(no_requests(&log));
    assert!(applier.desired.drifted(&key));
}

#[tokio::test]
async fn a_full_stream_is_asked_again_each_second_until_it_has_room() {
    let (client, _log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_config_map(&applier);
    let (registry, mut rx, _guard) = connected(1);
    assert!(registry.send_to(&tenant(), RemoteMessage { kind: None }));

    check(
        &applier,
        &registry,
        CONFIG_MAP,
        &mk_meta(&key, "7", &[]),
        Some("7"),
    )
    .await;

    assert_eq!(
        rx.recv().await.unwrap().unwrap().kind,
        None,
        "what filled it"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        ack_of(rx.try_recv().unwrap()),
        ("settings".to_string(), Outcome::Resend)
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(rx.try_recv().is_err(), "asked once it had room, not again");
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
    let (registry, mut rx, _guard) = connected(4);
    let (changes, watch) = mpsc::channel(4);
    spawn_restorer(applier.clone(), registry, watch);

    let deleted = |key: &ObjectKey| watcher::Event::Delete(mk_meta(key, "6", &[]));
    changes.send((CLAIM, deleted(&claim))).await.unwrap();
    changes
        .send((CONFIG_MAP, deleted(&config_map)))
        .await
        .unwrap();

    let asked = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(
        ack_of(asked.unwrap().unwrap()),
        ("settings".to_string(), Outcome::Resend)
    );
    assert!(rx.try_recv().is_err(), "nothing asked for the claim");
    assert!(!applier.desired.drifted(&claim));
    assert!(no_requests(&log));
}

#[tokio::test]
async fn a_tenant_being_removed_is_forgotten_and_nothing_of_it_comes_back() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let namespace = remembered_namespace(&applier);
    let config_map = remembered_config_map(&applier);
    let (registry, mut rx, _guard) = connected(4);

    let marked = mk_meta(&namespace, "7", &[(TENANT_REMOVAL_ANNOTATION, "unpeered")]);
    check(&applier, &registry, NAMESPACE, &marked, Some("7")).await;
    check(
        &applier,
        &registry,
        CONFIG_MAP,
        &mk_meta(&config_map, "7", &[]),
        None,
    )
    .await;

    assert!(no_requests(&log));
    assert!(rx.try_recv().is_err());
    assert_eq!(applier.desired.needs_restore(&namespace, None, None), None);
}

#[tokio::test]
async fn an_object_not_labelled_as_a_tenants_is_not_the_restorers() {
    let (client, log) = provider(vec![]);
    let applier = applier(client);
    let key = remembered_namespace(&applier);
    let mut meta = mk_meta(&key, "7", &[]);
    meta.metadata.labels = None;
    let (registry, mut rx, _guard) = connected(4);

    check(&applier, &registry, NAMESPACE, &meta, Some("7")).await;

    assert!(no_requests(&log));
    assert!(rx.try_recv().is_err());
}
