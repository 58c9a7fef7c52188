//! One session's handling of each message, against a mocked provider API: what it writes, what
//! it answers, and what a replaced or non-resuming stream does not do.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL, TENANT_NAMESPACE_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{
    local_message, remote_message, Delete, InventoryRequest, LocalMessage, ObjectRef, Outcome,
    RemoteMessage, SnapshotComplete, Upsert,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::listing::Listing;
use super::{ReflectionService, TenantSession, MAX_SEEN};
use crate::metrics::{Metrics, TenantCounters};
use crate::mock_api::{applier, provider, writes, Log};
use crate::outbox::Outbox;
use crate::registry::in_flight::InFlight;
use crate::registry::Registry;

const TENANT: &str = "tenant-a";
const SHOP: &str = "/api/v1/namespaces/shop";
const CONFIG_MAPS: &str = "/api/v1/namespaces/shop/configmaps";

fn tenant() -> ClusterId {
    ClusterId::parse(TENANT).unwrap()
}

/// Namespace `shop`, labelled as `owner`'s.
fn mk_namespace(owner: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": "shop", "labels": {TENANT_NAMESPACE_LABEL: owner}}})
}

/// The tenant's copy of ConfigMap `shop/name` on the provider, as a metadata read shows it.
fn mk_copy(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "namespace": "shop", "uid": format!("uid-{name}"), "resourceVersion": "3",
        "labels": {ORIGIN_LABEL: TENANT, DESTINATION_LABEL: "provider"}}})
}

fn mk_ref(name: &str) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: "shop".into(),
        name: name.into(),
    }
}

fn mk_upsert(name: &str) -> LocalMessage {
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "shop"}, "data": {"a": "b"}});
    LocalMessage {
        kind: Some(local_message::Kind::Upsert(Upsert {
            object: Some(mk_ref(name)),
            revision: "r1".into(),
            object_json: serde_json::to_vec(&object).unwrap(),
            origin_uid: String::new(),
            awaited: false,
            trace_parent: String::new(),
        })),
    }
}

/// A session of the tenant over the mocked API `client`, and what it sends the tenant.
fn mk_session(
    client: kube::Client,
) -> (
    Arc<TenantSession>,
    mpsc::Receiver<Result<RemoteMessage, Status>>,
) {
    let metrics = Metrics::default();
    let service = ReflectionService {
        cluster_id: ClusterId::parse("provider").unwrap(),
        registry: Registry::default(),
        outbox: Outbox::default(),
        applier: applier(client.clone()),
        metrics: metrics.clone(),
        shutdown: CancellationToken::new(),
        write_share: super::share::WriteShare::new(4, 4, 0),
        started: std::time::Instant::now(),
        client,
        tenant_expiry: None,
        tenancy: crate::tenancy::Tenancy::alone(),
        ack_linger: Duration::ZERO,
    };
    let (tx, rx) = mpsc::channel(16);
    let session = TenantSession {
        service,
        tenant: tenant(),
        tx,
        listing: Mutex::new(Listing::new(MAX_SEEN)),
        replaced: CancellationToken::new(),
        in_flight: InFlight::default(),
        advertised: None,
        inventories_sent: Mutex::default(),
        counters: TenantCounters::new(&metrics, &tenant()),
    };
    (Arc::new(session), rx)
}

/// The object, revision and outcome of the next message, which must be an Ack.
fn next_ack(rx: &mut mpsc::Receiver<Result<RemoteMessage, Status>>) -> (String, String, Outcome) {
    match rx.try_recv().expect("an answer").unwrap().kind {
        Some(remote_message::Kind::Ack(ack)) => (
            ack.object.unwrap().name,
            ack.revision,
            Outcome::try_from(ack.outcome).unwrap(),
        ),
        other => panic!("not an Ack: {other:?}"),
    }
}

fn deletes(log: &Log) -> Vec<String> {
    writes(log)
        .into_iter()
        .filter(|(m, _)| *m == Method::DELETE)
        .map(|(_, path)| path)
        .collect()
}

