//! What one stream listed: the names it upserted and has not deleted since, by kind and
//! namespace. A SnapshotComplete keeps these and removes the tenant's other objects of the
//! kind in the namespace ([`super::TenantSession::collect_orphans`]).
//!
//! The listing is bounded: past `limit` names it is dropped, and from then on it holds every
//! name, so that no orphan collection ever runs on a partial view.

use std::collections::{BTreeMap, BTreeSet};

use crate::kinds::Allowed;

/// Names upserted on a stream, by kind and namespace.
#[derive(Debug)]
pub(super) struct Listing {
    /// `None` once over the limit.
    names: Option<BTreeMap<(Allowed, String), BTreeSet<String>>>,
    count: usize,
    limit: usize,
}

impl Listing {
    /// An empty listing that keeps up to `limit` names.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            names: Some(BTreeMap::new()),
            count: 0,
            limit,
        }
    }

    /// Records an Upsert (`present`) or a Delete of `name`. True when this record took the
    /// listing over its limit.
    pub(super) fn record(
        &mut self,
        kind: Allowed,
        namespace: &str,
        name: &str,
        present: bool,
    ) -> bool {
        let Some(names) = self.names.as_mut() else {
            return false;
        };
        let key = (kind, namespace.to_string());
        if present {
            if names.entry(key).or_default().insert(name.to_string()) {
                self.count += 1;
            }
        } else if let Some(listed) = names.get_mut(&key) {
            // A Delete never adds an entry: deletes naming ever new namespaces cost nothing.
            if listed.remove(name) {
                self.count -= 1;
            }
        }
        if self.count > self.limit {
            self.names = None;
            return true;
        }
        false
    }

    /// Whether `name` is kept by a snapshot of `kind` in `namespace`: listed, or anything once
    /// the listing overflowed.
    pub(super) fn holds(&self, kind: Allowed, namespace: &str, name: &str) -> bool {
        self.names.as_ref().is_none_or(|names| {
            names
                .get(&(kind, namespace.to_string()))
                .is_some_and(|listed| listed.contains(name))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_core::options::Kind;

    const CM: Allowed = Allowed::Reflected(Kind::ConfigMap);
    const SECRET: Allowed = Allowed::Reflected(Kind::Secret);

    #[test]
    fn a_snapshot_keeps_what_was_upserted_in_its_kind_and_namespace_only() {
        let mut listing = Listing::new(10);
        listing.record(CM, "shop", "a", true);
        assert!(listing.holds(CM, "shop", "a"));
        assert!(!listing.holds(CM, "shop", "b"));
        assert!(!listing.holds(SECRET, "shop", "a"));
        assert!(!listing.holds(CM, "other", "a"));
    }

    #[test]
    fn a_delete_after_the_upsert_lets_the_snapshot_remove_the_object() {
        let mut listing = Listing::new(10);
        listing.record(CM, "shop", "a", true);
        listing.record(CM, "shop", "a", false);
        assert!(!listing.holds(CM, "shop", "a"));
        listing.record(CM, "shop", "a", true);
        assert!(listing.holds(CM, "shop", "a"));
    }

    #[test]
    fn deletes_and_repeated_upserts_do_not_count_towards_the_limit() {
        let mut listing = Listing::new(2);
        for namespace in ["a", "b", "c", "d"] {
            assert!(!listing.record(CM, namespace, "x", false));
        }
        for _ in 0..5 {
            assert!(!listing.record(CM, "shop", "same", true));
        }
        assert!(!listing.record(CM, "shop", "second", true));
        assert!(!listing.holds(CM, "shop", "never-sent"));
    }

    #[test]
    fn past_its_limit_the_listing_keeps_everything_so_no_collection_runs_on_a_partial_view() {
        let mut listing = Listing::new(2);
        assert!(!listing.record(CM, "shop", "a", true));
        assert!(!listing.record(CM, "shop", "b", true));
        assert!(
            listing.record(CM, "shop", "c", true),
            "the overflow is reported once"
        );
        assert!(!listing.record(CM, "shop", "d", true));
        assert!(listing.holds(CM, "shop", "never-sent"));
        assert!(listing.holds(SECRET, "elsewhere", "anything"));
    }
}
