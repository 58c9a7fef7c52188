//! Quota room: each write stamped with what it counts for and checked against its tenant's
//! quota, and the room taken by writes the watch has not shown yet.
//!
//! The usage a write is checked against comes from the watch of tenant objects, which shows a
//! write a moment after it is done; a tenant's requests run concurrently. Each write that passes
//! its check holds its footprint here for a while, in place of what the watch has for the same
//! object, so that concurrent writes see each other and together stay within the quota.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::lock::Locked;

use super::{Applied, Applier, ApplyError, ObjectKey};
use crate::kinds::Allowed;
use crate::objects::TenantObjects;
use crate::quota::{self, Footprint, Quota};

/// How long a write's footprint stands in for the watch's: far longer than the watch takes to
/// show a write.
const HELD_FOR: Duration = Duration::from_secs(10);

impl Applier {
    /// Stamps `desired` (`size` bytes as the tenant sent it) with what it counts for under its
    /// tenant's quota, and holds that room for `key`; refuses it when the quota has none.
    pub(super) fn take_room(
        &self,
        key: &ObjectKey,
        desired: &mut serde_json::Value,
        size: usize,
    ) -> Result<(), ApplyError> {
        let quota = self.quota_of(&key.tenant);
        let footprint = quota::footprint::of(key.kind, desired, size, &quota);
        desired["metadata"]["annotations"][quota::footprint::ANNOTATION] =
            footprint.encode().into();
        self.reservations
            .reserve(&self.objects, key, &quota, footprint)?;
        Ok(())
    }

    /// What follows a write of `key`: its room given back when it failed (and its binding
    /// written again next time when the API server refused the tenant); a namespace's fences
    /// written when it passed.
    pub(super) async fn after_write(&self, key: &ObjectKey, written: &Result<Applied, ApplyError>) {
        match written {
            Err(error) => {
                self.reservations.release(key);
                // Refused as the tenant: its binding there may have been removed by hand. The
                // next write in the namespace writes it again (for the namespace's own tenant
                // only, see `tenant_namespace`).
                if matches!(error, ApplyError::Forbidden(_)) && key.kind != Allowed::Namespace {
                    self.identities.forget(&key.namespace);
                }
            }
            Ok(_) if key.kind == Allowed::Namespace => {
                // The binding is retried by the next write in the namespace (see `authorize`);
                // the quota and network fences when the namespace is sent again, at start, or
                // when the policy or the provider's networks change.
                if let Err(error) = self.write_fences(&key.tenant, &key.name).await {
                    tracing::warn!(tenant = %key.tenant, namespace = %key.name, %error, "failed to write the twin namespace's fences");
                }
            }
            Ok(_) => {}
        }
    }
}

/// The footprints of recent writes, by object.
#[derive(Default)]
pub(super) struct Reservations {
    held: Mutex<BTreeMap<ObjectKey, (Footprint, Instant)>>,
}

impl Reservations {
    /// Checks that writing `key` with footprint `new` keeps its tenant within `quota`, and if
    /// so holds `new` for it.
    pub(super) fn reserve(
        &self,
        objects: &TenantObjects,
        key: &ObjectKey,
        quota: &Quota,
        new: Footprint,
    ) -> Result<(), quota::Exceeded> {
        let now = Instant::now();
        let mut held = self.held.locked();
        let watched = |k: &ObjectKey| objects.footprint(k.kind, &k.namespace, &k.name);
        // A write the watch shows (the same footprint for its object) is counted by the watch's
        // usage from then on. Holding it for the rest of `HELD_FOR` only made every write scan
        // it: at a steady 186 writes a second, ~1,900 lookups a write, 2.4 ms of the remote
        // agent's CPU per object (BENCHMARKS.md, run 31).
        held.retain(|k, (fp, at)| now.duration_since(*at) < HELD_FOR && watched(k) != *fp);
        let mut usage = objects.usage(&key.tenant);
        for (k, (fp, _)) in held.iter().filter(|(k, _)| k.tenant == key.tenant) {
            usage.subtract(&watched(k));
            usage.add(fp);
        }
        let old = match held.get(key) {
            Some((fp, _)) => fp.clone(),
            None => watched(key),
        };
        quota::check(quota, &usage, &old, &new)?;
        held.insert(key.clone(), (new, now));
        Ok(())
    }

    /// Gives back what `key` held: its write failed, or it is deleted.
    pub(super) fn release(&self, key: &ObjectKey) {
        self.held.locked().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use refract_shared::tls::ClusterId;

    use super::*;
    use crate::kinds::Allowed;
    use crate::quota::Amount;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            tenant: ClusterId::parse("origin").unwrap(),
            kind: Allowed::ShadowPod,
            namespace: "apps-origin".into(),
            name: name.into(),
        }
    }

    fn pod() -> Footprint {
        Footprint::from_pairs([("pods".to_string(), 1000)])
    }

    #[test]
    fn writes_the_watch_has_not_shown_yet_count_against_each_other() {
        let mut quota = Quota::default();
        quota.hard.insert("pods".into(), Amount::units(2));
        let objects = TenantObjects::none();
        let held = Reservations::default();
        assert_eq!(held.reserve(&objects, &key("a"), &quota, pod()), Ok(()));
        assert_eq!(held.reserve(&objects, &key("b"), &quota, pod()), Ok(()));
        let third = held
            .reserve(&objects, &key("c"), &quota, pod())
            .unwrap_err();
        assert_eq!(third.policy_key, "quota.hard.pods");
        // Writing a again takes no more room; a failed (or deleted) b gives its room back.
        assert_eq!(held.reserve(&objects, &key("a"), &quota, pod()), Ok(()));
        held.release(&key("b"));
        assert_eq!(held.reserve(&objects, &key("c"), &quota, pod()), Ok(()));
    }

    #[test]
    fn a_write_the_watch_shows_is_held_no_longer() {
        let quota = Quota::default();
        let objects = TenantObjects::none();
        let held = Reservations::default();
        // With no store the watch shows every object as empty: a write of an empty footprint
        // is one the watch has caught up with, dropped at the next check; a pod is not.
        assert_eq!(
            held.reserve(&objects, &key("a"), &quota, Footprint::default()),
            Ok(())
        );
        assert_eq!(held.reserve(&objects, &key("b"), &quota, pod()), Ok(()));
        let keys: Vec<ObjectKey> = held.held.locked().keys().cloned().collect();
        assert_eq!(keys, vec![key("b")]);
    }
}
