//! The status of custom kinds' copies, brought back to the origin objects when the reflection
//! values ask for it (`customKinds[].status`: some fields, or `"*"` for all).
//!
//! What the provider sends is judged like any other provider report: bounded in size, a JSON
//! object, about a copy this agent sent on the current session (the outbox maps the copy back
//! to its origin object), of a kind whose status the values bring back; only the fields asked
//! for are kept. The latest per object waits for one writer task, so a provider that rewrites
//! a status in a loop costs one origin write at a time, never a task per message. A status
//! about a copy the outbox does not map right now is kept a while and placed again: a status
//! change on the provider makes the remote agent ask for the object again (to see whether the
//! copy drifted), and the outbox forgets the object until it is sent again, so the status
//! often arrives in that gap. The write is
//! a server-side apply of the status subresource with the agent's own field manager (fields
//! the provider drops are dropped at the origin too), naming the origin object's UID, so a
//! status meant for an object deleted and created again under the same name is refused by the
//! origin's API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use refract_core::keys::LOCAL_STATUS_FIELD_MANAGER;
use refract_core::lock::Locked;
use refract_core::options::{Kind, ReflectionOptions};
use refract_wire::proto::CustomStatus;
use serde_json::{Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::key::Key;
use crate::outbox::{Outbox, Producer};
use crate::settings::LiveOptions;

/// One status to write at the origin.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// The custom kind.
    pub kind: Kind,
    /// The origin object.
    pub key: Key,
    /// Its UID, as sent.
    pub uid: String,
    /// The status fields to hold.
    pub status: Map<String, Value>,
}

/// Why a status from the provider was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// The message names no object, or a kind that is not a custom kind reflected here.
    #[error("not about a custom kind this agent reflects")]
    UnknownKind,
    /// The values do not bring this kind's status back.
    #[error("this kind's status is not brought back")]
    NotWanted,
    /// Over the size any object may have.
    #[error("{0}")]
    TooLarge(String),
    /// Not a JSON object.
    #[error("the status is not a JSON object")]
    Malformed,
    /// No origin object of this session stands for that copy.
    #[error("no origin object sent on this session stands for that copy")]
    NotSent,
}

/// Judges one status from the provider: what to write, or why nothing. Pure but for the
/// outbox's map from copies to origin objects.
pub fn accept(
    options: &ReflectionOptions,
    origin_of: impl Fn(Kind, &str, &str) -> Option<(Key, String)>,
    message: &CustomStatus,
) -> Result<Accepted, Dropped> {
    let object = message.object.as_ref().ok_or(Dropped::UnknownKind)?;
    let kind = Kind::lookup(&object.api_version, &object.kind)
        .filter(|k| matches!(k, Kind::Custom(_)))
        .ok_or(Dropped::UnknownKind)?;
    let reflection = options
        .custom_kinds
        .iter()
        .find(|c| Kind::Custom(c.kind) == kind)
        .ok_or(Dropped::UnknownKind)?;
    refract_core::limits::check_object_size(message.status_json.len())
        .map_err(|e| Dropped::TooLarge(e.to_string()))?;
    let status: Map<String, Value> =
        serde_json::from_slice(&message.status_json).map_err(|_| Dropped::Malformed)?;
    let status = reflection.status_back(&status).ok_or(Dropped::NotWanted)?;
    let (key, uid) = origin_of(kind, &object.namespace, &object.name).ok_or(Dropped::NotSent)?;
    Ok(Accepted {
        kind,
        key,
        uid,
        status,
    })
}

/// How often statuses not placed yet are tried again, and for how long.
const PLACE_AGAIN_EVERY: Duration = Duration::from_millis(500);
const PLACE_FOR: Duration = Duration::from_secs(30);
/// Statuses kept unplaced at most: a provider naming copies that do not exist fills no more.
const MAX_UNPLACED: usize = 1024;

/// A copy on the provider: kind, namespace, name.
type ProviderCopy = (String, String, String);

/// Takes custom kinds' statuses from the provider and writes them at the origin.
pub struct CustomStatusIntake {
    options: LiveOptions,
    outbox: Outbox,
    /// The latest status per origin object, waiting for the writer.
    pending: Mutex<HashMap<(Kind, Key), Accepted>>,
    /// The latest status per copy the outbox does not map now, and since when it waits.
    unplaced: Mutex<HashMap<ProviderCopy, (CustomStatus, Instant)>>,
    wake: Notify,
}

