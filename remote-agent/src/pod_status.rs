//! Streams the status of tenants' pods back to their origin.
//!
//! On every change of a pod or ShadowPod, the status of the origin pod it stands for is put in
//! the tenant's [`Outbox`], which sends it unless the tenant's current session has exactly
//! that status, and sends every status again to a reconnecting origin. Nothing rescans: the
//! stores are read once when they are ready, then only what changed. A ShadowPod whose pod the
//! provider cannot create is reported too, as a Pending status saying why.

use kube::runtime::reflector::ObjectRef;
use refract_core::hash::bytes_hash;
use refract_core::keys::{ORIGIN_LABEL, ORIGIN_UID_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, PodStatus, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::outbox::{Outbox, Subject};
use crate::shadowpod::FAILED_CREATE;
use crate::shadowpod_controller::{KeptShadowPod, Stores};

/// The status the origin pod shows while the provider cannot create its pod: Pending, not
/// scheduled, with the provider's reason.
fn failed_create(shadow: &KeptShadowPod) -> Option<serde_json::Value> {
    let status = shadow.status.as_ref()?;
    if status.reason.as_deref() != Some(FAILED_CREATE) {
        return None;
    }
    let message = status.message.clone().unwrap_or_default();
    Some(serde_json::json!({
        "phase": "Pending",
        "reason": PROVIDER_FAILED_CREATE,
        "message": message,
        "conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": PROVIDER_FAILED_CREATE,
            "message": message,
        }],
    }))
}

/// The reason an origin pod shows while its provider cannot create it.
pub const PROVIDER_FAILED_CREATE: &str = "ProviderFailedCreate";

/// The status of the origin pod that the provider pod or ShadowPod `namespace/name` stands
/// for, with its tenant; `None` when there is none to send (no such object of a tenant, or a
/// ShadowPod whose pod simply does not exist yet).
fn report(
    stores: &Stores,
    namespace: &str,
    name: &str,
) -> Option<(ClusterId, RemoteMessage, String)> {
    let shadow = stores.shadows.get(&ObjectRef::new(name).within(namespace));
    let recreations = shadow
        .as_ref()
        .and_then(|s| s.status.as_ref().map(|s| s.recreations))
        .unwrap_or(0);
    let pod = stores
        .pods
        .get(&ObjectRef::new(name).within(namespace))
        .filter(|p| p.of_shadowpod());
    // The pod's status as the store keeps it, serialized once and shared with the outbox (a
    // clone of `Bytes` copies no byte); a ShadowPod's made up here.
    let (meta, status_json) = match (&pod, &shadow) {
        (Some(pod), _) => (pod.meta(), pod.status_json().clone()),
        (None, Some(shadow)) => (
            shadow.meta(),
            serde_json::to_vec(&failed_create(shadow)?)
                .unwrap_or_default()
                .into(),
        ),
        (None, None) => return None,
    };
    let tenant = ClusterId::parse(meta.label(ORIGIN_LABEL)?).ok()?;
    let origin_uid = meta.label(ORIGIN_UID_LABEL)?.to_string();
    let hash = format!("{}/{recreations}", bytes_hash(&status_json));
    let message = RemoteMessage {
        kind: Some(remote_message::Kind::PodStatus(PodStatus {
            origin_uid,
            namespace: namespace.to_string(),
            name: name.to_string(),
            status_json,
            recreations,
            // Stamped when sent (see `Outbox`).
            sent_unix_millis: 0,
        })),
    };
    Some((tenant, message, hash))
}

/// Puts the current status of `namespace/name` in its tenant's outbox, or takes it out.
fn offer(stores: &Stores, outbox: &Outbox, namespace: &str, name: &str) {
    let subject = Subject::pod(namespace, name);
    match report(stores, namespace, name) {
        Some((tenant, message, hash)) => outbox.put(&tenant, subject, hash, message),
        None => outbox.remove(&subject),
    }
}

