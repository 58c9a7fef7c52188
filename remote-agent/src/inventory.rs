//! What a reconnecting tenant learns of what the provider holds, so it sends only what changed.
//!
//! Every object the applier writes carries the hash of the Upsert bytes that wrote it
//! ([`ORIGIN_HASH_ANNOTATION`]). When a local agent that can resume opens a stream, the session
//! takes an [`Inventory`] of the tenant's objects from the watch stores (no API request) and
//! sends one digest per kind and namespace in Welcome. The local agent compares each with the
//! digest of what it would send; only a bucket that differs costs its inventory pages
//! ([`Inventory::pages`]), and only objects that differ travel.
//!
//! Twin namespaces and token Secrets are left out: they are few and always sent.
//!
//! The inventory is taken once the tenant's previous stream has no request in flight, so no
//! write of the old stream lands after it; if the stores are not listed yet, or the old stream
//! does not drain in time, there is no inventory and the tenant sends everything, as before.

use std::collections::BTreeMap;

use kube::ResourceExt;
use refract_core::hash::bucket_digest;
use refract_core::keys::{
    DESTINATION_LABEL, ORIGIN_HASH_ANNOTATION, ORIGIN_LABEL, SERVICE_ACCOUNT_LABEL,
};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{self, BucketDigest, InventoryEntry};

use crate::kinds::Allowed;
use crate::objects::Meta;

/// Entries per Inventory page: about 60 bytes each, so a page stays far below any message limit.
pub const PAGE_ENTRIES: usize = 1000;

/// A bucket: one kind in one provider namespace.
pub type Bucket = (Allowed, String);

/// A tenant's objects by bucket, name → origin hash, as the watch saw them at one moment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Inventory {
    buckets: BTreeMap<Bucket, BTreeMap<String, String>>,
}

