//! What the watch store keeps of one tenant object: only the fields the remote agent reads
//! back, in a compact form.
//!
//! The store holds every tenant object of every tenant, so its per-object cost is the remote
//! agent's memory per reflected object. kube's reflector keeps a whole `ObjectMeta` behind an
//! `Arc`: a heap profile at 10,000 ConfigMaps showed about 2.3 KB an object, mostly two
//! B-tree nodes (labels and annotations, 544 bytes each however few entries they hold), the
//! struct itself and the origin's labels and annotations copied with the object, none of which
//! the agent reads. [`Kept`] holds the agent's own keys, all its strings in one allocation, and
//! the metadata is rebuilt when read (one object per write, or an inventory at a reconnect).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use kube::api::ObjectMeta;
use refract_core::keys::REMOTE_FIELD_MANAGER;

use refract_core::keys::ORIGIN_LABEL;

use super::Meta;
use crate::kinds::Allowed;
use crate::packed_strs::{MetaStrs, Pairs};
use crate::quota::footprint::{self, Footprint};

/// The parts of a tenant object's metadata the applier, the inventory and restoring read.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Kept {
    /// The resourceVersion (empty when absent), every label's key and value, every
    /// annotation's, then the agent's own managedFields entries as FieldsV1 text, on the kinds
    /// it writes without server-side apply (they say which keys it set; see `apply::merge`),
    /// all in one allocation ([`MetaStrs`]).
    strings: MetaStrs<1>,
    deletion_timestamp: Option<Time>,
}

/// Whether a label or annotation is one the agent reads back: every one it reads (origin,
/// destination, tenant, service account; the desired and origin hashes, the original name,
/// tenant removal) is under a `refract.io/` prefix, and the labels that tell a kind's tenant
/// objects from others' ([`Allowed::own_labels`]). The origin's own labels and annotations,
/// copied onto the object, are never read from the store.
fn read_back(key: &str) -> bool {
    key.contains("refract.io/") || Allowed::is_own_label(key)
}

/// `map`'s pairs the agent reads back, sorted by key (as a `BTreeMap` hands them over).
fn pairs(
    map: Option<&std::collections::BTreeMap<String, String>>,
) -> impl Iterator<Item = (&String, &String)> + Clone {
    map.into_iter().flatten().filter(|(k, _)| read_back(k))
}

