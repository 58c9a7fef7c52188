//! The controller's writes of ShadowPods' status, recorded as the agent's own.
//!
//! A status write moves the ShadowPod's resourceVersion, which the applier never wrote: without
//! a record the restorer took each for someone else's edit and applied the whole desired state
//! over it, one more request per status write, or a conflict (logged as a failed restore) when
//! the next status write came first. At 10,000 pods those restores fell minutes behind the
//! ShadowPods' watch, which feeds the restorer. The watch may also show a write before its
//! answer reaches the controller: the store holds what it cannot place while a write is under
//! way; when what it held turns out not to be the write's own, the write is not recorded as the
//! agent's and the restorer judges the object again as the watch holds it then.

use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use refract_core::forge::pod::SHADOWPOD_API_VERSION;
use refract_core::keys::REMOTE_STATUS_FIELD_MANAGER;
use refract_shared::tls::ClusterId;

use crate::apply::desired::DesiredStore;
use crate::apply::ObjectKey;
use crate::kinds::Allowed;
use crate::objects::Feed;
use crate::shadowpod::{ShadowPod, ShadowPodStatus};

/// Where the controller's status writes are recorded: the desired store, and the restorer,
/// told to judge again an object someone else wrote while its status was being written.
#[derive(Clone)]
pub struct OwnWrites {
    pub desired: DesiredStore,
    /// The restorer's side of the ShadowPods' watch.
    pub restorer: Feed,
}

/// Writes one ShadowPod's status (see the module's documentation).
pub struct StatusWriter<'a> {
    /// The ShadowPods of its namespace.
    pub api: Api<ShadowPod>,
    pub own: &'a OwnWrites,
    /// The ShadowPod's tenant, namespace and name: its desired record's key is built only when
    /// a status is written, not on every reconcile (a resync reconciles every ShadowPod).
    pub tenant: &'a ClusterId,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl StatusWriter<'_> {
    pub async fn write(&self, status: &ShadowPodStatus) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "apiVersion": SHADOWPOD_API_VERSION,
            "kind": "ShadowPod",
            "status": status,
        });
        let writing = Writing::begin(
            &self.own.desired,
            ObjectKey {
                tenant: self.tenant.clone(),
                kind: Allowed::ShadowPod,
                namespace: self.namespace.into(),
                name: self.name.into(),
            },
        );
        let written = self
            .api
            .patch_status(
                self.name,
                &PatchParams::apply(REMOTE_STATUS_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await;
        let version = written
            .as_ref()
            .ok()
            .and_then(ResourceExt::resource_version);
        if writing.end(version.as_deref()) {
            self.own.restorer.recheck(self.namespace, self.name).await;
        }
        written.map(drop)
    }
}

/// A status write under way; one dropped before its answer (only when the agent shuts down)
/// counts as failed, so the store never holds versions for a write that has ended.
struct Writing<'a> {
    desired: &'a DesiredStore,
    key: Option<ObjectKey>,
}

impl<'a> Writing<'a> {
    fn begin(desired: &'a DesiredStore, key: ObjectKey) -> Self {
        desired.begin_status_write(&key);
        Self {
            desired,
            key: Some(key),
        }
    }

    /// Whether someone else wrote the object while the write was under way.
    fn end(mut self, written: Option<&str>) -> bool {
        self.key
            .take()
            .is_some_and(|key| self.desired.end_status_write(&key, written))
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let _ = self.desired.end_status_write(&key, None);
        }
    }
}