impl CustomStatusIntake {
    /// Starts the writer, which writes with `origin`.
    pub fn spawn(
        origin: kube::Client,
        options: LiveOptions,
        outbox: Outbox,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let intake = Arc::new(Self {
            options,
            outbox,
            pending: Mutex::default(),
            unplaced: Mutex::default(),
            wake: Notify::new(),
        });
        let writer = intake.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = writer.write_all(origin) => {}
            }
        });
        intake
    }

    /// Judges one status from the provider, keeping it for the writer if it is taken.
    pub fn offer(&self, message: CustomStatus) {
        self.place(message, Instant::now());
    }

    /// Judges `message`, waiting since `since`: for the writer, unplaced for now, or dropped.
    fn place(&self, message: CustomStatus, since: Instant) {
        let options = self.options.current();
        let origin_of = |kind, namespace: &str, name: &str| {
            self.outbox
                .origin_of(Producer::Objects(kind), namespace, name)
        };
        match accept(&options, origin_of, &message) {
            Ok(accepted) => {
                let slot = (accepted.kind, accepted.key.clone());
                self.pending.locked().insert(slot, accepted);
                self.wake.notify_one();
            }
            // A kind whose status nobody asked for is the common case: not worth a line.
            Err(Dropped::NotWanted) => {}
            Err(Dropped::NotSent) if since.elapsed() < PLACE_FOR => {
                let Some(object) = &message.object else {
                    return;
                };
                let copy = (
                    object.kind.clone(),
                    object.namespace.clone(),
                    object.name.clone(),
                );
                let mut unplaced = self.unplaced.locked();
                if unplaced.len() < MAX_UNPLACED || unplaced.contains_key(&copy) {
                    unplaced.insert(copy, (message, since));
                    self.wake.notify_one();
                }
            }
            Err(why) => {
                let object = message
                    .object
                    .as_ref()
                    .map(|o| o.display())
                    .unwrap_or_default();
                tracing::debug!(%object, %why, "custom status from the provider not taken");
            }
        }
    }

    /// Tries every unplaced status again.
    fn place_again(&self) {
        let waiting: Vec<_> = self.unplaced.locked().drain().map(|(_, w)| w).collect();
        for (message, since) in waiting {
            self.place(message, since);
        }
    }

    async fn write_all(&self, origin: kube::Client) {
        loop {
            if self.unplaced.locked().is_empty() {
                self.wake.notified().await;
            } else {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(PLACE_AGAIN_EVERY) => self.place_again(),
                }
            }
            loop {
                let next = {
                    let mut pending = self.pending.locked();
                    let slot = pending.keys().next().cloned();
                    slot.and_then(|slot| pending.remove(&slot))
                };
                let Some(status) = next else { break };
                write(&origin, &status).await;
            }
        }
    }
}

/// Applies `status` to its origin object's status subresource.
async fn write(origin: &kube::Client, status: &Accepted) {
    let Kind::Custom(custom) = status.kind else {
        return;
    };
    let resource = refract_shared::custom_kind::api_resource(custom);
    let api: Api<DynamicObject> =
        Api::namespaced_with(origin.clone(), &status.key.namespace, &resource);
    let body = serde_json::json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": status.key.name, "uid": status.uid},
        "status": status.status,
    });
    let params = PatchParams::apply(LOCAL_STATUS_FIELD_MANAGER).force();
    match api
        .patch_status(&status.key.name, &params, &Patch::Apply(&body))
        .await
    {
        Ok(_) => {
            tracing::debug!(kind = custom.kind(), namespace = %status.key.namespace, name = %status.key.name, "custom status written at the origin")
        }
        Err(error) => {
            tracing::warn!(kind = custom.kind(), namespace = %status.key.namespace, name = %status.key.name, %error, "cannot write the provider's status on the origin object")
        }
    }
}

#[cfg(test)]
mod tests {
    use refract_core::custom_kind::{register, CustomKindName};
    use refract_core::options::{CustomReflection, KindOptions};
    use refract_core::policy::Policy;
    use refract_wire::proto::ObjectRef;

    use super::*;

    fn options(status: &[&str]) -> ReflectionOptions {
        let kind = register(&CustomKindName {
            group: "intake.test.refract.example".into(),
            version: "v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        })
        .unwrap();
        let mut o = ReflectionOptions::new("origin", "provider");
        o.custom_kinds.push(CustomReflection {
            kind,
            options: KindOptions {
                policy: Policy::DenyList,
                workers: 1,
            },
            status: status.iter().map(|s| s.to_string()).collect(),
        });
        o
    }

    fn message(kind: &str, status: &str) -> CustomStatus {
        CustomStatus {
            object: Some(ObjectRef {
                api_version: "intake.test.refract.example/v1".into(),
                kind: kind.into(),
                namespace: "shop-origin".into(),
                name: "w".into(),
            }),
            status_json: status.as_bytes().to_vec(),
        }
    }

    fn sent(_: Kind, namespace: &str, name: &str) -> Option<(Key, String)> {
        (namespace == "shop-origin" && name == "w").then(|| {
            (
                Key {
                    namespace: "shop".into(),
                    name: "w".into(),
                },
                "uid-1".into(),
            )
        })
    }

    #[test]
    fn only_the_fields_asked_for_come_back_onto_the_object_sent() {
        let taken = accept(
            &options(&["ready"]),
            sent,
            &message("Widget", r#"{"ready": true, "secret": "x"}"#),
        )
        .unwrap();
        assert_eq!(taken.key.namespace, "shop");
        assert_eq!(taken.uid, "uid-1");
        assert_eq!(
            Value::Object(taken.status),
            serde_json::json!({"ready": true})
        );
        let all = accept(
            &options(&["*"]),
            sent,
            &message("Widget", r#"{"a": 1, "b": 2}"#),
        )
        .unwrap();
        assert_eq!(all.status.len(), 2);
    }

    #[test]
    fn what_the_origin_did_not_ask_for_or_cannot_place_is_dropped() {
        let none = options(&[]);
        assert_eq!(
            accept(&none, sent, &message("Widget", "{}")),
            Err(Dropped::NotWanted)
        );
        let some = options(&["ready"]);
        assert_eq!(
            accept(&some, sent, &message("Gadget", "{}")),
            Err(Dropped::UnknownKind)
        );
        assert_eq!(
            accept(&some, sent, &message("Widget", "[1]")),
            Err(Dropped::Malformed)
        );
        assert_eq!(
            accept(&some, |_, _, _| None, &message("Widget", "{}")),
            Err(Dropped::NotSent)
        );
        let huge = format!(r#"{{"ready": "{}"}}"#, "x".repeat(2 * 1024 * 1024));
        assert!(matches!(
            accept(&some, sent, &message("Widget", &huge)),
            Err(Dropped::TooLarge(_))
        ));
    }
}
