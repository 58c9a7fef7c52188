//! The provider's pod statuses, written back to the origin pods: taken only for a pod this
//! agent offloaded on the current session (held a while when the pod is not sent yet,
//! [`early`]), checked and remapped ([`origin_status`]), the latest per pod written by a few
//! writers; and every offloaded pod marked as the virtual node's readiness says.

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef as StoreRef;
use kube::ResourceExt;
use refract_core::json;
use refract_core::lock::Locked;
use refract_core::pod_status::{origin_status, StatusContext, MAX_STATUS_BYTES};
use refract_wire::proto::PodStatus;
use tokio::sync::watch;

use super::{origin, readiness, PodOffloader};
use crate::early::{self, Early};
use crate::key::Key;
use crate::outbox::{AckState, Producer};

/// The most pod statuses, and status bytes, held for pods not sent yet ([`early`]).
pub(super) const EARLY_STATUSES: usize = 4096;
pub(super) const EARLY_STATUS_BYTES: usize = 8 * 1024 * 1024;

/// Why a provider pod status is not written.
enum Refusal {
    /// The session has not sent the pod (yet): it may be a pod the producers are still
    /// sending after a reconnect.
    NotSentYet,
    /// The status is not acceptable.
    Invalid(String),
    /// The provider refused the pod (after a policy change, for one already running): its pod
    /// is gone or going, and the origin pod keeps the reason it was given.
    Withdrawn,
}

impl PodOffloader {
    /// The provider pod (namespace, name) that origin pod `key` was offloaded as on the
    /// current session, with the origin pod's UID; `None` when this agent did not offload it.
    pub fn offloaded(&self, key: &Key) -> Option<(String, String, String)> {
        let sent = self.outbox.sent(&origin(key))?;
        Some((sent.remote.namespace, sent.remote.name, sent.origin_uid))
    }

    /// The origin pod (and its UID) a provider pod stands for, when this agent offloaded it.
    pub fn origin_of(&self, remote_namespace: &str, remote_name: &str) -> Option<(Key, String)> {
        self.outbox
            .origin_of(Producer::Pods, remote_namespace, remote_name)
    }

    /// Takes a provider pod status; never waits. Only a status for a pod this agent offloaded
    /// on the current session (matched by origin UID, and by the provider namespace and name it
    /// was sent as) is kept, the latest per pod, for the status writers. A status for a pod the
    /// session has not sent yet waits for it ([`early`]).
    pub fn offer_status(&self, mut message: PodStatus) {
        // Decoded as a slice of the stream's receive buffer: a status kept (the last one
        // written, one held early) must not keep that whole buffer alive.
        message.status_json = bytes::Bytes::copy_from_slice(&message.status_json);
        if let Some(message) = self.settle_status(message) {
            tracing::debug!(origin_uid = %refract_core::inbound::excerpt(&message.origin_uid), "a pod status before its pod was sent on this session; held");
            let dropped =
                self.early_statuses()
                    .hold(message.origin_uid.clone(), message, Instant::now());
            self.refuse_early(dropped);
        }
    }

    /// Queues `message` for the status writers or refuses it; gives it back when its pod was
    /// not sent on this session (yet).
    fn settle_status(&self, message: PodStatus) -> Option<PodStatus> {
        match self.admit_status(&message) {
            Ok(()) => self.statuses.put(message.origin_uid.clone(), message),
            Err(Refusal::NotSentYet) => return Some(message),
            Err(Refusal::Invalid(reason)) => self.refuse(&message, &reason),
            Err(Refusal::Withdrawn) => {
                tracing::debug!(origin_uid = %refract_core::inbound::excerpt(&message.origin_uid), "a pod status for a pod the provider refused; not written");
            }
        }
        None
    }

    fn refuse(&self, message: &PodStatus, reason: &str) {
        self.config.refused.inc();
        if let Some(suppressed) = self.log.allow("pod status") {
            tracing::warn!(origin_uid = %refract_core::inbound::excerpt(&message.origin_uid), %reason, suppressed, "ignoring a pod status from the provider");
        }
    }

