//! Provider pod statuses that arrive before their pod was sent on the session.
//!
//! When a session starts, the remote agent sends every pod's status at once, while this
//! agent's producers are still sending (or resuming) the pods; a status for a pod the session
//! has not been sent yet cannot be checked against what was offloaded. The remote agent sends
//! a status once per session unless it changes, so dropping it would leave the origin pod
//! stale (a restart count, a phase) until the pod next changes on the provider. Such statuses
//! wait here until the pod's Upsert is answered, then go through the same admission check.
//! What the provider sends here is bounded in count, bytes and age: a status for a pod this
//! agent never offloads is dropped (and counted refused) when it expires or is pushed out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use refract_shared::proto::PodStatus;

/// How long a status may wait for its pod's Upsert to be answered.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// The most statuses held at once.
const MAX_HELD: usize = 4096;
/// The most status bytes held at once.
const MAX_BYTES: usize = 8 * 1024 * 1024;

/// Statuses waiting for their pod, the latest per origin UID.
#[derive(Default)]
pub struct Early {
    held: HashMap<String, (Instant, PodStatus)>,
    bytes: usize,
}

impl Early {
    /// Holds `status` (replacing an older one of the same pod); returns how many held
    /// statuses were dropped to make room or because they waited too long.
    pub fn hold(&mut self, status: PodStatus, now: Instant) -> usize {
        let mut dropped = self.expire(now);
        self.remove(&status.origin_uid);
        if status.status_json.len() > MAX_BYTES {
            return dropped + 1;
        }
        while !self.held.is_empty()
            && (self.held.len() >= MAX_HELD || self.bytes + status.status_json.len() > MAX_BYTES)
        {
            let oldest = self
                .held
                .iter()
                .min_by_key(|(_, (since, _))| *since)
                .map(|(uid, _)| uid.clone())
                .expect("not empty");
            self.remove(&oldest);
            dropped += 1;
        }
        self.bytes += status.status_json.len();
        self.held.insert(status.origin_uid.clone(), (now, status));
        dropped
    }

    /// The status waiting for the pod with origin UID `uid`, if it has not waited too long.
    pub fn take(&mut self, uid: &str, now: Instant) -> Option<PodStatus> {
        let (since, status) = self.remove(uid)?;
        (now.duration_since(since) <= MAX_WAIT).then_some(status)
    }

    /// Drops the statuses that waited too long; returns how many.
    fn expire(&mut self, now: Instant) -> usize {
        let old: Vec<String> = self
            .held
            .iter()
            .filter(|(_, (since, _))| now.duration_since(*since) > MAX_WAIT)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &old {
            self.remove(uid);
        }
        old.len()
    }

    fn remove(&mut self, uid: &str) -> Option<(Instant, PodStatus)> {
        let removed = self.held.remove(uid)?;
        self.bytes -= removed.1.status_json.len();
        Some(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(uid: &str, bytes: usize) -> PodStatus {
        PodStatus {
            origin_uid: uid.into(),
            status_json: vec![b' '; bytes],
            ..Default::default()
        }
    }

    #[test]
    fn a_held_status_is_taken_once_and_the_latest_wins() {
        let mut early = Early::default();
        let now = Instant::now();
        assert_eq!(early.hold(status("a", 10), now), 0);
        assert_eq!(early.hold(status("a", 20), now), 0);
        assert_eq!(early.take("a", now).unwrap().status_json.len(), 20);
        assert!(early.take("a", now).is_none());
        assert_eq!(early.bytes, 0);
    }

    #[test]
    fn a_status_that_waited_too_long_is_not_taken_and_is_dropped_on_the_next_hold() {
        let mut early = Early::default();
        let then = Instant::now();
        early.hold(status("a", 10), then);
        early.hold(status("b", 10), then);
        let later = then + MAX_WAIT + Duration::from_secs(1);
        assert!(early.take("a", later).is_none());
        assert_eq!(early.hold(status("c", 10), later), 1, "b expired");
        assert_eq!(early.held.len(), 1);
        assert_eq!(early.bytes, 10);
    }

    #[test]
    fn the_oldest_make_room_when_the_bytes_are_used_up() {
        let mut early = Early::default();
        let t = Instant::now();
        let big = MAX_BYTES / 2;
        early.hold(status("a", big), t);
        early.hold(status("b", big), t + Duration::from_millis(1));
        assert_eq!(early.hold(status("c", 1), t + Duration::from_millis(2)), 1);
        assert!(early.take("a", t).is_none(), "the oldest went");
        assert!(early.take("b", t).is_some());
        assert!(early.take("c", t).is_some());
    }

    #[test]
    fn the_count_is_bounded() {
        let mut early = Early::default();
        let t = Instant::now();
        let mut dropped = 0;
        for i in 0..MAX_HELD + 10 {
            dropped += early.hold(
                status(&i.to_string(), 1),
                t + Duration::from_micros(i as u64),
            );
        }
        assert_eq!(dropped, 10);
        assert_eq!(early.held.len(), MAX_HELD);
        assert!(early.take("0", t).is_none());
    }
}
