//! Quota room taken by writes the watch has not shown yet.
//!
//! The usage a write is checked against comes from the watch of tenant objects, which shows a
//! write a moment after it is done; a tenant's requests run concurrently. Each write that passes
//! its check holds its footprint here for a while, in place of what the watch has for the same
//! object, so that concurrent writes see each other and together stay within the quota.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::lock::Locked;

use super::ObjectKey;
use crate::objects::TenantObjects;
use crate::quota::{self, Footprint, Quota};

/// How long a write's footprint stands in for the watch's: far longer than the watch takes to
/// show a write.
const HELD_FOR: Duration = Duration::from_secs(10);

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
        held.retain(|_, (_, at)| now.duration_since(*at) < HELD_FOR);
        let watched = |k: &ObjectKey| objects.footprint(k.kind, &k.namespace, &k.name);
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