fn map(pairs: Pairs<'_>) -> Option<std::collections::BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// A managedFields entry's FieldsV1 as JSON text, which the merge patch's reading of owned
/// keys takes as well as the tree. The agent's entries of every ConfigMap and Secret are kept
/// this way: as a tree of small maps one cost about 3 KB per object, as text a few hundred bytes.
fn fields_text(fields: &FieldsV1) -> Box<str> {
    match &fields.0 {
        serde_json::Value::String(text) => text.as_str().into(),
        tree => refract_core::json::to_string(tree).into_boxed_str(),
    }
}

impl Kept {
    /// What to keep of `meta`; `own_fields` whether its kind needs the agent's managedFields.
    pub(super) fn of(meta: &ObjectMeta, own_fields: bool) -> Self {
        let own_fields: Vec<Box<str>> = if own_fields {
            meta.managed_fields
                .iter()
                .flatten()
                .filter(|e| e.manager.as_deref() == Some(REMOTE_FIELD_MANAGER))
                .filter_map(|e| e.fields_v1.as_ref())
                .map(fields_text)
                .collect()
        } else {
            Vec::new()
        };
        let strings = MetaStrs::new(
            [meta.resource_version.as_deref().unwrap_or_default()],
            pairs(meta.labels.as_ref()),
            pairs(meta.annotations.as_ref()),
            own_fields.iter().map(|text| &**text),
        );
        Self {
            strings,
            deletion_timestamp: meta.deletion_timestamp.clone(),
        }
    }

    fn resource_version(&self) -> Option<&str> {
        let rv = self.strings.fixed(0);
        (!rv.is_empty()).then_some(rv)
    }

    /// The value of label `key`, if it is one the store keeps.
    pub(super) fn label(&self, key: &str) -> Option<&str> {
        self.strings.labels().get(key)
    }

    /// The tenant the object (of `kind`) is of, and what it counts for against the tenant's
    /// quota. One written before footprints were stamped counts as one object of its kind
    /// until it is written again.
    pub(super) fn footprint(&self, kind: Allowed) -> Option<(&str, Footprint)> {
        let tenant = self.label(ORIGIN_LABEL)?;
        let fp = match self.strings.annotations().get(footprint::ANNOTATION) {
            Some(text) => Footprint::decode(text),
            None => footprint::unstamped(kind),
        };
        Some((tenant, fp))
    }

    /// Whether the object is being deleted.
    pub(super) fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// The metadata again, for object `namespace/name` (namespace empty for namespaces).
    pub(super) fn meta(&self, namespace: &str, name: &str) -> Meta {
        // The rest: the agent's own managedFields entries, as FieldsV1 text.
        let mut own_fields = self.strings.rest().peekable();
        let managed_fields = own_fields.peek().is_some().then(|| {
            own_fields
                .map(|text| ManagedFieldsEntry {
                    manager: Some(REMOTE_FIELD_MANAGER.into()),
                    fields_type: Some("FieldsV1".into()),
                    fields_v1: Some(FieldsV1(serde_json::Value::String(text.to_string()))),
                    ..Default::default()
                })
                .collect()
        });
        Meta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: (!namespace.is_empty()).then(|| namespace.into()),
                resource_version: self.resource_version().map(Into::into),
                deletion_timestamp: self.deletion_timestamp.clone(),
                labels: map(self.strings.labels()),
                annotations: map(self.strings.annotations()),
                managed_fields,
                ..Default::default()
            },
            _phantom: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use refract_core::keys::{DESIRED_HASH_ANNOTATION, DESTINATION_LABEL, ORIGIN_LABEL};

    use super::*;

    fn entry(manager: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    fn provider_object() -> ObjectMeta {
        ObjectMeta {
            name: Some("cfg".into()),
            namespace: Some("apps-origin".into()),
            uid: Some("0c0ffee0-0000-0000-0000-000000000000".into()),
            resource_version: Some("42".into()),
            labels: Some(BTreeMap::from([
                (ORIGIN_LABEL.into(), "origin".into()),
                (DESTINATION_LABEL.into(), "provider".into()),
                ("app".into(), "shop".into()),
                (
                    "endpointslice.kubernetes.io/managed-by".into(),
                    "endpointslice.reflection.refract.io".into(),
                ),
            ])),
            annotations: Some(BTreeMap::from([
                (DESIRED_HASH_ANNOTATION.into(), "abc".into()),
                ("team.example.com/owner".into(), "alice".into()),
            ])),
            managed_fields: Some(vec![
                entry(
                    REMOTE_FIELD_MANAGER,
                    serde_json::json!({"f:data": {"f:k": {}}}),
                ),
                entry("kubectl-edit", serde_json::json!({"f:data": {"f:x": {}}})),
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn keeps_the_agents_own_keys_and_drops_the_rest() {
        let meta = Kept::of(&provider_object(), false).meta("apps-origin", "cfg");
        let m = meta.metadata;
        assert_eq!(m.name.as_deref(), Some("cfg"));
        assert_eq!(m.namespace.as_deref(), Some("apps-origin"));
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert_eq!(
            m.labels,
            Some(BTreeMap::from([
                (ORIGIN_LABEL.into(), "origin".into()),
                (DESTINATION_LABEL.into(), "provider".into()),
                (
                    "endpointslice.kubernetes.io/managed-by".into(),
                    "endpointslice.reflection.refract.io".into(),
                ),
            ])),
            "the agent's keys, and the label that tells a reflected slice from the provider's own"
        );
        assert_eq!(
            m.annotations,
            Some(BTreeMap::from([(
                DESIRED_HASH_ANNOTATION.into(),
                "abc".into()
            )]))
        );
        assert_eq!(m.managed_fields, None);
        assert_eq!(m.uid, None, "not read back, not kept");
    }

    #[test]
    fn keeps_the_agents_managed_fields_as_text_where_they_are_read() {
        let meta = Kept::of(&provider_object(), true).meta("apps-origin", "cfg");
        assert_eq!(
            meta.metadata.annotations,
            Some(BTreeMap::from([(
                DESIRED_HASH_ANNOTATION.into(),
                "abc".into()
            )])),
            "kept beside the fields, each in its place"
        );
        assert_eq!(meta.metadata.labels.map(|l| l.len()), Some(3));
        assert_eq!(meta.metadata.resource_version.as_deref(), Some("42"));
        let managed = meta.metadata.managed_fields.expect("kept");
        assert_eq!(managed.len(), 1, "only the agent's own entry");
        assert_eq!(managed[0].manager.as_deref(), Some(REMOTE_FIELD_MANAGER));
        let text = managed[0].fields_v1.as_ref().unwrap().0.as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(text).unwrap(),
            serde_json::json!({"f:data": {"f:k": {}}})
        );
    }

    #[test]
    fn a_namespace_has_no_namespace_and_nothing_kept_is_nothing_rebuilt() {
        let meta = Kept::of(&ObjectMeta::default(), true).meta("", "team");
        assert_eq!(meta.metadata.namespace, None);
        assert_eq!(meta.metadata.labels, None);
        assert_eq!(meta.metadata.annotations, None);
        assert_eq!(meta.metadata.managed_fields, None);
    }
}