/// Starts the status stream.
pub fn spawn(stores: Stores, outbox: Outbox, shutdown: CancellationToken) {
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = stores.listed() => {}
        }
        // Whatever changed while the stores listed is in them now.
        stores.changed.take();
        let everything: std::collections::BTreeSet<(String, String)> = stores
            .pods
            .state()
            .iter()
            .filter(|p| p.of_shadowpod())
            .map(|p| (p.meta().namespace().into(), p.meta().name().into()))
            .chain(
                stores
                    .shadows
                    .state()
                    .iter()
                    .map(|s| (s.meta().namespace().into(), s.meta().name().into())),
            )
            .collect();
        for (namespace, name) in everything {
            offer(&stores, &outbox, &namespace, &name);
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = stores.changed.changed() => {}
            }
            for (namespace, name) in stores.changed.take() {
                offer(&stores, &outbox, &namespace, &name);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Pod, PodStatus as K8sPodStatus};
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;
    use refract_core::keys::MANAGED_BY_LABEL;
    use tokio::sync::Notify;

    use super::*;
    use crate::shadowpod::{ShadowPod, ShadowPodSpec, ShadowPodStatus};
    use crate::shadowpod_controller::{ChangedKeys, ProviderPod, MANAGED_BY_SHADOWPOD};

    fn mk_labels(managed: bool) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (ORIGIN_LABEL.to_string(), "origin".to_string()),
            (ORIGIN_UID_LABEL.to_string(), "uid-web".to_string()),
        ]);
        if managed {
            labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY_SHADOWPOD.into());
        }
        labels
    }

    fn mk_pod(name: &str, labels: BTreeMap<String, String>, phase: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("apps-origin".into());
        pod.metadata.labels = Some(labels);
        pod.status = Some(K8sPodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        pod
    }

    fn mk_shadow(name: &str, status: ShadowPodStatus) -> ShadowPod {
        let mut shadow = ShadowPod::new(name, ShadowPodSpec::default());
        shadow.metadata.namespace = Some("apps-origin".into());
        shadow.metadata.labels = Some(mk_labels(false));
        shadow.status = Some(status);
        shadow
    }

    fn mk_stores(pods: Vec<Pod>, shadows: Vec<ShadowPod>) -> Stores {
        let (pod_store, mut pod_writer): (_, Writer<ProviderPod>) = reflector::store();
        for pod in pods {
            pod_writer.apply_watcher_event(&watcher::Event::Apply(ProviderPod::new(pod)));
        }
        let (shadow_store, mut shadow_writer): (_, Writer<KeptShadowPod>) = reflector::store();
        for shadow in shadows {
            shadow_writer.apply_watcher_event(&watcher::Event::Apply(KeptShadowPod::new(shadow)));
        }
        Stores {
            shadows: shadow_store,
            pods: pod_store,
            changed: ChangedKeys::default(),
            pods_changed: Arc::new(Notify::new()),
            ready: tokio::sync::watch::channel(true).1,
            pods_ready: tokio::sync::watch::channel(true).1,
        }
    }

    fn status_of(message: &RemoteMessage) -> (serde_json::Value, u32) {
        let Some(remote_message::Kind::PodStatus(status)) = &message.kind else {
            panic!("not a pod status: {message:?}");
        };
        (
            serde_json::from_slice(&status.status_json).unwrap(),
            status.recreations,
        )
    }

    #[test]
    fn a_provider_pod_reports_for_its_tenant_with_the_shadowpods_recreations() {
        let recreated = ShadowPodStatus {
            recreations: 2,
            ..Default::default()
        };
        let stores = mk_stores(
            vec![mk_pod("web", mk_labels(true), "Running")],
            vec![mk_shadow("web", recreated)],
        );
        let (tenant, message, hash) = report(&stores, "apps-origin", "web").expect("a status");
        assert_eq!(tenant.as_str(), "origin");
        let (status, recreations) = status_of(&message);
        assert_eq!(
            (status["phase"].as_str(), recreations),
            (Some("Running"), 2)
        );
        // The same state hashes the same; a new phase does not.
        let again = report(&stores, "apps-origin", "web").unwrap().2;
        assert_eq!(hash, again);
        let pending = mk_stores(vec![mk_pod("web", mk_labels(true), "Pending")], vec![]);
        assert_ne!(report(&pending, "apps-origin", "web").unwrap().2, hash);
    }

    #[test]
    fn a_shadowpod_whose_pod_cannot_be_created_reports_pending_with_the_reason() {
        let failing = ShadowPodStatus {
            reason: Some(FAILED_CREATE.into()),
            message: Some("exceeded quota".into()),
            ..Default::default()
        };
        let stores = mk_stores(vec![], vec![mk_shadow("web", failing)]);
        let (_, message, _) = report(&stores, "apps-origin", "web").expect("a status");
        let (status, _) = status_of(&message);
        assert_eq!(status["phase"], "Pending");
        assert_eq!(status["reason"], PROVIDER_FAILED_CREATE);
        assert_eq!(status["conditions"][0]["message"], "exceeded quota");
    }

    #[test]
    fn nothing_is_reported_for_pods_that_are_not_a_tenants_offloaded_pods() {
        // Not created from a ShadowPod: the provider's own pod in the same store.
        let own = mk_stores(vec![mk_pod("web", mk_labels(false), "Running")], vec![]);
        assert!(report(&own, "apps-origin", "web").is_none());
        // No origin labels.
        let unlabelled = mk_stores(
            vec![mk_pod(
                "web",
                BTreeMap::from([(MANAGED_BY_LABEL.into(), MANAGED_BY_SHADOWPOD.into())]),
                "Running",
            )],
            vec![],
        );
        assert!(report(&unlabelled, "apps-origin", "web").is_none());
        // A ShadowPod whose pod does not exist yet, without a failure: nothing to say.
        let waiting = mk_stores(vec![], vec![mk_shadow("web", ShadowPodStatus::default())]);
        assert!(report(&waiting, "apps-origin", "web").is_none());
        assert!(report(&waiting, "apps-origin", "other").is_none());
    }
}
