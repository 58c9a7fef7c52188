//! What each tenant's current session already has, for the level-triggered streams back to
//! the origin (pod status, volumes): an object is sent again only when it changed or when a
//! new session has not had it yet.

use std::collections::{HashMap, HashSet};

/// Object UID → (session id, hash) of what was last delivered.
#[derive(Default)]
pub struct Delivered {
    sent: HashMap<String, (String, String)>,
}

impl Delivered {
    /// Whether session `session` already has exactly `hash` for `uid`.
    pub fn has(&self, uid: &str, session: &str, hash: &str) -> bool {
        self.sent
            .get(uid)
            .is_some_and(|(s, h)| s == session && h == hash)
    }

    /// Records that `session` got `hash` for `uid`.
    pub fn record(&mut self, uid: String, session: String, hash: String) {
        self.sent.insert(uid, (session, hash));
    }

    /// Forgets objects that no longer exist.
    pub fn retain(&mut self, live: &HashSet<String>) {
        self.sent.retain(|uid, _| live.contains(uid));
    }
}
