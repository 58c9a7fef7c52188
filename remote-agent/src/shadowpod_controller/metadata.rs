//! Labels and annotations of a running pod, kept equal to its ShadowPod's.
//!
//! A pod's spec is frozen once it runs (as in Liqo), but its labels and annotations follow
//! the origin pod's: a Service selecting on a label the origin adds later must find the
//! provider pod too. Keys are set and changed as the ShadowPod says; a key is removed only if
//! this controller set it (read from the pod's managed fields), so what others on the provider
//! add to the pod stays.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use refract_core::keys::SHADOWPOD_FIELD_MANAGER;

use super::provider_pod::ProviderPod;
use crate::packed_strs::{PackedStrs, Pairs};

/// The merge patch that brings `pod`'s labels and annotations to `desired`'s, or `None` when
/// they agree already.
pub fn metadata_patch(pod: &ProviderPod, desired: &ObjectMeta) -> Option<serde_json::Value> {
    let ours = &pod.owned;
    let kept = pod.meta();
    let labels = map_patch(kept.labels(), desired.labels.as_ref(), &ours.labels);
    let annotations = map_patch(
        kept.annotations(),
        desired.annotations.as_ref(),
        &ours.annotations,
    );
    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut metadata = serde_json::Map::new();
    if !labels.is_empty() {
        metadata.insert("labels".into(), labels.into());
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), annotations.into());
    }
    Some(serde_json::json!({ "metadata": metadata }))
}

/// Sets what `desired` has and `current` lacks or holds otherwise; removes (null) what this
/// controller set and `desired` no longer has.
fn map_patch(
    current: Pairs<'_>,
    desired: Option<&BTreeMap<String, String>>,
    ours: &Keys,
) -> serde_json::Map<String, serde_json::Value> {
    let empty = BTreeMap::new();
    let desired = desired.unwrap_or(&empty);
    let mut patch = serde_json::Map::new();
    for (k, v) in desired {
        if current.get(k) != Some(v.as_str()) {
            patch.insert(k.clone(), v.clone().into());
        }
    }
    for (k, _) in current.iter() {
        if !desired.contains_key(k) && ours.contains(k) {
            patch.insert(k.to_string(), serde_json::Value::Null);
        }
    }
    patch
}

/// Where a managedFields entry's `f:metadata` lists the label and annotation keys it owns.
const OWNED_MAPS: [&str; 2] = ["f:labels", "f:annotations"];

/// Label and annotation keys the controller's field manager owns on a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    labels: Keys,
    annotations: Keys,
}

/// Keys, sorted. Kept with every provider pod of a ShadowPod, and only asked whether they hold
/// a key: packed, they cost their bytes and 4 more each, where a `BTreeSet<String>` cost a node
/// of about 280 bytes however few keys it held (0.7 KB a pod for the two, in a heap profile at
/// 2,000 pods).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Keys(PackedStrs);

impl Keys {
    fn contains(&self, key: &str) -> bool {
        self.0.find_sorted(0, self.0.len(), 1, key).is_some()
    }
}

impl From<BTreeSet<&str>> for Keys {
    fn from(keys: BTreeSet<&str>) -> Self {
        Self(keys.into_iter().collect())
    }
}

/// The label and annotation keys the controller's field manager owns, from `metadata`'s
/// managedFields. Read once as the watch hands a pod over; the managedFields themselves are
/// not kept (the other managers' entries, the scheduler's and the kubelet's, are the largest
/// part of a pod in memory).
pub fn owned_keys(metadata: &ObjectMeta) -> Owned {
    let (mut labels, mut annotations) = (BTreeSet::new(), BTreeSet::new());
    for entry in metadata.managed_fields.iter().flatten() {
        if entry.manager.as_deref() != Some(SHADOWPOD_FIELD_MANAGER) {
            continue;
        }
        let Some(fields) = entry.fields_v1.as_ref() else {
            continue;
        };
        let metadata = fields.0.get("f:metadata");
        for (name, set) in OWNED_MAPS.into_iter().zip([&mut labels, &mut annotations]) {
            let keys = metadata
                .and_then(|m| m.get(name))
                .and_then(|l| l.as_object());
            for key in keys.into_iter().flat_map(|m| m.keys()) {
                if let Some(key) = key.strip_prefix("f:") {
                    set.insert(key);
                }
            }
        }
    }
    Owned {
        labels: labels.into(),
        annotations: annotations.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_pod(labels: &[(&str, &str)], owned: &[&str], other: &[&str]) -> ProviderPod {
        let fields = |keys: &[&str]| {
            let labels: serde_json::Map<String, serde_json::Value> = keys
                .iter()
                .map(|k| (format!("f:{k}"), serde_json::json!({})))
                .collect();
            serde_json::json!({"f:metadata": {"f:labels": labels}})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web",
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                "managedFields": [
                    {"manager": SHADOWPOD_FIELD_MANAGER, "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": fields(owned)},
                    {"manager": "someone-else", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": fields(other)},
                ],
            }
        }))
        .map(ProviderPod::new)
        .unwrap()
    }

    fn mk_desired(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn changed_and_new_keys_are_set_and_our_dropped_keys_removed() {
        let pod = mk_pod(
            &[
                ("app", "web"),
                ("tier", "a"),
                ("gone", "x"),
                ("theirs", "y"),
            ],
            &["app", "tier", "gone"],
            &["theirs"],
        );
        let desired = mk_desired(&[("app", "web"), ("tier", "b"), ("new", "z")]);
        let patch = metadata_patch(&pod, &desired).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"labels": {"tier": "b", "new": "z", "gone": null}}})
        );
    }

    #[test]
    fn nothing_to_do_when_they_agree() {
        let pod = mk_pod(&[("app", "web"), ("theirs", "y")], &["app"], &["theirs"]);
        assert!(metadata_patch(&pod, &mk_desired(&[("app", "web")])).is_none());
    }

    #[test]
    fn only_the_controllers_own_keys_are_kept_of_the_managed_fields() {
        let pod = mk_pod(
            &[("app", "web"), ("gone", "x"), ("theirs", "y")],
            &["app", "gone"],
            &["theirs"],
        );
        assert_eq!(
            pod.owned,
            Owned {
                labels: BTreeSet::from(["app", "gone"]).into(),
                annotations: Keys::default(),
            }
        );
    }
}