    fn early_statuses(&self) -> std::sync::MutexGuard<'_, Early<String, PodStatus>> {
        self.early.locked()
    }

    /// Counts held statuses dropped without their pod ever being sent.
    fn refuse_early(&self, dropped: Vec<PodStatus>) {
        if dropped.is_empty() {
            return;
        }
        self.config.refused.inc_by(dropped.len() as u64);
        if let Some(suppressed) = self.log.allow("early pod status") {
            tracing::warn!(dropped = dropped.len(), pods = ?early::some_subjects(&dropped), suppressed, held_at_most_seconds = early::MAX_WAIT.as_secs(), "ignoring pod statuses from the provider: not pods this agent offloaded to this provider");
        }
    }

    /// Offers the held statuses again each second.
    pub(super) async fn retry_early(&self) {
        early::retry_each_second(
            &self.early,
            |status| self.settle_status(status),
            |dropped| self.refuse_early(dropped),
        )
        .await;
    }

    fn admit_status(&self, message: &PodStatus) -> Result<(), Refusal> {
        if message.status_json.len() > MAX_STATUS_BYTES {
            return Err(Refusal::Invalid(format!(
                "the status is {} bytes, over the limit of {MAX_STATUS_BYTES}",
                message.status_json.len()
            )));
        }
        let (_, sent) = self
            .outbox
            .by_uid(Producer::Pods, &message.origin_uid)
            .ok_or(Refusal::NotSentYet)?;
        if sent.remote.namespace != message.namespace || sent.remote.name != message.name {
            return Err(Refusal::Invalid(format!(
                "the pod was offloaded as {}/{}, the status names {}/{}",
                sent.remote.namespace,
                sent.remote.name,
                refract_core::inbound::excerpt(&message.namespace),
                refract_core::inbound::excerpt(&message.name)
            )));
        }
        if sent.state == AckState::Refused {
            return Err(Refusal::Withdrawn);
        }
        Ok(())
    }

    /// Writes the latest status of each pod, one pod at a time per writer.
    pub(super) async fn write_statuses(&self) {
        loop {
            let (uid, message) = self.statuses.next().await;
            if let Some(message) = message {
                self.write_remote_status(message).await;
            }
            drop(uid);
        }
    }

    /// Follows the virtual node's readiness: while it is NotReady the offloaded pods are not
    /// ready either; when it is Ready again their provider statuses are written once more.
    pub async fn follow_node_readiness(&self, mut ready: watch::Receiver<Option<bool>>) {
        let mut last = None;
        loop {
            let now = *ready.borrow_and_update();
            match (last, now) {
                (_, Some(false)) if last != now => self.mark_unreachable().await,
                (Some(false), Some(true)) => self.rewrite_statuses(),
                _ => {}
            }
            last = now;
            if ready.changed().await.is_err() {
                return;
            }
        }
    }

    async fn mark_unreachable(&self) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut marked = 0;
        for pod in self.store.state() {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let status = pod.status();
            let conditions = status.as_ref().and_then(|s| s.conditions.as_deref());
            let Some(conditions) = readiness::unreachable_conditions(
                conditions.unwrap_or_default(),
                &self.config.node_name,
                now.clone(),
            ) else {
                continue;
            };
            self.write_status(&pod, serde_json::json!({ "conditions": conditions }))
                .await;
            marked += 1;
        }
        tracing::info!(pods = marked, node = %self.config.node_name, "the virtual node is NotReady: its pods marked not ready");
    }

    /// Offers each origin pod still there its last provider status again. The node turns
    /// Ready as a session starts, before that session has sent the pods again: a pod not sent
    /// yet has its status held until it is, unless the provider sent a newer one meanwhile.
    fn rewrite_statuses(&self) {
        let present: std::collections::HashSet<String> = self
            .store
            .state()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.uid())
            .collect();
        let last: Vec<PodStatus> = {
            let mut written = self.written.locked();
            written.retain(|uid, _| present.contains(uid));
            written.values().cloned().collect()
        };
        tracing::info!(
            pods = last.len(),
            "the virtual node is Ready again: writing its pods' provider statuses again"
        );
        let now = Instant::now();
        for message in last {
            match self.admit_status(&message) {
                Ok(()) => self
                    .statuses
                    .put_unless_waiting(message.origin_uid.clone(), message),
                Err(Refusal::NotSentYet) => self.hold_unless_newer(message, now),
                Err(Refusal::Invalid(_) | Refusal::Withdrawn) => {}
            }
        }
    }

    /// Holds an older status of a pod not sent on this session yet, unless the provider's
    /// newer one waits already.
    fn hold_unless_newer(&self, message: PodStatus, now: Instant) {
        let dropped =
            self.early_statuses()
                .hold_unless_held(message.origin_uid.clone(), message, now);
        self.refuse_early(dropped);
    }

    /// Writes a provider pod status to the origin pod it belongs to.
    async fn write_remote_status(&self, message: PodStatus) {
        let Some((key, sent)) = self.outbox.by_uid(Producer::Pods, &message.origin_uid) else {
            // Admitted on the session before, which the outbox has since left: held until this
            // session sends the pod (or dropped, counted, when it never does).
            self.hold_unless_newer(message, Instant::now());
            return;
        };
        if sent.state == AckState::Refused {
            return; // refused since it was queued: the origin pod keeps the reason
        }
        self.written
            .locked()
            .insert(message.origin_uid.clone(), message.clone());
        let Some(kept) = self
            .store
            .get(&StoreRef::new(&key.name).within(&key.namespace))
        else {
            return;
        };
        if kept.uid().as_deref() != Some(message.origin_uid.as_str())
            || kept.metadata.deletion_timestamp.is_some()
        {
            return;
        }
        let pod = match kept.pod() {
            Ok(pod) => pod,
            Err(error) => {
                tracing::warn!(namespace = %key.namespace, pod = %key.name, %error, "cannot write the provider's status");
                return;
            }
        };
        let remote: k8s_openapi::api::core::v1::PodStatus = match serde_json::from_slice(
            &message.status_json,
        ) {
            Ok(s) => s,
            Err(error) => {
                self.config.refused.inc();
                tracing::warn!(pod = %key.name, %error, "malformed pod status from the provider");
                return;
            }
        };
        let out = origin_status(
            &remote,
            &StatusContext {
                addresses: &self.config.pod_addresses,
                host_ip: &self.config.node_ip,
                recreations: message.recreations,
                spec: pod.spec.as_ref(),
            },
        );
        if !out.refused.is_empty() {
            self.config.refused.inc();
            if let Some(suppressed) = self.log.allow("pod status part") {
                tracing::warn!(namespace = %key.namespace, pod = %key.name, refused = ?out.refused, suppressed, "left out parts of a provider pod status");
            }
        }
        let status = out.status;
        if pod.status.as_ref() == Some(&status) {
            return;
        }
        let running = |s: Option<&k8s_openapi::api::core::v1::PodStatus>| {
            s.and_then(|s| s.phase.as_deref()) == Some("Running")
        };
        if running(Some(&status)) && !running(pod.status.as_ref()) {
            if let Some(created) = &pod.metadata.creation_timestamp {
                let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
                self.config
                    .running_latency
                    .0
                    .observe(waited.as_secs_f64().max(0.0));
            }
        }
        self.config.status_latency.observe(
            message.sent_unix_millis,
            k8s_openapi::jiff::Timestamp::now().as_millisecond(),
        );
        let mut value = json::to_value(&status);
        // A merge patch keeps keys it does not mention: clear what the provider does not set.
        if let Some(fields) = value.as_object_mut() {
            for k in ["reason", "message", "nominatedNodeName", "podIP", "podIPs"] {
                fields.entry(k).or_insert(serde_json::Value::Null);
            }
        }
        self.write_status(&kept, value).await;
    }
}
