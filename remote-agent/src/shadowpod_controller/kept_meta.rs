//! The metadata the controller's stores keep of each provider pod and ShadowPod.
//!
//! k8s-openapi's `ObjectMeta` keeps labels and annotations as two `BTreeMap`s, and a B-tree
//! allocates a whole node (about 540 bytes, 640 in the allocator's size class) as soon as it
//! holds one entry: 1.3 KB a pod before any key or value, on top of the struct's own 400 bytes,
//! most of them fields no reader of the store uses. [`KeptMeta`] keeps the pairs as sorted
//! boxed slices and, of the rest, only the fields read back.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Labels or annotations, sorted by key.
pub type Pairs = Box<[(Box<str>, Box<str>)]>;

/// What is kept of an object's metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptMeta {
    name: Box<str>,
    namespace: Box<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    deleting: bool,
    /// The uid of the object's controlling owner (a pod's ShadowPod), if it has one.
    controller_uid: Option<Box<str>>,
    labels: Pairs,
    annotations: Pairs,
}

/// `map`'s pairs; a `BTreeMap` hands them over sorted already.
fn pairs(map: Option<BTreeMap<String, String>>) -> Pairs {
    map.into_iter()
        .flatten()
        .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
        .collect()
}

fn boxed(text: Option<String>) -> Option<Box<str>> {
    text.map(String::into_boxed_str)
}

/// The value of `key` in `pairs`.
pub fn lookup<'a>(pairs: &'a Pairs, key: &str) -> Option<&'a str> {
    let at = pairs.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
    Some(&pairs[at].1)
}

impl KeptMeta {
    /// What is kept of `meta` (its managedFields, if any, are dropped with the rest).
    pub fn of(meta: ObjectMeta) -> Self {
        let controller_uid = meta
            .owner_references
            .into_iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.into_boxed_str());
        Self {
            name: meta.name.unwrap_or_default().into_boxed_str(),
            namespace: meta.namespace.unwrap_or_default().into_boxed_str(),
            uid: boxed(meta.uid),
            resource_version: boxed(meta.resource_version),
            deleting: meta.deletion_timestamp.is_some(),
            controller_uid,
            labels: pairs(meta.labels),
            annotations: pairs(meta.annotations),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace; empty for an object that has none.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The object's uid.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// The object's resourceVersion, as the watch last showed it.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Whether the object is being deleted.
    pub fn deleting(&self) -> bool {
        self.deleting
    }

    /// The uid of the object's controlling owner (a pod's ShadowPod).
    pub fn controller_uid(&self) -> Option<&str> {
        self.controller_uid.as_deref()
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// The value of annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    /// Every label, sorted by key.
    pub fn labels(&self) -> &Pairs {
        &self.labels
    }

    /// Every annotation, sorted by key.
    pub fn annotations(&self) -> &Pairs {
        &self.annotations
    }

    /// The name as the watch machinery asks for it.
    pub fn name_cow(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    /// The namespace as the watch machinery asks for it: none when empty.
    pub fn namespace_cow(&self) -> Option<Cow<'_, str>> {
        (!self.namespace.is_empty()).then_some(Cow::Borrowed(&self.namespace))
    }
}

/// Makes `$kept`, a projection of `$kind` with a `meta: KeptMeta` field, an object of `$kind`
/// to a store (kube's `Lookup`). Its keys in the store leave out the resourceVersion and uid
/// that kube copies into each key by default: nothing reads them there, and they are two more
/// strings an object.
macro_rules! lookup_as {
    ($kept:ty, $kind:ty) => {
        impl kube::runtime::reflector::Lookup for $kept {
            type DynamicType = ();

            refract_shared::names_of!($kind);

            fn name(&self) -> Option<std::borrow::Cow<'_, str>> {
                self.meta.name_cow()
            }

            fn namespace(&self) -> Option<std::borrow::Cow<'_, str>> {
                self.meta.namespace_cow()
            }

            fn resource_version(&self) -> Option<std::borrow::Cow<'_, str>> {
                self.meta.resource_version().map(std::borrow::Cow::Borrowed)
            }

            fn uid(&self) -> Option<std::borrow::Cow<'_, str>> {
                self.meta.uid().map(std::borrow::Cow::Borrowed)
            }

            fn to_object_ref(&self, (): ()) -> kube::runtime::reflector::ObjectRef<Self> {
                let at = kube::runtime::reflector::ObjectRef::new(self.meta.name());
                match self.meta.namespace() {
                    "" => at,
                    namespace => at.within(namespace),
                }
            }
        }
    };
}
pub(super) use lookup_as;

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    use super::*;

    #[test]
    fn keeps_what_is_read_and_finds_pairs_by_key() {
        let owner = |uid: &str, controller| OwnerReference {
            uid: uid.into(),
            controller: Some(controller),
            ..Default::default()
        };
        let kept = KeptMeta::of(ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            deletion_timestamp: Some(Time(Default::default())),
            owner_references: Some(vec![owner("other", false), owner("shadow", true)]),
            labels: Some(BTreeMap::from([
                ("b".into(), "2".into()),
                ("a".into(), "1".into()),
                ("c".into(), "3".into()),
            ])),
            annotations: Some(BTreeMap::from([("note".into(), "x".into())])),
            ..Default::default()
        });
        assert_eq!((kept.name(), kept.namespace()), ("web", "ns"));
        assert_eq!(
            (kept.uid(), kept.resource_version()),
            (Some("u1"), Some("7"))
        );
        assert!(kept.deleting());
        assert_eq!(kept.controller_uid(), Some("shadow"));
        assert_eq!(
            ["a", "b", "c", "d"].map(|k| kept.label(k)),
            [Some("1"), Some("2"), Some("3"), None]
        );
        assert_eq!(kept.annotation("note"), Some("x"));
        assert_eq!(kept.annotation("a"), None);
    }

    #[test]
    fn nothing_given_is_nothing_kept() {
        let kept = KeptMeta::of(ObjectMeta::default());
        assert_eq!(kept.namespace_cow(), None);
        assert!(kept.labels().is_empty() && kept.annotations().is_empty());
        assert_eq!(kept.controller_uid(), None);
        assert!(!kept.deleting());
    }
}
