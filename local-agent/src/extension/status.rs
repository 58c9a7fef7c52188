//! The NamespaceOffloading status this peer writes: its own entry of the remote namespaces'
//! conditions (one field manager per peer), the phase of them all as it sees them, and an
//! event when its namespace becomes ready or is refused.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use refract_core::keys::LOCAL_STATUS_FIELD_MANAGER;

use super::{Failure, State};
use crate::crd::{self, NamespaceOffloading, NamespaceOffloadingStatus, RemoteNamespaceCondition};
use crate::recorder::publish_event;

impl State {
    pub(super) async fn write_statuses(
        &mut self,
        desired: &BTreeMap<String, Result<String, String>>,
    ) {
        let offloadings = self.store.state();
        let namespaces: BTreeSet<String> =
            offloadings.iter().filter_map(|o| o.namespace()).collect();
        self.rewrites.retain(|ns| namespaces.contains(ns));
        for nso in offloadings {
            if nso.name_any() != crd::NAME || nso.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(ns) = nso.namespace() else { continue };
            let (mine, view) = self.status_for(&nso, &ns, desired.get(&ns));
            if nso.status.as_ref() == Some(&view) {
                continue;
            }
            let api: Api<NamespaceOffloading> = Api::namespaced(self.client.clone(), &ns);
            let patch = serde_json::json!({
                "apiVersion": "offloading.refract.io/v1alpha1",
                "kind": "NamespaceOffloading",
                "status": mine,
            });
            // One field manager per peer: each local agent owns its own entry of the
            // conditions, so agents of several peerings never overwrite each other's.
            let manager = format!(
                "{LOCAL_STATUS_FIELD_MANAGER}-{}",
                self.config.remote_cluster_id
            );
            let params = PatchParams::apply(&manager).force();
            match api
                .patch_status(crd::NAME, &params, &Patch::Apply(&patch))
                .await
            {
                Ok(_) => {
                    let peer = &self.config.remote_cluster_id;
                    // Counted when written: a write that failed is retried, not undone.
                    let entry = mine
                        .remote_namespaces_conditions
                        .get(peer)
                        .map(Vec::as_slice)
                        .unwrap_or_default();
                    if let Some(count) = self.rewrites.record(&ns, entry, std::time::Instant::now())
                    {
                        tracing::warn!(
                            namespace = %ns,
                            peer = %peer,
                            "this agent wrote its entry of the NamespaceOffloading status {count} times unchanged within a minute: another writer keeps changing it. Is a second local agent peered with the same provider from this origin? Run one agent pair per peering"
                        );
                    }
                    if let Some((type_, reason, note)) =
                        ready_change(nso.status.as_ref(), &mine, peer)
                    {
                        publish_event(
                            &self.config.recorder,
                            nso.object_ref(&()),
                            type_,
                            reason,
                            note,
                        )
                        .await;
                    }
                }
                Err(error) => {
                    tracing::warn!(namespace = %ns, %error, "failed to update NamespaceOffloading status")
                }
            }
        }
    }

