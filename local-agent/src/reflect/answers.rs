//! What the provider answered about an object: a retry after a transient failure, a resend
//! when asked, an event on the origin object when refused, restored after a provider-side
//! change (when the provider wants it reported) or quarantined.

use kube::runtime::events::EventType;
use refract_wire::proto::Outcome;

use super::{Reflectable, Reflector};
use crate::outbox::{Answer, Recipient, Request};
use crate::recorder::{publish_drift, publish_event, QUOTA_REASON};

impl<K: Reflectable> Recipient for Reflector<K> {
    fn on_answer(&self, answer: Answer) {
        if answer.request != Request::Upsert {
            return;
        }
        let key = answer.origin.key;
        match answer.outcome {
            Outcome::Applied | Outcome::Unchanged | Outcome::Unspecified => {
                self.retries.succeeded(&key)
            }
            Outcome::Resend => {
                // The outbox forgot it: reconciling it now sends it again.
                tracing::info!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, message = %answer.message, "the provider asks for the object again; sending it");
                self.queue.add(key);
            }
            Outcome::Drifted | Outcome::Quarantined => {
                self.report_drift(&key, answer.outcome, answer.restores, &answer.message)
            }
            Outcome::Transient => {
                // The outbox forgot it: the retry sends it again.
                let delay = self.retries.failed(&key);
                tracing::info!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, message = %answer.message, retry_in = ?delay, "transient failure on the provider; retrying");
                self.queue.add_after(key, delay);
            }
            Outcome::QuotaExceeded => {
                // The outbox forgot it: the retry sends it again, once the tenant holds less.
                let delay = self.retries.failed(&key);
                tracing::warn!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, message = %answer.message, retry_in = ?delay, "no room in this cluster's quota on the provider; retrying");
                if let Some(obj) = self.store.get(&self.store_ref(&key.namespace, &key.name)) {
                    let note = format!(
                        "Error reflecting object to cluster {:?}: {}",
                        self.shared.options.current().remote_cluster_id,
                        answer.message
                    );
                    let reference = obj.object_ref(&self.api);
                    let recorder = self.shared.recorder.clone();
                    tokio::spawn(async move {
                        publish_event(&recorder, reference, EventType::Warning, QUOTA_REASON, note)
                            .await
                    });
                }
                self.queue.add_after(key, delay);
            }
            Outcome::Conflict | Outcome::Denied | Outcome::Invalid => {
                let outcome = answer.outcome;
                tracing::warn!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, outcome = outcome.as_str_name(), message = %answer.message, "provider refused object");
                let Some(obj) = self.store.get(&self.store_ref(&key.namespace, &key.name)) else {
                    return;
                };
                let note = match outcome {
                    Outcome::Conflict => format!(
                        "Error reflecting object to cluster {:?}: remote object already exists ({})",
                        self.shared.options.current().remote_cluster_id, answer.message
                    ),
                    _ => format!("Error reflecting object to cluster {:?}: {}", self.shared.options.current().remote_cluster_id, answer.message),
                };
                let reference = obj.object_ref(&self.api);
                let recorder = self.shared.recorder.clone();
                tokio::spawn(async move {
                    publish_event(
                        &recorder,
                        reference,
                        EventType::Warning,
                        "FailedReflection",
                        note,
                    )
                    .await
                });
            }
        }
    }
}

impl<K: Reflectable> Reflector<K> {
    /// Records on the origin object what the provider said of its copy unasked, when it is
    /// something to report (see [`publish_drift`]).
    fn report_drift(&self, key: &crate::key::Key, outcome: Outcome, restores: u32, message: &str) {
        let obj = self.store.get(&self.store_ref(&key.namespace, &key.name));
        let options = self.shared.options.current();
        let remote = options.remote_cluster_id.as_str();
        let reference = obj.map(|obj| obj.object_ref(&self.api));
        let recorder = &self.shared.recorder;
        if let Some(reason) = publish_drift(recorder, remote, reference, outcome, message) {
            tracing::warn!(kind = self.kind.kind(), namespace = %key.namespace, name = %key.name, restores, %reason, %message, "someone on the provider rewrote the object's copy");
        }
    }
}