#[tokio::test]
async fn an_upsert_is_written_answered_with_its_revision_and_recorded() {
    let created = json!({"metadata": {"resourceVersion": "9"}});
    let (client, log) = provider(vec![
        (Method::GET, SHOP, 200, mk_namespace(TENANT)),
        (Method::POST, CONFIG_MAPS, 201, created),
    ]);
    let (session, mut rx) = mk_session(client);

    session.handle(mk_upsert("settings")).await;

    assert_eq!(writes(&log), [(Method::POST, CONFIG_MAPS.to_string())]);
    assert_eq!(
        next_ack(&mut rx),
        ("settings".into(), "r1".into(), Outcome::Applied)
    );
    let recorded = session
        .service
        .registry
        .objects(&tenant(), "ConfigMap", "shop");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].outcome, Outcome::Applied as i32);
}

#[tokio::test]
async fn an_upsert_into_another_tenants_namespace_is_denied_and_writes_nothing() {
    let (client, log) = provider(vec![(Method::GET, SHOP, 200, mk_namespace("tenant-b"))]);
    let (session, mut rx) = mk_session(client);

    session.handle(mk_upsert("settings")).await;

    assert!(writes(&log).is_empty(), "{:?}", writes(&log));
    let (name, _, outcome) = next_ack(&mut rx);
    assert_eq!((name.as_str(), outcome), ("settings", Outcome::Denied));
}

#[tokio::test]
async fn a_replaced_stream_starts_nothing_more_and_answers_nothing() {
    let (client, log) = provider(vec![(Method::GET, SHOP, 200, mk_namespace(TENANT))]);
    let (session, mut rx) = mk_session(client);
    session.replaced.cancel();

    session.handle(mk_upsert("settings")).await;
    let delete = LocalMessage {
        kind: Some(local_message::Kind::Delete(Delete {
            object: Some(mk_ref("old")),
            ..Delete::default()
        })),
    };
    session.handle(delete).await;

    assert!(log.lock().unwrap().is_empty(), "not even a read");
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn a_snapshot_removes_the_tenants_objects_this_stream_did_not_list() {
    let listed = json!({"apiVersion": "v1", "kind": "List", "metadata": {},
                        "items": [mk_copy("kept"), mk_copy("orphan")]});
    let (client, log) = provider(vec![
        (Method::GET, SHOP, 200, mk_namespace(TENANT)),
        (Method::POST, CONFIG_MAPS, 201, json!({"metadata": {}})),
        (Method::GET, CONFIG_MAPS, 200, listed),
        (
            Method::GET,
            "/api/v1/namespaces/shop/configmaps/orphan",
            200,
            mk_copy("orphan"),
        ),
        // Read if it were taken for an orphan, so that its delete would show in the log.
        (
            Method::GET,
            "/api/v1/namespaces/shop/configmaps/kept",
            200,
            mk_copy("kept"),
        ),
        (
            Method::DELETE,
            "/api/v1/namespaces/shop/configmaps/orphan",
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        ),
    ]);
    let (session, _rx) = mk_session(client);
    // What the stream listed counts whether or not it was applied yet.
    session.see(Some(&mk_ref("kept")), true);

    let done = SnapshotComplete {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: "shop".into(),
        resumed: false,
    };
    session
        .handle(LocalMessage {
            kind: Some(local_message::Kind::SnapshotComplete(done.clone())),
        })
        .await;
    assert_eq!(deletes(&log), ["/api/v1/namespaces/shop/configmaps/orphan"]);

    // A replaced stream's view is no longer the tenant's: its snapshot removes nothing.
    log.lock().unwrap().clear();
    session.replaced.cancel();
    session
        .handle(LocalMessage {
            kind: Some(local_message::Kind::SnapshotComplete(done)),
        })
        .await;
    assert!(deletes(&log).is_empty());
}

#[tokio::test]
async fn an_inventory_request_on_a_stream_that_did_not_resume_gets_nothing() {
    let (client, log) = provider(vec![]);
    let (session, mut rx) = mk_session(client);

    let request = InventoryRequest {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: "shop".into(),
    };
    session
        .handle(LocalMessage {
            kind: Some(local_message::Kind::InventoryRequest(request)),
        })
        .await;

    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(rx.try_recv().is_err());
    assert!(log.lock().unwrap().is_empty());
}
