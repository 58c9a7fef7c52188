//! The controller's decisions against a mocked provider API: a pod created for a new
//! ShadowPod, re-created (and counted) when it is gone, never for a finished one, a refused
//! create reported on the ShadowPod, and the retry backoff.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use refract_core::keys::{MANAGED_BY_LABEL, ORIGIN_FINISHED_ANNOTATION, ORIGIN_LABEL};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::{
    reconcile, ChangedKeys, KeptShadowPod, OwnWrites, ProviderPod, Retries, Stores,
    MANAGED_BY_SHADOWPOD, RETRY_MAX, RETRY_MIN,
};
use crate::apply::desired::DesiredStore;
use crate::kinds::Allowed;
use crate::mock_api::{bodies, conflict, forbidden, provider, writes, Log};
use crate::objects::Feed;
use crate::shadowpod::{ShadowPod, ShadowPodSpec, ShadowPodStatus, FAILED_CREATE};

const NS: &str = "apps-origin";
const PODS: &str = "/api/v1/namespaces/apps-origin/pods";
const POD: &str = "/api/v1/namespaces/apps-origin/pods/web";
const STATUS: &str =
    "/apis/offloading.refract.io/v1alpha1/namespaces/apps-origin/shadowpods/web/status";

fn mk_shadow(status: Option<ShadowPodStatus>, annotations: &[(&str, &str)]) -> ShadowPod {
    let mut shadow = ShadowPod::new(
        "web",
        ShadowPodSpec {
            pod: PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
        },
    );
    shadow.metadata.namespace = Some(NS.into());
    shadow.metadata.uid = Some("shadow-uid".into());
    shadow.metadata.labels = Some([(ORIGIN_LABEL.to_string(), "origin".to_string())].into());
    shadow.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    shadow.status = status;
    shadow
}

fn mk_pod_json(uid: &str, phase: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": NS, "uid": uid,
                     "labels": {MANAGED_BY_LABEL: MANAGED_BY_SHADOWPOD, ORIGIN_LABEL: "origin"}},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        "status": {"phase": phase},
    })
}

/// Stores holding `shadow` and `pod`, as the controller's watches would have them.
fn mk_stores(shadow: ShadowPod, pod: Option<Value>) -> Stores {
    let (shadows, mut writer): (_, Writer<KeptShadowPod>) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Apply(KeptShadowPod::new(shadow)));
    let (pods, mut pods_writer): (_, Writer<ProviderPod>) = reflector::store();
    if let Some(pod) = pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        pods_writer.apply_watcher_event(&watcher::Event::Apply(ProviderPod::new(pod)));
    }
    Stores {
        shadows,
        pods,
        changed: ChangedKeys::default(),
        pods_changed: Arc::new(Notify::new()),
        ready: tokio::sync::watch::channel(true).1,
        pods_ready: tokio::sync::watch::channel(true).1,
    }
}

async fn run(
    routes: Vec<(Method, &'static str, u16, Value)>,
    shadow: ShadowPod,
) -> (Result<(), kube::Error>, Log) {
    run_with_pod(routes, shadow, None).await
}

/// Reconciles `shadow` with `pod` in the pod store, against an API answering `routes`.
async fn run_with_pod(
    routes: Vec<(Method, &'static str, u16, Value)>,
    shadow: ShadowPod,
    pod: Option<Value>,
) -> (Result<(), kube::Error>, Log) {
    let (client, log) = provider(routes);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test".into(),
            instance: None,
        },
    );
    let stores = mk_stores(shadow, pod);
    let identities = crate::identity::Identities::shared(client);
    let own_writes = OwnWrites {
        desired: DesiredStore::default(),
        restorer: Feed::detached(Allowed::ShadowPod),
    };
    let result = reconcile(&identities, &recorder, &stores, &own_writes, NS, "web").await;
    (result, log)
}

/// The ShadowPod status subresource, answering every write.
fn status_route() -> (Method, &'static str, u16, Value) {
    (
        Method::PATCH,
        STATUS,
        200,
        status_json(ShadowPodStatus::default()),
    )
}

