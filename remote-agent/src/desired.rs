//! What the remote agent wants each tenant object to be: the desired state last applied (or
//! being applied), so [`crate::restore`] can tell the agent's own writes from someone else's
//! and put back copies edited or deleted on the provider.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use refract_shared::tls::ClusterId;

use crate::apply::merge::OwnedKeys;
use crate::kinds::Allowed;

/// What the remote agent wants each tenant object to be, for restoring copies edited or
/// deleted on the provider.
#[derive(Clone, Default)]
pub struct DesiredStore {
    inner: Arc<Mutex<BTreeMap<ObjectKey, Remembered>>>,
}

/// Identifies one tenant object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Tenant.
    pub tenant: ClusterId,
    /// Kind.
    pub kind: Allowed,
    /// Namespace (empty for namespaces).
    pub namespace: String,
    /// Name.
    pub name: String,
}

#[derive(Clone)]
struct Remembered {
    object: serde_json::Value,
    resource_version: Option<String>,
    /// A write of this object is under way: its watch events are the agent's own.
    in_flight: bool,
}

impl DesiredStore {
    pub(crate) fn remember(
        &self,
        key: ObjectKey,
        object: serde_json::Value,
        resource_version: Option<String>,
    ) {
        self.inner.lock().expect("desired store poisoned").insert(
            key,
            Remembered {
                object,
                resource_version,
                in_flight: false,
            },
        );
    }

    /// Records the new desired state before it is written, so the write's own watch events are
    /// not mistaken for someone else's edit (and never restore the previous state over it).
    pub(crate) fn begin_write(&self, key: ObjectKey, object: serde_json::Value) {
        self.inner.lock().expect("desired store poisoned").insert(
            key,
            Remembered {
                object,
                resource_version: None,
                in_flight: true,
            },
        );
    }

    /// The keys the desired state last remembered for `key` sets (see [`OwnedKeys`]).
    pub(crate) fn keys_of(&self, key: &ObjectKey) -> Option<OwnedKeys> {
        let map = self.inner.lock().expect("desired store poisoned");
        map.get(key).map(|r| OwnedKeys::of_object(&r.object))
    }

    pub(crate) fn forget(&self, key: &ObjectKey) {
        self.inner
            .lock()
            .expect("desired store poisoned")
            .remove(key);
    }

    /// The desired object for `key`, if it differs from what was last written at
    /// `resource_version` (or the object is gone, `None`).
    pub fn needs_restore(
        &self,
        key: &ObjectKey,
        resource_version: Option<&str>,
    ) -> Option<serde_json::Value> {
        let map = self.inner.lock().expect("desired store poisoned");
        let r = map.get(key)?;
        if r.in_flight {
            return None;
        }
        match (resource_version, r.resource_version.as_deref()) {
            (Some(seen), Some(written)) if seen == written => None,
            _ => Some(r.object.clone()),
        }
    }

    pub(crate) fn set_written(&self, key: &ObjectKey, resource_version: Option<String>) {
        if let Some(r) = self
            .inner
            .lock()
            .expect("desired store poisoned")
            .get_mut(key)
        {
            r.resource_version = resource_version;
            r.in_flight = false;
        }
    }
}