impl Inventory {
    /// The inventory of `tenant`'s objects among `objects` (every allowed kind's store).
    /// An object written before origin hashes existed counts with an empty hash: it differs
    /// from anything the tenant sends, so it is sent (once) again.
    pub fn of_tenant<'a>(
        tenant: &ClusterId,
        provider: &ClusterId,
        objects: impl IntoIterator<Item = (Allowed, &'a Meta)>,
    ) -> Self {
        let mut buckets: BTreeMap<Bucket, BTreeMap<String, String>> = BTreeMap::new();
        for (kind, meta) in objects {
            if !described(kind, meta, tenant, provider) {
                continue;
            }
            let hash = meta
                .annotations()
                .get(ORIGIN_HASH_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            buckets
                .entry((kind, meta.namespace().unwrap_or_default()))
                .or_default()
                .insert(meta.name_any(), hash);
        }
        Self { buckets }
    }

    /// One digest per bucket, for Welcome.
    pub fn digests(&self) -> Vec<BucketDigest> {
        self.buckets
            .iter()
            .map(|((kind, namespace), entries)| BucketDigest {
                api_version: kind.resource().api_version,
                kind: kind.kind().to_string(),
                namespace: namespace.clone(),
                count: u32::try_from(entries.len()).unwrap_or(u32::MAX),
                digest: bucket_digest(entries.iter().map(|(n, h)| (n.as_str(), h.as_str()))),
            })
            .collect()
    }

    /// Whether the bucket held `name` when the inventory was taken.
    pub fn holds(&self, bucket: &Bucket, name: &str) -> bool {
        self.buckets
            .get(bucket)
            .is_some_and(|entries| entries.contains_key(name))
    }

    /// The inventory pages of one bucket; one empty last page for a bucket that held nothing.
    pub fn pages(&self, bucket: &Bucket) -> Vec<proto::Inventory> {
        let (kind, namespace) = bucket;
        let page = |entries: Vec<InventoryEntry>| proto::Inventory {
            api_version: kind.resource().api_version,
            kind: kind.kind().to_string(),
            namespace: namespace.clone(),
            entries,
            last: false,
        };
        let mut entries = self
            .buckets
            .get(bucket)
            .into_iter()
            .flatten()
            .map(|(name, hash)| InventoryEntry {
                name: name.clone(),
                origin_hash: hash.clone(),
            })
            .peekable();
        let mut pages = Vec::new();
        loop {
            let mut next = page(entries.by_ref().take(PAGE_ENTRIES).collect());
            next.last = entries.peek().is_none();
            let last = next.last;
            pages.push(next);
            if last {
                return pages;
            }
        }
    }

    /// How many objects the inventory describes.
    pub fn objects(&self) -> usize {
        self.buckets.values().map(BTreeMap::len).sum()
    }
}

/// Whether an object is one the inventory describes: the tenant's, for this provider, not
/// being deleted, and neither a twin namespace nor a token Secret.
fn described(kind: Allowed, meta: &Meta, tenant: &ClusterId, provider: &ClusterId) -> bool {
    let labels = meta.labels();
    kind != Allowed::Namespace
        && labels.get(ORIGIN_LABEL).map(String::as_str) == Some(tenant.as_str())
        && labels.get(DESTINATION_LABEL).map(String::as_str) == Some(provider.as_str())
        && meta.metadata.deletion_timestamp.is_none()
        && !(kind == Allowed::Reflected(Kind::Secret) && labels.contains_key(SERVICE_ACCOUNT_LABEL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn meta(namespace: &str, name: &str, origin: &str, hash: Option<&str>) -> Meta {
        let mut labels = BTreeMap::from([
            (ORIGIN_LABEL.to_string(), origin.to_string()),
            (DESTINATION_LABEL.to_string(), "provider".to_string()),
        ]);
        if name.starts_with("token-") {
            labels.insert(SERVICE_ACCOUNT_LABEL.into(), "default".into());
        }
        let annotations =
            hash.map(|h| BTreeMap::from([(ORIGIN_HASH_ANNOTATION.to_string(), h.to_string())]));
        Meta {
            types: None,
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                labels: Some(labels),
                annotations,
                ..Default::default()
            },
            _phantom: Default::default(),
        }
    }

    fn id(s: &str) -> ClusterId {
        ClusterId::parse(s).unwrap()
    }

    const CM: Allowed = Allowed::Reflected(Kind::ConfigMap);
    const SECRET: Allowed = Allowed::Reflected(Kind::Secret);

    #[test]
    fn describes_only_the_tenants_objects_by_bucket() {
        let mut terminating = meta("a", "going", "origin", Some("h"));
        terminating.metadata.deletion_timestamp = Some(Time(Default::default()));
        let objects = [
            (CM, meta("a", "one", "origin", Some("h1"))),
            (CM, meta("a", "two", "origin", None)),
            (CM, meta("b", "one", "origin", Some("h3"))),
            (CM, meta("a", "theirs", "other", Some("h4"))),
            (CM, terminating),
            (SECRET, meta("a", "token-x", "origin", Some("h5"))),
            (SECRET, meta("a", "plain", "origin", Some("h6"))),
            (Allowed::Namespace, meta("", "a", "origin", Some("h7"))),
        ];
        let inventory = Inventory::of_tenant(
            &id("origin"),
            &id("provider"),
            objects.iter().map(|(k, m)| (*k, m)),
        );
        assert_eq!(inventory.objects(), 4);
        let digests = inventory.digests();
        let shown: Vec<_> = digests
            .iter()
            .map(|d| (d.kind.as_str(), d.namespace.as_str(), d.count))
            .collect();
        assert_eq!(
            shown,
            [
                ("ConfigMap", "a", 2),
                ("ConfigMap", "b", 1),
                ("Secret", "a", 1)
            ]
        );
        // The digest is the one a local agent computes over what it sends.
        assert_eq!(
            digests[0].digest,
            bucket_digest([("one", "h1"), ("two", "")])
        );
        assert!(inventory.holds(&(CM, "a".into()), "two"));
        assert!(!inventory.holds(&(CM, "a".into()), "going"));
        assert!(!inventory.holds(&(SECRET, "a".into()), "token-x"));
    }

    #[test]
    fn pages_cover_a_bucket_once_and_mark_the_last() {
        let objects: Vec<_> = (0..2500)
            .map(|i| (CM, meta("a", &format!("cm-{i:05}"), "origin", Some("h"))))
            .chain((0..1000).map(|i| (CM, meta("b", &format!("cm-{i}"), "origin", Some("h")))))
            .collect();
        let inventory = Inventory::of_tenant(
            &id("origin"),
            &id("provider"),
            objects.iter().map(|(k, m)| (*k, m)),
        );
        let pages = inventory.pages(&(CM, "a".into()));
        let sizes: Vec<_> = pages.iter().map(|p| (p.entries.len(), p.last)).collect();
        assert_eq!(sizes, [(1000, false), (1000, false), (500, true)]);
        assert_eq!(pages[2].entries.last().unwrap().name, "cm-02499");
        let full = inventory.pages(&(CM, "b".into()));
        assert_eq!(
            (full.len(), full[0].entries.len(), full[0].last),
            (1, 1000, true)
        );
        let empty = inventory.pages(&(SECRET, "a".into()));
        assert_eq!(empty.len(), 1);
        assert!(empty[0].last && empty[0].entries.is_empty());
    }
}
