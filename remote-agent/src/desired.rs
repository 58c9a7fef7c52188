//! What the remote agent wants each tenant object to be: the desired state last applied (or
//! being applied), so [`crate::restore`] can tell the agent's own writes from someone else's
//! and put back copies edited or deleted on the provider.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use refract_shared::keys::DESIRED_HASH_ANNOTATION;
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
    /// The desired object as compact JSON text. Kept for every tenant object, and read only
    /// when one is written again or restored: as a `serde_json::Value` tree, a ConfigMap of
    /// 1 KiB took about three times the memory of its text (every map is a B-tree of its own).
    object: Box<str>,
    /// Its desired-state hash annotation, read on every watch event after a lost answer.
    hash: Option<Box<str>>,
    resource_version: Option<String>,
    /// A write of this object is under way: its watch events are the agent's own.
    in_flight: bool,
    /// The last write failed without an answer (a dropped connection, a timeout): the API
    /// server may have stored it all the same.
    uncertain: bool,
}

impl Remembered {
    fn new(object: &serde_json::Value, resource_version: Option<String>, in_flight: bool) -> Self {
        Self {
            // Straight into a buffer: `Display` would go through `core::fmt`, which showed in
            // a profile of the agent under steady load.
            object: serde_json::to_string(object)
                .expect("a JSON value serializes")
                .into_boxed_str(),
            hash: object["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
                .as_str()
                .map(Into::into),
            resource_version,
            in_flight,
            uncertain: false,
        }
    }

    fn hash(&self) -> Option<&str> {
        self.hash.as_deref()
    }

    /// The object again. Its text was written by `serde_json` from a valid tree, so it parses.
    fn object(text: &str) -> serde_json::Value {
        serde_json::from_str(text).expect("the desired store holds JSON it wrote itself")
    }
}

impl DesiredStore {
    pub(crate) fn remember(
        &self,
        key: ObjectKey,
        object: &serde_json::Value,
        resource_version: Option<String>,
    ) {
        let remembered = Remembered::new(object, resource_version, false);
        self.inner
            .lock()
            .expect("desired store poisoned")
            .insert(key, remembered);
    }

    /// Records the new desired state before it is written, so the write's own watch events are
    /// not mistaken for someone else's edit (and never restore the previous state over it).
    pub(crate) fn begin_write(&self, key: ObjectKey, object: &serde_json::Value) {
        let remembered = Remembered::new(object, None, true);
        self.inner
            .lock()
            .expect("desired store poisoned")
            .insert(key, remembered);
    }

    /// The keys the desired state last remembered for `key` sets (see [`OwnedKeys`]).
    pub(crate) fn keys_of(&self, key: &ObjectKey) -> Option<OwnedKeys> {
        let text = {
            let map = self.inner.lock().expect("desired store poisoned");
            map.get(key).map(|r| r.object.clone())?
        };
        Some(OwnedKeys::of_object(&Remembered::object(&text)))
    }

    /// Forgets every object of `tenant`: it is being removed, and nothing of it is restored.
    pub fn forget_tenant(&self, tenant: &ClusterId) {
        self.inner
            .lock()
            .expect("desired store poisoned")
            .retain(|key, _| key.tenant != *tenant);
    }

    pub(crate) fn forget(&self, key: &ObjectKey) {
        self.inner
            .lock()
            .expect("desired store poisoned")
            .remove(key);
    }

    /// The desired object for `key`, if it differs from what was last written at
    /// `resource_version` (or the object is gone, `None`). `observed_hash` is the desired-state
    /// hash the object carries: after a write whose answer was lost, the first version carrying
    /// the hash of that write is the write itself, landed after all, not someone's edit (a
    /// restore would write the same content again).
    pub fn needs_restore(
        &self,
        key: &ObjectKey,
        resource_version: Option<&str>,
        observed_hash: Option<&str>,
    ) -> Option<serde_json::Value> {
        let mut map = self.inner.lock().expect("desired store poisoned");
        let r = map.get_mut(key)?;
        if r.in_flight {
            return None;
        }
        if r.uncertain
            && resource_version.is_some()
            && observed_hash.is_some()
            && observed_hash == r.hash()
        {
            r.uncertain = false;
            r.resource_version = resource_version.map(str::to_string);
            return None;
        }
        match (resource_version, r.resource_version.as_deref()) {
            (Some(seen), Some(written)) if seen == written => None,
            _ => Some(Remembered::object(&r.object)),
        }
    }

    pub(crate) fn set_written(&self, key: &ObjectKey, resource_version: Option<String>) {
        self.finish_write(key, resource_version, false);
    }

    /// The write of `key` failed without an answer: it may or may not have been stored.
    pub(crate) fn set_uncertain(&self, key: &ObjectKey) {
        self.finish_write(key, None, true);
    }

    fn finish_write(&self, key: &ObjectKey, resource_version: Option<String>, uncertain: bool) {
        if let Some(r) = self
            .inner
            .lock()
            .expect("desired store poisoned")
            .get_mut(key)
        {
            r.resource_version = resource_version;
            r.in_flight = false;
            r.uncertain = uncertain;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ObjectKey {
        ObjectKey {
            tenant: ClusterId::parse("origin").unwrap(),
            kind: Allowed::Reflected(refract_shared::options::Kind::ConfigMap),
            namespace: "apps-origin".into(),
            name: "cfg".into(),
        }
    }

    fn desired(hash: &str) -> serde_json::Value {
        serde_json::json!({"metadata": {"annotations": {DESIRED_HASH_ANNOTATION: hash}}, "data": {"k": hash}})
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_recognised_when_it_lands() {
        let store = DesiredStore::default();
        store.begin_write(key(), &desired("new"));
        store.set_uncertain(&key());
        // The write landed after all: the first version with its hash is not someone's edit.
        assert_eq!(store.needs_restore(&key(), Some("7"), Some("new")), None);
        // Afterwards it is remembered as written at 7: a later version is an edit.
        assert_eq!(store.needs_restore(&key(), Some("7"), Some("new")), None);
        assert_eq!(
            store.needs_restore(&key(), Some("8"), Some("new")),
            Some(desired("new"))
        );
    }

    #[test]
    fn a_lost_write_that_never_landed_is_restored() {
        let store = DesiredStore::default();
        store.begin_write(key(), &desired("new"));
        store.set_uncertain(&key());
        // A version still carrying the previous hash: the write did not land.
        assert_eq!(
            store.needs_restore(&key(), Some("7"), Some("old")),
            Some(desired("new"))
        );
        assert_eq!(
            store.needs_restore(&key(), None, None),
            Some(desired("new")),
            "deleted"
        );
    }
}
