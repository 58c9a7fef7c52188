//! Noticing that someone keeps undoing this agent's entry of a NamespaceOffloading status.
//!
//! Each local agent owns its peer's entry of the status (its own field manager). The entry is
//! written only when the status does not read as the agent wants, so writing the very same
//! entry again and again means another writer keeps changing it. The one such writer Refract
//! knows is a second local agent peered with the same provider from the same origin: both
//! own the entry of that provider, their views differ, and they would answer each other for
//! ever (BENCHMARKS.md, run 21 D). The agent says so instead of fighting silently.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::crd::RemoteNamespaceCondition;

/// Rewrites of an unchanged entry within [`WINDOW`] that count as a fight.
const THRESHOLD: u32 = 10;
/// How far back rewrites are counted.
const WINDOW: Duration = Duration::from_secs(60);
/// How often one namespace's fight is reported again.
const REPORT_EVERY: Duration = Duration::from_secs(600);

/// The entry this agent last wrote per namespace, and how often it wrote it unchanged.
#[derive(Debug, Default)]
pub(super) struct Rewrites {
    by_namespace: HashMap<String, Streak>,
}

#[derive(Debug)]
struct Streak {
    entry: Vec<RemoteNamespaceCondition>,
    rewrites: u32,
    since: Instant,
    reported: Option<Instant>,
}

impl Rewrites {
    /// Records that the agent writes `entry` for `namespace` at `now`; returns how many times
    /// it wrote the same entry within the window, when that is a fight not yet reported
    /// lately.
    pub(super) fn record(
        &mut self,
        namespace: &str,
        entry: &[RemoteNamespaceCondition],
        now: Instant,
    ) -> Option<u32> {
        let streak = self
            .by_namespace
            .entry(namespace.to_string())
            .or_insert_with(|| Streak {
                entry: entry.to_vec(),
                rewrites: 0,
                since: now,
                reported: None,
            });
        if streak.entry != entry || now.duration_since(streak.since) > WINDOW {
            streak.entry = entry.to_vec();
            streak.rewrites = 0;
            streak.since = now;
            return None;
        }
        streak.rewrites += 1;
        let due = streak
            .reported
            .is_none_or(|at| now.duration_since(at) >= REPORT_EVERY);
        if streak.rewrites >= THRESHOLD && due {
            streak.reported = Some(now);
            return Some(streak.rewrites);
        }
        None
    }

    /// Forgets namespaces no longer written.
    pub(super) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_namespace.retain(|ns, _| keep(ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(reason: &str) -> Vec<RemoteNamespaceCondition> {
        vec![RemoteNamespaceCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: reason.into(),
            message: String::new(),
        }]
    }

    #[test]
    fn the_same_entry_written_again_and_again_is_reported_once() {
        let mut rewrites = Rewrites::default();
        let start = Instant::now();
        let ready = entry("NamespaceCreated");
        let mut reports = Vec::new();
        for i in 0..40 {
            let now = start + Duration::from_millis(500 * i);
            reports.extend(rewrites.record("shop", &ready, now));
        }
        assert_eq!(reports, vec![THRESHOLD]);
        // Ten minutes on, still fighting: reported again.
        let later = start + REPORT_EVERY + Duration::from_secs(20);
        let again: Vec<_> = (0..=THRESHOLD)
            .filter_map(|i| {
                rewrites.record("shop", &ready, later + Duration::from_millis(u64::from(i)))
            })
            .collect();
        assert_eq!(again.len(), 1);
    }

    #[test]
    fn entries_that_change_or_come_slowly_are_not_a_fight() {
        let mut rewrites = Rewrites::default();
        let start = Instant::now();
        for i in 0..40u64 {
            let reason = if i % 2 == 0 {
                "Creating"
            } else {
                "NamespaceCreated"
            };
            let now = start + Duration::from_millis(100 * i);
            assert_eq!(rewrites.record("shop", &entry(reason), now), None);
        }
        let ready = entry("NamespaceCreated");
        for i in 0..40u64 {
            // One rewrite every 7 s: never ten within a minute.
            let now = start + Duration::from_secs(10 + 7 * i);
            assert_eq!(rewrites.record("other", &ready, now), None);
        }
    }
}
