//! The metadata the controller's stores keep of each provider pod and ShadowPod.
//!
//! k8s-openapi's `ObjectMeta` keeps labels and annotations as two `BTreeMap`s, and a B-tree
//! allocates a whole node (about 540 bytes, 640 in the allocator's size class) as soon as it
//! holds one entry: 1.3 KB a pod before any key or value, on top of the struct's own 400 bytes,
//! most of them fields no reader of the store uses. [`KeptMeta`] keeps only the fields read
//! back, every string of them packed in one allocation ([`MetaStrs`]); the labels and
//! annotations stay sorted by key, as a `BTreeMap` hands them over.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::packed_strs::{MetaStrs, Pairs};

/// Where each of the metadata's own strings is in [`KeptMeta::strings`].
const NAME: usize = 0;
const NAMESPACE: usize = 1;
const UID: usize = 2;
const RESOURCE_VERSION: usize = 3;
const CONTROLLER_UID: usize = 4;

/// What is kept of an object's metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptMeta {
    /// The name, namespace, uid, resourceVersion and controlling owner's uid (each empty when
    /// absent: the API server never sets one empty), the labels and the annotations.
    strings: MetaStrs<5>,
    deleting: bool,
}

/// `Some` unless empty.
fn present(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

impl KeptMeta {
    /// What is kept of `meta` (its managedFields, if any, are dropped with the rest).
    pub fn of(meta: ObjectMeta) -> Self {
        let controller_uid = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.as_str());
        let fixed = [
            meta.name.as_deref(),
            meta.namespace.as_deref(),
            meta.uid.as_deref(),
            meta.resource_version.as_deref(),
            controller_uid,
        ]
        .map(Option::unwrap_or_default);
        Self {
            strings: MetaStrs::new(
                fixed,
                meta.labels.iter().flatten(),
                meta.annotations.iter().flatten(),
                std::iter::empty(),
            ),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.strings.fixed(NAME)
    }

    /// The namespace; empty for an object that has none.
    pub fn namespace(&self) -> &str {
        self.strings.fixed(NAMESPACE)
    }

    /// The object's uid.
    pub fn uid(&self) -> Option<&str> {
        present(self.strings.fixed(UID))
    }

    /// The object's resourceVersion, as the watch last showed it.
    pub fn resource_version(&self) -> Option<&str> {
        present(self.strings.fixed(RESOURCE_VERSION))
    }

    /// Whether the object is being deleted.
    pub fn deleting(&self) -> bool {
        self.deleting
    }

    /// The uid of the object's controlling owner (a pod's ShadowPod).
    pub fn controller_uid(&self) -> Option<&str> {
        present(self.strings.fixed(CONTROLLER_UID))
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().get(key)
    }

    /// The value of annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().get(key)
    }

    /// Every label, sorted by key.
    pub fn labels(&self) -> Pairs<'_> {
        self.strings.labels()
    }

    /// Every annotation, sorted by key.
    pub fn annotations(&self) -> Pairs<'_> {
        self.strings.annotations()
    }

    /// The name as the watch machinery asks for it.
    pub fn name_cow(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.name()))
    }

    /// The namespace as the watch machinery asks for it: none when empty.
    pub fn namespace_cow(&self) -> Option<Cow<'_, str>> {
        present(self.namespace()).map(Cow::Borrowed)
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
    use std::collections::BTreeMap;

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
        assert_eq!(kept.annotation("a"), None, "a label is not an annotation");
        assert_eq!(kept.label("note"), None, "nor the other way round");
        assert_eq!(
            kept.labels().iter().collect::<Vec<_>>(),
            [("a", "1"), ("b", "2"), ("c", "3")]
        );
    }

    #[test]
    fn nothing_given_is_nothing_kept() {
        let kept = KeptMeta::of(ObjectMeta::default());
        assert_eq!(kept.namespace_cow(), None);
        assert!(kept.labels().is_empty() && kept.annotations().is_empty());
        assert_eq!(kept.controller_uid(), None);
        assert_eq!((kept.uid(), kept.resource_version()), (None, None));
        assert!(!kept.deleting());
    }
}
