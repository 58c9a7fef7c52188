//! What the agents' watch stores keep of each object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// Drops an object's managedFields before a watch store keeps it. No reader of the stores that
/// use it looks at them, and they are the largest part of a Pod in memory: each field
/// manager's FieldsV1 is a tree of JSON maps, and a running pod has several managers (its
/// creator, the scheduler, the kubelet, the agent writing its status).
pub fn without_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Reads an object's metadata without its managedFields, for a projection decoded straight
/// from the watch (`#[serde(deserialize_with = ...)]`): the entries are dropped as they are
/// read, never held beside the rest.
pub fn metadata_without_managed_fields<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<ObjectMeta, D::Error> {
    let mut metadata = ObjectMeta::deserialize(d)?;
    metadata.managed_fields = None;
    Ok(metadata)
}

/// Implements `kube::Resource` for `$projection`, a struct with a `metadata: ObjectMeta` field
/// that a watch store keeps instead of the whole `$kind` (less than the object, for memory):
/// its kind, group, version and plural are `$kind`'s, so stores, object references and owner
/// references treat the projection as the object itself. `$kind` must be namespaced, and the
/// calling crate must depend on `kube` and `k8s_openapi` (the expansion names both).
#[macro_export]
macro_rules! resource_as {
    ($projection:ty, $kind:ty) => {
        impl kube::Resource for $projection {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            $crate::names_of!($kind);

            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// The kind, group, version and plural of `$kind`, as functions of a `kube::Resource` or a
/// `Lookup` (both ask for them alike) that stands for `$kind`: for [`resource_as!`] and for
/// a projection that is only an identity to its store.
#[macro_export]
macro_rules! names_of {
    ($kind:ty) => {
        fn kind(_: &()) -> std::borrow::Cow<'_, str> {
            <$kind as kube::Resource>::kind(&())
        }

        fn group(_: &()) -> std::borrow::Cow<'_, str> {
            <$kind as kube::Resource>::group(&())
        }

        fn version(_: &()) -> std::borrow::Cow<'_, str> {
            <$kind as kube::Resource>::version(&())
        }

        fn plural(_: &()) -> std::borrow::Cow<'_, str> {
            <$kind as kube::Resource>::plural(&())
        }
    };
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    #[test]
    fn managed_fields_go_and_the_rest_stays() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubelet".into()),
            ..Default::default()
        }]);
        without_managed_fields(&mut pod);
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
    }
}
