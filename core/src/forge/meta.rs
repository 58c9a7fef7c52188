//! Metadata shared by every reflected object.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Context, ForgeError};
use crate::keys::{DESTINATION_LABEL, ORIGIN_LABEL};

/// The provider object's metadata: `name` in the twin namespace, the origin's labels and
/// annotations minus the skip lists, plus the origin and destination labels. Everything the
/// origin's API server owns (uid, resourceVersion, owner references, managed fields, ...) is
/// left out: it means nothing on the provider.
pub fn remote_meta(local: &ObjectMeta, name: &str, ctx: &Context<'_>) -> ObjectMeta {
    let o = ctx.options;
    let mut labels: BTreeMap<String, String> = local
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !o.skip_labels.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(ORIGIN_LABEL.into(), o.local_cluster_id.clone());
    labels.insert(DESTINATION_LABEL.into(), o.remote_cluster_id.clone());
    let annotations: BTreeMap<String, String> = local
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !o.skip_annotations.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ctx.remote_namespace.to_string()),
        labels: Some(labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..Default::default()
    }
}

/// The object's name, or an error naming the kind.
pub fn name_of<'m>(meta: &'m ObjectMeta, kind: &'static str) -> Result<&'m str, ForgeError> {
    meta.name.as_deref().ok_or(ForgeError::Unnamed(kind))
}
