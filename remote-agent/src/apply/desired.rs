//! What the remote agent wants each tenant object to be: enough of the desired state last
//! applied (or being applied) that [`crate::restore`] can tell the agent's own writes from
//! someone else's and put back copies edited or deleted on the provider.
//!
//! The whole desired object is kept only where the provider must restore it alone: twin
//! namespaces, ShadowPods and pods' token Secrets, which keep the tenant's pods running while
//! the link is down. A copy of any other kind is restored from the origin, which holds the
//! object anyway: the remote agent asks for it again ([`Restore::FromOrigin`]), and keeps
//! only its hash, so every reflected object is not held twice by the pair of agents (at
//! 10,000 ConfigMaps of 4 KiB the text was 4.4 KB of the remote agent's 6.4 KB an object).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use refract_core::json;
use refract_core::keys::DESIRED_HASH_ANNOTATION;
use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;

use super::merge::OwnedKeys;
use super::packed::Packed;
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

impl ObjectKey {
    /// The object as the wire names it.
    pub fn object_ref(&self) -> refract_wire::proto::ObjectRef {
        refract_wire::proto::ObjectRef {
            api_version: self.kind.resource().api_version,
            kind: self.kind.kind().into(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// How a copy changed or deleted on the provider gets its desired state back.
#[derive(Debug, Clone, PartialEq)]
pub enum Restore {
    /// From the desired object the remote agent kept: apply it.
    Here(serde_json::Value),
    /// From the origin: the tenant is asked to send the object again, and the object's next
    /// Upsert is written even if its hash is the one the copy still carries.
    FromOrigin,
}

/// What the store keeps of a desired object. Its writer decides (`apply::keep`): the store
/// does not know how objects are written or restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The whole object, for a copy the provider restores alone (see the module's
    /// documentation).
    Whole,
    /// Its hash and the keys it sets ([`OwnedKeys::to_text`]), which the next merge patch
    /// removes if the origin dropped them.
    HashAndKeys,
    /// Its hash only.
    Hash,
}

#[derive(Clone)]
struct Remembered {
    /// The desired object as compact JSON text, deflated ([`Packed`]), for the kinds restored
    /// without the origin: as a `serde_json::Value` tree, a ConfigMap of 1 KiB took about
    /// three times the memory of its text (every map is a B-tree of its own), and the text is
    /// read back only to restore.
    object: Option<Packed>,
    /// For an object of a kind written with merge patches and not kept whole: the keys its
    /// desired state sets ([`OwnedKeys::to_text`]), which the next patch removes if the
    /// origin dropped them.
    keys: Option<Box<str>>,
    /// Its desired-state hash annotation, read on every watch event after a lost answer.
    hash: Option<Box<str>>,
    resource_version: Option<String>,
    /// The resourceVersion of the agent's write before the last: the watch may show it after
    /// the last write landed (under load, or while it reads in batches), and it is the
    /// agent's own, not someone's edit.
    earlier: Option<Box<str>>,
    /// A write of this object is under way: its watch events are the agent's own.
    in_flight: bool,
    /// The last write failed without an answer (a dropped connection, a timeout): the API
    /// server may have stored it all the same.
    uncertain: bool,
    /// Changed or deleted on the provider, to be restored from the origin: its next Upsert is
    /// written even if the copy still carries that Upsert's hash, and a reconnect's inventory
    /// leaves it out so the tenant sends it.
    drifted: bool,
    /// A status write of the agent's is under way (the ShadowPod controller's): boxed, as it
    /// lives only for the write's round trip.
    status_writing: Option<Box<StatusWriting>>,
}

/// What the watch showed of an object while the agent wrote its status.
#[derive(Clone, Default)]
struct StatusWriting {
    /// The resourceVersions the store could not place: the status write's own, when its
    /// event outran its answer, or someone's edit. Judged once the answer names the write's.
    unplaced: Vec<Box<str>>,
}

impl Remembered {
    fn new(
        keep: Keep,
        object: &serde_json::Value,
        resource_version: Option<String>,
        in_flight: bool,
    ) -> Self {
        Self {
            // Straight into a buffer: `Display` would go through `core::fmt`, which showed in
            // a profile of the agent under steady load.
            object: (keep == Keep::Whole)
                .then(|| Packed::of(&json::to_string(object)))
                .flatten(),
            keys: (keep == Keep::HashAndKeys).then(|| OwnedKeys::of_object(object).to_text()),
            hash: object["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
                .as_str()
                .map(Into::into),
            resource_version,
            earlier: None,
            in_flight,
            uncertain: false,
            drifted: false,
            status_writing: None,
        }
    }

    /// What `earlier` becomes once the agent writes the object again: the resourceVersion of
    /// its last write, whose event may still be shown late, or the one before if that write's
    /// answer never came.
    fn version_before_next(&self) -> Option<Box<str>> {
        match &self.resource_version {
            Some(version) => Some(version.as_str().into()),
            None => self.earlier.clone(),
        }
    }

    fn hash(&self) -> Option<&str> {
        self.hash.as_deref()
    }

    /// The object again. Its text was written by `serde_json` from a valid tree, so it
    /// parses, unless the tree was nested past the parser's depth limit; then (or if it does
    /// not inflate) the store acts as if it had kept only the hash (the origin sends the
    /// object again).
    fn object(packed: &Packed) -> Option<serde_json::Value> {
        serde_json::from_str(&packed.text()?).ok()
    }
}

impl DesiredStore {
    pub(crate) fn remember(
        &self,
        key: ObjectKey,
        object: &serde_json::Value,
        keep: Keep,
        resource_version: Option<String>,
    ) {
        let remembered = Remembered::new(keep, object, resource_version, false);
        self.inner.locked().insert(key, remembered);
    }

    /// Records the new desired state before it is written, so the write's own watch events are
    /// not mistaken for someone else's edit (and never restore the previous state over it).
    pub(crate) fn begin_write(&self, key: ObjectKey, object: &serde_json::Value, keep: Keep) {
        let mut remembered = Remembered::new(keep, object, None, true);
        let mut map = self.inner.locked();
        // A restore stays one until a write lands: a create refused because the copy is there
        // is followed by a write over it.
        if let Some(before) = map.get(&key) {
            remembered.drifted = before.drifted;
            remembered.earlier = before.version_before_next();
        }
        map.insert(key, remembered);
    }

    /// The write of `key` just begun wrote nothing (refused before reaching the object): the
    /// object is not the agent's to remember, unless it is a copy being restored.
    pub(crate) fn abandon_write(&self, key: &ObjectKey) {
        let mut map = self.inner.locked();
        match map.get_mut(key) {
            Some(r) if r.drifted => r.in_flight = false,
            Some(_) => {
                map.remove(key);
            }
            None => {}
        }
    }

    /// The keys the desired state last remembered for `key` sets (see [`OwnedKeys`]).
    pub(crate) fn keys_of(&self, key: &ObjectKey) -> Option<OwnedKeys> {
        // Only the packed text is copied under the lock; it is read after.
        let (object, keys) = {
            let map = self.inner.locked();
            let r = map.get(key)?;
            (r.object.clone(), r.keys.clone())
        };
        match (object, keys) {
            (Some(packed), _) => Remembered::object(&packed).map(|o| OwnedKeys::of_object(&o)),
            (None, Some(keys)) => Some(OwnedKeys::from_text(&keys)),
            (None, None) => None,
        }
    }

    /// Forgets every object of `tenant`: it is being removed, and nothing of it is restored.
    pub fn forget_tenant(&self, tenant: &ClusterId) {
        self.inner.locked().retain(|key, _| key.tenant != *tenant);
    }

    pub(crate) fn forget(&self, key: &ObjectKey) {
        self.inner.locked().remove(key);
    }

    /// Whether `key` was changed or deleted on the provider and waits for the origin to send
    /// it again ([`Restore::FromOrigin`]).
    pub fn drifted(&self, key: &ObjectKey) -> bool {
        self.inner.locked().get(key).is_some_and(|r| r.drifted)
    }

    /// How to restore `key`, if it differs from what was last written at `resource_version`
    /// (or the object is gone, `None`). `observed_hash` is the desired-state hash the object
    /// carries: after a write whose answer was lost, the first version carrying the hash of
    /// that write is the write itself, landed after all, not someone's edit (a restore would
    /// write the same content again).
    pub fn needs_restore(
        &self,
        key: &ObjectKey,
        resource_version: Option<&str>,
        observed_hash: Option<&str>,
    ) -> Option<Restore> {
        let mut map = self.inner.locked();
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
            // The event of the agent's write before the last, shown late.
            (Some(seen), _) if r.earlier.as_deref() == Some(seen) => None,
            // Likeliest the agent's status write, whose event came before its answer: judged
            // when the answer comes (`end_status_write`).
            (Some(seen), _) if r.status_writing.is_some() => {
                if let Some(writing) = r.status_writing.as_mut() {
                    writing.unplaced.push(seen.into());
                }
                None
            }
            _ => match r.object.as_ref().and_then(Remembered::object) {
                Some(object) => Some(Restore::Here(object)),
                None => Some(Restore::FromOrigin),
            },
        }
    }

    /// Whether the desired state last remembered for `key` has hash `hash`: an Upsert of it
    /// is the same state sent again, not a change of the tenant's.
    pub fn holds_hash(&self, key: &ObjectKey, hash: &str) -> bool {
        self.inner
            .locked()
            .get(key)
            .is_some_and(|r| r.hash() == Some(hash))
    }

    /// The resourceVersion of `key` as the agent last wrote it.
    pub fn written_version(&self, key: &ObjectKey) -> Option<String> {
        self.inner.locked().get(key)?.resource_version.clone()
    }

    /// `key` is being restored from the origin: its next Upsert is written even when its
    /// hash is the one remembered, and the inventory leaves it out. Not done by
    /// [`DesiredStore::needs_restore`], which also answers for copies left alone (quarantined).
    pub fn mark_drifted(&self, key: &ObjectKey) {
        if let Some(r) = self.inner.locked().get_mut(key) {
            r.drifted = true;
        }
    }

    /// Every object kept whole, with its desired state.
    pub fn whole(&self) -> Vec<(ObjectKey, serde_json::Value)> {
        let kept: Vec<(ObjectKey, Packed)> = self
            .inner
            .locked()
            .iter()
            .filter_map(|(key, r)| Some((key.clone(), r.object.clone()?)))
            .collect();
        kept.into_iter()
            .filter_map(|(key, packed)| Some((key, Remembered::object(&packed)?)))
            .collect()
    }

    /// How to restore every object of `tenant` in its namespace `namespace`, which was
    /// deleted with them and is back: those kept whole from here, ShadowPods first (the token
    /// Secrets they own name them); the others from the origin, marked as drifted so that
    /// their next Upsert is written and a reconnect's inventory leaves them out.
    pub fn refill(&self, tenant: &ClusterId, namespace: &str) -> Vec<(ObjectKey, Restore)> {
        let mut map = self.inner.locked();
        let mut contents: Vec<(ObjectKey, Restore)> = map
            .iter_mut()
            .filter(|(key, _)| {
                key.tenant == *tenant
                    && key.namespace == namespace
                    && key.kind != Allowed::Namespace
            })
            .map(|(key, r)| {
                let restore = match r.object.as_ref().and_then(Remembered::object) {
                    Some(object) => Restore::Here(object),
                    None => {
                        r.drifted = true;
                        Restore::FromOrigin
                    }
                };
                (key.clone(), restore)
            })
            .collect();
        contents.sort_by_key(|(key, _)| key.kind != Allowed::ShadowPod);
        contents
    }

    pub(crate) fn set_written(&self, key: &ObjectKey, resource_version: Option<String>) {
        self.finish_write(key, resource_version, false);
    }

    /// The agent itself begins to write `key`'s status (the ShadowPod controller): until
    /// [`DesiredStore::end_status_write`], a version the store cannot place is held, not
    /// restored, as it is likeliest that write's own event outrunning its answer.
    pub fn begin_status_write(&self, key: &ObjectKey) {
        if let Some(r) = self.inner.locked().get_mut(key) {
            r.status_writing = Some(Box::default());
        }
    }

    /// The agent's status write of `key` ended: stored at `written`, or failed (`None`). The
    /// watch event of a stored write is the agent's own, not an edit to restore. Left alone
    /// while a write of the desired state is under way or after one whose answer was lost:
    /// those settle from their own events. Returns whether a version held while it was under
    /// way was not the write's own: someone else wrote the object, and the restorer is to
    /// judge it again as it is now. The write is then not recorded as the agent's, so that
    /// judgement restores whichever version it finds, the write's own too.
    #[must_use]
    pub fn end_status_write(&self, key: &ObjectKey, written: Option<&str>) -> bool {
        let mut map = self.inner.locked();
        let Some(r) = map.get_mut(key) else {
            return false;
        };
        let unplaced = r.status_writing.take().map(|w| w.unplaced);
        let foreign = unplaced
            .unwrap_or_default()
            .iter()
            .any(|seen| Some(&**seen) != written);
        if let (Some(written), false) = (written, foreign) {
            if !r.in_flight && !r.uncertain {
                r.earlier = r.version_before_next();
                r.resource_version = Some(written.to_string());
            }
        }
        foreign
    }

    /// The write of `key` failed without an answer: it may or may not have been stored.
    pub(crate) fn set_uncertain(&self, key: &ObjectKey) {
        self.finish_write(key, None, true);
    }

    fn finish_write(&self, key: &ObjectKey, resource_version: Option<String>, uncertain: bool) {
        if let Some(r) = self.inner.locked().get_mut(key) {
            r.resource_version = resource_version;
            r.in_flight = false;
            r.uncertain = uncertain;
            // A write that landed restored the copy; one that may not have, not yet.
            r.drifted &= uncertain;
        }
    }
}

#[cfg(test)]
mod tests {
    use refract_core::options::Kind;

    use super::*;

    fn key(kind: Allowed) -> ObjectKey {
        ObjectKey {
            tenant: ClusterId::parse("origin").unwrap(),
            kind,
            namespace: "apps-origin".into(),
            name: "cfg".into(),
        }
    }

    const CM: Allowed = Allowed::Reflected(Kind::ConfigMap);

    fn desired(hash: &str) -> serde_json::Value {
        serde_json::json!({"metadata": {"annotations": {DESIRED_HASH_ANNOTATION: hash}}, "data": {"k": hash}})
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_recognised_when_it_lands() {
        let store = DesiredStore::default();
        let key = key(Allowed::ShadowPod);
        store.begin_write(key.clone(), &desired("new"), Keep::Whole);
        store.set_uncertain(&key);
        // The write landed after all: the first version with its hash is not someone's edit.
        assert_eq!(store.needs_restore(&key, Some("7"), Some("new")), None);
        // Afterwards it is remembered as written at 7: a later version is an edit.
        assert_eq!(store.needs_restore(&key, Some("7"), Some("new")), None);
        assert_eq!(
            store.needs_restore(&key, Some("8"), Some("new")),
            Some(Restore::Here(desired("new")))
        );
    }

    #[test]
    fn a_namespace_back_is_refilled_shadowpods_first_the_rest_from_the_origin() {
        let store = DesiredStore::default();
        let named = |kind, namespace: &str, name: &str| ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
            ..key(kind)
        };
        let secret = named(Allowed::Reflected(Kind::Secret), "apps-origin", "web-token");
        let shadow = named(Allowed::ShadowPod, "apps-origin", "web");
        let config = named(CM, "apps-origin", "cfg");
        let elsewhere = named(CM, "other-origin", "cfg");
        let twin = named(Allowed::Namespace, "", "apps-origin");
        store.remember(secret.clone(), &desired("s"), Keep::Whole, None);
        store.remember(shadow.clone(), &desired("p"), Keep::Whole, None);
        store.remember(config.clone(), &desired("c"), Keep::Hash, None);
        store.remember(elsewhere.clone(), &desired("e"), Keep::Hash, None);
        store.remember(twin, &desired("n"), Keep::Whole, None);

        let refill = store.refill(&shadow.tenant, "apps-origin");
        let order: Vec<&ObjectKey> = refill.iter().map(|(k, _)| k).collect();
        assert_eq!(
            order[0], &shadow,
            "the token Secret names its ShadowPod as owner"
        );
        assert_eq!(order.len(), 3, "{order:?}");
        assert!(refill.contains(&(secret, Restore::Here(desired("s")))));
        assert!(refill.contains(&(config.clone(), Restore::FromOrigin)));
        assert!(store.drifted(&config), "its next Upsert is written");
        assert!(!store.drifted(&elsewhere));
    }

    #[test]
    fn the_event_of_the_write_before_the_last_shown_late_is_the_agents_own() {
        let store = DesiredStore::default();
        let key = key(CM);
        store.begin_write(key.clone(), &desired("one"), Keep::HashAndKeys);
        store.set_written(&key, Some("7".into()));
        store.begin_write(key.clone(), &desired("two"), Keep::HashAndKeys);
        store.set_written(&key, Some("9".into()));
        assert_eq!(store.needs_restore(&key, Some("7"), Some("one")), None);
        assert_eq!(store.needs_restore(&key, Some("9"), Some("two")), None);
        assert_eq!(
            store.needs_restore(&key, Some("8"), Some("one")),
            Some(Restore::FromOrigin),
            "someone else's write between the two"
        );
    }

    /// One status write of the agent's, stored at `written` (`None`: failed), with the watch
    /// showing `meanwhile` before its answer came; whether someone else wrote meanwhile.
    fn status_write(
        store: &DesiredStore,
        key: &ObjectKey,
        meanwhile: &[&str],
        written: Option<&str>,
    ) -> bool {
        store.begin_status_write(key);
        for seen in meanwhile {
            assert_eq!(
                store.needs_restore(key, Some(seen), Some("pod")),
                None,
                "{seen} is held while the status write is under way"
            );
        }
        store.end_status_write(key, written)
    }

    #[test]
    fn the_agents_own_status_writes_are_not_edits_to_restore() {
        let store = DesiredStore::default();
        let key = key(Allowed::ShadowPod);
        store.begin_write(key.clone(), &desired("pod"), Keep::Whole);
        // While the desired state is in flight, its own answer says where it landed.
        assert!(!status_write(&store, &key, &[], Some("6")));
        store.set_written(&key, Some("7".into()));
        assert_eq!(store.needs_restore(&key, Some("7"), Some("pod")), None);
        assert!(!status_write(&store, &key, &[], Some("8")));
        assert!(!status_write(&store, &key, &[], Some("9")));
        for (seen, why) in [("9", "the status write"), ("8", "the one before, late")] {
            assert_eq!(
                store.needs_restore(&key, Some(seen), Some("pod")),
                None,
                "{why}"
            );
        }
        assert_eq!(
            store.needs_restore(&key, Some("10"), Some("pod")),
            Some(Restore::Here(desired("pod"))),
            "someone else's edit after it is restored"
        );
        assert_eq!(
            store.needs_restore(&key, None, None),
            Some(Restore::Here(desired("pod"))),
            "and so is a deletion"
        );
        let unknown = ObjectKey {
            name: "never-written".into(),
            ..key.clone()
        };
        assert!(!status_write(&store, &unknown, &[], Some("3")));
        assert_eq!(store.needs_restore(&unknown, Some("3"), None), None);
    }

    #[test]
    fn a_status_writes_event_before_its_answer_is_its_own_and_an_edit_beside_it_is_not() {
        let store = DesiredStore::default();
        let key = key(Allowed::ShadowPod);
        store.begin_write(key.clone(), &desired("pod"), Keep::Whole);
        store.set_written(&key, Some("7".into()));
        assert!(
            !status_write(&store, &key, &["8"], Some("8")),
            "the write's own event, ahead of its answer"
        );
        assert_eq!(store.needs_restore(&key, Some("8"), Some("pod")), None);
        // Someone else wrote beside the write: it is not recorded as the agent's, so judging
        // the object as it is now restores it, whichever of the two versions it finds.
        for (meanwhile, written, why) in [
            (
                &["9", "10"][..],
                Some("10"),
                "an edit just before the write's own event",
            ),
            (&["11", "12"][..], Some("11"), "an edit just after it"),
            (
                &["13"][..],
                None,
                "a version seen while a status write failed",
            ),
        ] {
            assert!(status_write(&store, &key, meanwhile, written), "{why}");
            for seen in meanwhile {
                assert_eq!(
                    store.needs_restore(&key, Some(seen), Some("pod")),
                    Some(Restore::Here(desired("pod"))),
                    "{why}: {seen} is judged as someone else's"
                );
            }
        }
        // A deletion is never held.
        store.begin_status_write(&key);
        assert_eq!(
            store.needs_restore(&key, None, None),
            Some(Restore::Here(desired("pod")))
        );
        assert!(!store.end_status_write(&key, Some("15")));
    }

    #[test]
    fn a_lost_write_that_never_landed_is_restored() {
        let store = DesiredStore::default();
        let key = key(Allowed::ShadowPod);
        store.begin_write(key.clone(), &desired("new"), Keep::Whole);
        store.set_uncertain(&key);
        // A version still carrying the previous hash: the write did not land.
        assert_eq!(
            store.needs_restore(&key, Some("7"), Some("old")),
            Some(Restore::Here(desired("new")))
        );
        assert_eq!(
            store.needs_restore(&key, None, None),
            Some(Restore::Here(desired("new"))),
            "deleted"
        );
    }

    #[test]
    fn reflected_objects_are_restored_from_the_origin_and_kept_as_hash_and_keys() {
        let store = DesiredStore::default();
        let key = key(CM);
        store.begin_write(key.clone(), &desired("new"), Keep::HashAndKeys);
        store.set_written(&key, Some("7".into()));
        let kept = store.inner.locked().get(&key).cloned().expect("remembered");
        assert!(kept.object.is_none(), "the origin holds the object");
        assert_eq!(kept.hash(), Some("new"));
        assert_eq!(
            store.keys_of(&key),
            Some(OwnedKeys::of_object(&desired("new"))),
            "the keys a merge patch removes when the origin drops them"
        );
        assert!(!store.drifted(&key));
        // Its own write's event: nothing to do.
        assert_eq!(store.needs_restore(&key, Some("7"), Some("new")), None);
        // Edited on the provider (the hash annotation left as it was): asked of the origin.
        assert_eq!(
            store.needs_restore(&key, Some("8"), Some("new")),
            Some(Restore::FromOrigin)
        );
        assert!(
            !store.drifted(&key),
            "until the restorer decides to restore it"
        );
        store.mark_drifted(&key);
        assert!(store.drifted(&key));
        // The origin's Upsert is written again: drifted until that write lands, even through
        // a create refused because the copy is there.
        store.begin_write(key.clone(), &desired("new"), Keep::HashAndKeys);
        store.abandon_write(&key);
        assert!(store.drifted(&key));
        store.begin_write(key.clone(), &desired("new"), Keep::HashAndKeys);
        store.set_uncertain(&key);
        assert!(store.drifted(&key));
        store.begin_write(key.clone(), &desired("new"), Keep::HashAndKeys);
        store.set_written(&key, Some("9".into()));
        assert!(!store.drifted(&key));
        // An object never restored is forgotten when its write is refused.
        let other = ObjectKey {
            name: "other".into(),
            ..key.clone()
        };
        store.begin_write(other.clone(), &desired("new"), Keep::HashAndKeys);
        store.abandon_write(&other);
        assert!(store.keys_of(&other).is_none());
    }

    #[test]
    fn the_store_keeps_what_its_writer_says() {
        let store = DesiredStore::default();
        let pod = key(Allowed::ShadowPod);
        let service = key(Allowed::Reflected(Kind::Service));
        let ingress = key(Allowed::Reflected(Kind::Ingress));
        store.begin_write(pod.clone(), &desired("h"), Keep::Whole);
        store.begin_write(service.clone(), &desired("h"), Keep::HashAndKeys);
        store.begin_write(ingress.clone(), &desired("h"), Keep::Hash);
        let map = store.inner.locked();
        assert!(map[&pod].object.is_some() && map[&pod].keys.is_none());
        assert!(map[&service].object.is_none() && map[&service].keys.is_some());
        assert!(map[&ingress].object.is_none() && map[&ingress].keys.is_none());
        assert!([&pod, &service, &ingress]
            .iter()
            .all(|k| map[*k].hash() == Some("h")));
    }
}