fn status_json(status: ShadowPodStatus) -> Value {
    json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
           "metadata": {"name": "web", "namespace": NS}, "spec": {"pod": {"containers": []}},
           "status": status})
}

/// The status of a ShadowPod whose pod `pod-1` runs, re-created once before.
fn running_pod_1_recreated_once() -> ShadowPodStatus {
    ShadowPodStatus {
        phase: Some("Running".into()),
        recreations: 1,
        pod_uid: Some("pod-1".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_new_shadowpod_gets_its_pod_owned_by_it_and_its_uid_in_the_status() {
    let created = mk_pod_json("pod-1", "Pending");
    let (result, log) = run(
        vec![(Method::POST, PODS, 201, created), status_route()],
        mk_shadow(None, &[]),
    )
    .await;
    result.unwrap();
    let posted = bodies(&log, Method::POST, PODS);
    assert_eq!(posted.len(), 1, "{:?}", writes(&log));
    let pod = &posted[0];
    assert_eq!(
        pod["metadata"]["labels"][MANAGED_BY_LABEL],
        MANAGED_BY_SHADOWPOD
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "shadow-uid");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
    let statuses = bodies(&log, Method::PATCH, STATUS);
    assert_eq!(statuses.len(), 1, "one status write, after the create");
    assert_eq!(
        statuses[0]["status"],
        json!({"phase": "Pending", "recreations": 0, "podUid": "pod-1"})
    );
    let order: Vec<Method> = writes(&log).into_iter().map(|(method, _)| method).collect();
    assert_eq!(
        order,
        [Method::POST, Method::PATCH],
        "no write before the create"
    );
}

#[tokio::test]
async fn a_pod_gone_is_re_created_and_counted() {
    let before = running_pod_1_recreated_once();
    let (result, log) = run(
        vec![
            (Method::POST, PODS, 201, mk_pod_json("pod-2", "Pending")),
            status_route(),
        ],
        mk_shadow(Some(before), &[]),
    )
    .await;
    result.unwrap();
    assert_eq!(bodies(&log, Method::POST, PODS).len(), 1);
    let statuses = bodies(&log, Method::PATCH, STATUS);
    assert_eq!(statuses.len(), 1, "counted with the create's outcome");
    assert_eq!(statuses[0]["status"]["recreations"], 2);
    assert_eq!(statuses[0]["status"]["podUid"], "pod-2");
}

#[tokio::test]
async fn a_re_create_refused_as_existing_still_counts_the_recreation() {
    let before = running_pod_1_recreated_once();
    let (result, log) = run(
        vec![(Method::POST, PODS, 409, conflict()), status_route()],
        mk_shadow(Some(before), &[]),
    )
    .await;
    result.unwrap();
    let statuses = bodies(&log, Method::PATCH, STATUS);
    assert_eq!(statuses.len(), 1, "{:?}", writes(&log));
    assert_eq!(
        statuses[0]["status"],
        json!({"phase": "Pending", "recreations": 2})
    );
}

#[tokio::test]
async fn a_finished_pod_is_never_re_created() {
    for status in ["Succeeded", "Failed"] {
        let finished = ShadowPodStatus {
            phase: Some(status.into()),
            pod_uid: Some("pod-1".into()),
            ..Default::default()
        };
        let (result, log) = run(vec![], mk_shadow(Some(finished), &[])).await;
        result.unwrap();
        assert!(
            log.lock().unwrap().is_empty(),
            "{status}: no request at all"
        );
    }
    // Finished at the origin: whatever became of the provider's pod, none is started.
    let (result, log) = run(
        vec![],
        mk_shadow(None, &[(ORIGIN_FINISHED_ANNOTATION, "true")]),
    )
    .await;
    result.unwrap();
    assert!(writes(&log).is_empty(), "{:?}", writes(&log));
}

#[tokio::test]
async fn a_running_pod_has_its_phase_mirrored_and_is_left_alone() {
    let created = ShadowPodStatus {
        phase: Some("Pending".into()),
        pod_uid: Some("pod-1".into()),
        ..Default::default()
    };
    let (result, log) = run_with_pod(
        vec![status_route()],
        mk_shadow(Some(created), &[]),
        Some(mk_pod_json("pod-1", "Running")),
    )
    .await;
    result.unwrap();
    assert!(bodies(&log, Method::POST, PODS).is_empty());
    assert!(
        !log.lock().unwrap().iter().any(|s| s.method == Method::GET),
        "the pod is read from the watch's store, not the API"
    );
    assert_eq!(
        bodies(&log, Method::PATCH, STATUS)[0]["status"],
        json!({"phase": "Running", "recreations": 0, "podUid": "pod-1"})
    );
}

#[tokio::test]
async fn a_status_the_store_has_not_caught_up_with_keeps_the_recreation_counted() {
    // The store still has the status from before the pod was re-created, not the one written
    // with the create, which counted the recreation.
    let stale = running_pod_1_recreated_once();
    let (result, log) = run_with_pod(
        vec![status_route()],
        mk_shadow(Some(stale), &[]),
        Some(mk_pod_json("pod-2", "Running")),
    )
    .await;
    result.unwrap();
    assert_eq!(
        bodies(&log, Method::PATCH, STATUS)[0]["status"],
        json!({"phase": "Running", "recreations": 2, "podUid": "pod-2"})
    );
    // A first pod, before its status names it: nothing to count.
    let (result, log) = run_with_pod(
        vec![status_route()],
        mk_shadow(None, &[]),
        Some(mk_pod_json("pod-1", "Running")),
    )
    .await;
    result.unwrap();
    assert_eq!(
        bodies(&log, Method::PATCH, STATUS)[0]["status"],
        json!({"phase": "Running", "recreations": 0, "podUid": "pod-1"})
    );
}

#[tokio::test]
async fn a_pod_just_created_that_the_watch_has_not_seen_is_read_not_re_created() {
    let created = ShadowPodStatus {
        phase: Some("Pending".into()),
        pod_uid: Some("pod-1".into()),
        ..Default::default()
    };
    let (result, log) = run(
        vec![
            (Method::GET, POD, 200, mk_pod_json("pod-1", "Pending")),
            status_route(),
        ],
        mk_shadow(Some(created), &[]),
    )
    .await;
    result.unwrap();
    assert!(
        bodies(&log, Method::POST, PODS).is_empty(),
        "{:?}",
        writes(&log)
    );
    assert!(
        bodies(&log, Method::PATCH, STATUS).is_empty(),
        "no recreation counted"
    );
}

#[tokio::test]
async fn a_refused_create_is_reported_on_the_shadowpod_and_retried() {
    let (result, log) = run(
        vec![
            (Method::POST, PODS, 403, forbidden("exceeded quota: pods")),
            status_route(),
        ],
        mk_shadow(None, &[]),
    )
    .await;
    assert!(result.is_err(), "the caller schedules a retry");
    let statuses = bodies(&log, Method::PATCH, STATUS);
    let reported = &statuses.last().unwrap()["status"];
    assert_eq!(reported["reason"], FAILED_CREATE);
    assert!(
        reported["message"]
            .as_str()
            .unwrap()
            .contains("exceeded quota: pods"),
        "{reported}"
    );
}

#[test]
fn retries_back_off_one_chain_at_a_time_and_reset_on_success() {
    let key = (NS.to_string(), "web".to_string());
    let mut retries = Retries::default();
    let first = retries
        .failed(&key)
        .expect("the first failure schedules a retry");
    assert!(first >= RETRY_MIN / 2 && first <= RETRY_MIN, "{first:?}");
    assert_eq!(retries.failed(&key), None, "one retry on its way at a time");
    retries.scheduled.remove(&key);
    let mut last = Duration::ZERO;
    for _ in 0..10 {
        last = retries.failed(&key).unwrap();
        retries.scheduled.remove(&key);
    }
    assert!(
        last <= RETRY_MAX && last >= RETRY_MAX / 2,
        "capped: {last:?}"
    );
    retries.succeeded(&key);
    let again = retries.failed(&key).unwrap();
    assert!(again <= RETRY_MIN, "a success starts over: {again:?}");
}
