//! The status of tenants' copies of custom kinds, streamed back to their origins.
//!
//! The provider's controllers write the status of a custom resource; the origin's operator may
//! want some of it at the origin (the local agent's values say which fields, per kind). One
//! watch per custom kind over the copies Refract wrote (its destination label) hands each
//! copy's status to the tenant's outbox as its latest state: unchanged statuses are not sent
//! again, a reconnecting origin gets every copy's latest, and a deleted copy's is forgotten.
//! The whole status goes: the origin takes what it asked for and drops the rest. The watch
//! keeps no store; the outbox keeps one message per copy.

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::custom_kind::CustomKind;
use refract_core::hash::bytes_hash;
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, CustomStatus, ObjectRef, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::outbox::{Outbox, Subject};

/// Starts one status watch per registered custom kind.
pub fn spawn(
    client: kube::Client,
    provider: &ClusterId,
    outbox: Outbox,
    shutdown: CancellationToken,
) {
    for kind in refract_core::custom_kind::registered() {
        watch(
            client.clone(),
            provider,
            outbox.clone(),
            kind,
            shutdown.clone(),
        );
    }
}

/// Starts the status watch of the copies of `kind`.
pub fn watch(
    client: kube::Client,
    provider: &ClusterId,
    outbox: Outbox,
    kind: CustomKind,
    shutdown: CancellationToken,
) {
    let api: Api<DynamicObject> =
        Api::all_with(client, &refract_shared::custom_kind::api_resource(kind));
    let config = watcher::Config::default().labels(&format!("{DESTINATION_LABEL}={provider}"));
    tokio::spawn(async move {
        let events = watcher(api, config).default_backoff().boxed();
        let what = format!("the status of the copies of {}", kind.name());
        let mut watch = crate::watching::Following::new(events, what);
        while let Some(event) = watch.next(&shutdown).await {
            match event {
                watcher::Event::Apply(copy) | watcher::Event::InitApply(copy) => {
                    offer(&outbox, kind, &copy)
                }
                watcher::Event::Delete(copy) => outbox.remove(&subject(kind, &copy)),
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
        }
    });
}

fn subject(kind: CustomKind, copy: &DynamicObject) -> Subject {
    Subject::custom_status(
        kind.resource_name(),
        &copy.namespace().unwrap_or_default(),
        &copy.name_any(),
    )
}

/// Records `copy`'s status as its tenant's latest.
fn offer(outbox: &Outbox, kind: CustomKind, copy: &DynamicObject) {
    let Some(tenant) = copy
        .labels()
        .get(ORIGIN_LABEL)
        .and_then(|t| ClusterId::parse(t).ok())
    else {
        return;
    };
    let (message, hash) = status_message(kind, copy);
    outbox.put(&tenant, subject(kind, copy), hash, message);
}

/// The message telling `copy`'s status, and the hash of that status.
fn status_message(kind: CustomKind, copy: &DynamicObject) -> (RemoteMessage, String) {
    let status = copy
        .data
        .get("status")
        .filter(|s| s.is_object())
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    let status_json = refract_core::json::to_vec(&status);
    let hash = bytes_hash(&status_json);
    let message = RemoteMessage {
        kind: Some(remote_message::Kind::CustomStatus(CustomStatus {
            object: Some(ObjectRef {
                api_version: kind.api_version().into(),
                kind: kind.kind().into(),
                namespace: copy.namespace().unwrap_or_default(),
                name: copy.name_any(),
            }),
            status_json,
        })),
    };
    (message, hash)
}

#[cfg(test)]
mod tests {
    use refract_core::custom_kind::{register, CustomKindName};
    use serde_json::json;

    use super::*;

    #[test]
    fn a_copy_tells_its_whole_status_and_none_reads_as_empty() {
        let kind = register(&CustomKindName {
            group: "status.test.refract.example".into(),
            version: "v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        })
        .unwrap();
        let copy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "status.test.refract.example/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "shop-origin"},
            "spec": {"size": 1}, "status": {"ready": true, "replicas": 2}
        }))
        .unwrap();
        let (message, hash) = status_message(kind, &copy);
        let Some(remote_message::Kind::CustomStatus(status)) = message.kind else {
            panic!("not a status");
        };
        let object = status.object.unwrap();
        assert_eq!(
            (
                object.kind.as_str(),
                object.namespace.as_str(),
                object.name.as_str()
            ),
            ("Widget", "shop-origin", "w")
        );
        let sent: serde_json::Value = serde_json::from_slice(&status.status_json).unwrap();
        assert_eq!(sent, json!({"ready": true, "replicas": 2}));
        let mut bare = copy.clone();
        bare.data.as_object_mut().unwrap().remove("status");
        let (message, other) = status_message(kind, &bare);
        assert_ne!(hash, other);
        let Some(remote_message::Kind::CustomStatus(status)) = message.kind else {
            panic!("not a status");
        };
        assert_eq!(status.status_json, b"{}");
    }
}