    /// What this peer applies (its own conditions, and the phase of them all as it sees
    /// them), and the whole status as it should then read.
    fn status_for(
        &self,
        nso: &NamespaceOffloading,
        ns: &str,
        desired: Option<&Result<String, String>>,
    ) -> (NamespaceOffloadingStatus, NamespaceOffloadingStatus) {
        let cond = |type_: &str, ok: bool, reason: &str, message: &str| RemoteNamespaceCondition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
        };
        let (remote, conditions) = match desired {
            None => (
                None,
                vec![cond(
                    "OffloadingRequired",
                    false,
                    "ClusterNotSelected",
                    "the cluster selector does not select this peer",
                )],
            ),
            Some(target) => {
                let selected = cond("OffloadingRequired", true, "ClusterSelected", "");
                let remote = target.as_ref().ok().cloned();
                match (self.confirmed.get(ns), self.failures.get(ns)) {
                    (Some(_), _) => (
                        remote,
                        vec![selected, cond("Ready", true, "NamespaceCreated", "")],
                    ),
                    (None, Some(Failure::Refused(m))) => (
                        remote,
                        vec![selected, cond("Ready", false, "CreationLoopBackOff", m)],
                    ),
                    (None, Some(Failure::Pending(m))) => {
                        (remote, vec![selected, cond("Ready", false, "Creating", m)])
                    }
                    (None, None) => (remote, vec![selected, cond("Ready", false, "Creating", "")]),
                }
            }
        };
        let peer = self.config.remote_cluster_id.clone();
        let mut view = nso.status.clone().unwrap_or_default();
        view.remote_namespaces_conditions
            .insert(peer.clone(), conditions.clone());
        let phase = crd::phase_of(&view.remote_namespaces_conditions);
        view.offloading_phase = Some(phase.into());
        view.remote_namespace_name = remote.clone().or(view.remote_namespace_name);
        view.conditions = vec![crd::ready_condition(
            phase,
            &view.conditions,
            nso.metadata.generation,
            Time(k8s_openapi::jiff::Timestamp::now()),
        )];
        let mine = NamespaceOffloadingStatus {
            remote_namespace_name: remote,
            offloading_phase: view.offloading_phase.clone(),
            remote_namespaces_conditions: BTreeMap::from([(peer, conditions)]),
            conditions: view.conditions.clone(),
        };
        (mine, view)
    }
}

/// The event a change of this peer's Ready condition deserves: its namespace became ready on
/// the provider, or the provider refused it. Waiting states make no event (they change with
/// every retry).
fn ready_change(
    before: Option<&NamespaceOffloadingStatus>,
    after: &NamespaceOffloadingStatus,
    peer: &str,
) -> Option<(EventType, &'static str, String)> {
    let ready = |s: Option<&NamespaceOffloadingStatus>| {
        s.and_then(|s| s.remote_namespaces_conditions.get(peer))
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .cloned()
    };
    let now = ready(Some(after))?;
    let was = ready(before);
    let same = was
        .as_ref()
        .is_some_and(|w| w.status == now.status && w.reason == now.reason);
    if same {
        return None;
    }
    match (now.status.as_str(), now.reason.as_str()) {
        ("True", _) => Some((
            EventType::Normal,
            "NamespaceExtended",
            format!(
                "extended to provider {peer} as namespace {}",
                after.remote_namespace_name.clone().unwrap_or_default()
            ),
        )),
        (_, "CreationLoopBackOff") => Some((
            EventType::Warning,
            "ExtensionRefused",
            format!("provider {peer}: {}", now.message),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reaching_ready_or_being_refused_makes_an_event() {
        let status = |status: &str, reason: &str| NamespaceOffloadingStatus {
            remote_namespace_name: Some("apps-origin".into()),
            remote_namespaces_conditions: BTreeMap::from([(
                "provider".to_string(),
                vec![RemoteNamespaceCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: "taken".into(),
                }],
            )]),
            ..Default::default()
        };
        let creating = status("False", "Creating");
        let ready = status("True", "NamespaceCreated");
        let refused = status("False", "CreationLoopBackOff");
        let (kind, reason, note) = ready_change(Some(&creating), &ready, "provider").unwrap();
        assert_eq!((kind, reason), (EventType::Normal, "NamespaceExtended"));
        assert!(note.contains("apps-origin"));
        assert_eq!(ready_change(Some(&ready), &ready, "provider"), None);
        assert_eq!(ready_change(None, &creating, "provider"), None);
        let (kind, reason, note) = ready_change(Some(&creating), &refused, "provider").unwrap();
        assert_eq!((kind, reason), (EventType::Warning, "ExtensionRefused"));
        assert!(note.contains("taken"));
        assert_eq!(ready_change(Some(&ready), &ready, "other"), None);
    }
}
