//! Resuming a session: sending the provider only what changed while the link was down.
//!
//! On every new session the producers send everything (each kind's objects of a namespace,
//! then SnapshotComplete). When Welcome described what the provider holds (one digest per
//! kind and namespace, see the remote agent's `inventory` module), the messages of each
//! described bucket are held here instead of sent. At the bucket's SnapshotComplete the digest
//! of what the producers would send is compared with the provider's:
//!
//! - equal: nothing travels; each held Upsert is answered locally as Unchanged (what the
//!   remote agent would have said), and no orphan collection is needed.
//! - different: the bucket's inventory (name and hash of each object) is asked for; then only
//!   the Upserts whose hash differs travel, a Delete for each object the provider holds and
//!   the origin no longer wants, and a SnapshotComplete marked `resumed`.
//!
//! A bucket the producers do not finish within [`HOLD_LIMIT`] (or whose inventory does not
//! come) is sent in full, as without resuming. Namespaces and token Secrets are never held:
//! the remote agent does not describe them.
//!
//! This module is the pure core; `link` feeds it the session's messages and carries out its
//! [`Step`]s.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use prost::Message;
use refract_core::hash::{bucket_digest, bytes_hash};
use refract_wire::proto::{
    local_message, Ack, BucketDigest, Delete, Inventory, InventoryRequest, LocalMessage, ObjectRef,
    Outcome, SnapshotComplete, Upsert,
};

/// How long a described bucket may be held before it is sent in full.
pub const HOLD_LIMIT: Duration = Duration::from_secs(30);

/// The most entries one bucket's inventory may have, whatever Welcome announced; the remote
/// agent keeps at most 200,000 names per stream.
pub const MAX_INVENTORY: usize = 250_000;

/// The message of an Upsert answered locally.
pub const UNCHANGED_MESSAGE: &str = "unchanged on the provider since the last session";

/// What the link does next.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Send this on the stream.
    Send(LocalMessage),
    /// Hand this ack to the producers, as if the remote agent had sent it.
    Ack(Ack),
}

/// What resuming saved and cost so far on one session.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Tally {
    /// Upserts answered locally.
    pub skipped_objects: u64,
    /// Their encoded size.
    pub skipped_bytes: u64,
    /// Buckets found equal to the provider's.
    pub equal: u64,
    /// Buckets found different, whose inventory was asked for.
    pub different: u64,
    /// Buckets sent in full after [`HOLD_LIMIT`] or a bad inventory.
    pub expired: u64,
}

/// A kind (apiVersion, kind) in a provider namespace.
type BucketKey = (String, String, String);

/// A described bucket not settled yet.
struct Held {
    /// What the provider holds, per Welcome.
    digest: String,
    count: usize,
    /// The latest Upsert of each object since the session began.
    upserts: BTreeMap<String, Upsert>,
    /// When the first message of the bucket was held.
    since: Option<Instant>,
    /// The inventory asked for (after a different digest), as its pages arrive.
    inventory: Option<BTreeMap<String, String>>,
}

/// The resume state of one session.
pub struct Resume {
    held: HashMap<BucketKey, Held>,
    /// When the session began: a described bucket the producers never touch (a namespace no
    /// longer extended) is let go [`HOLD_LIMIT`] after.
    began: Instant,
    tally: Tally,
}

impl Resume {
    /// A session begun at `began` whose Welcome described `buckets`; with none, every message
    /// passes.
    pub fn new(buckets: Vec<BucketDigest>, began: Instant) -> Self {
        let held = buckets
            .into_iter()
            .map(|b| {
                let key = (b.api_version, b.kind, b.namespace);
                let held = Held {
                    digest: b.digest,
                    count: b.count as usize,
                    upserts: BTreeMap::new(),
                    since: None,
                    inventory: None,
                };
                (key, held)
            })
            .collect();
        Self {
            held,
            began,
            tally: Tally::default(),
        }
    }

    /// What resuming saved so far.
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// Buckets still held.
    pub fn pending(&self) -> usize {
        self.held.len()
    }

    /// A message a producer sent.
    pub fn outgoing(&mut self, message: LocalMessage, now: Instant) -> Vec<Step> {
        use local_message::Kind;
        // Once every bucket is settled (most of a session's life), messages just pass.
        if self.held.is_empty() {
            return vec![Step::Send(message)];
        }
        let key = match &message.kind {
            Some(Kind::Upsert(Upsert {
                object: Some(o), ..
            }))
            | Some(Kind::Delete(Delete {
                object: Some(o), ..
            })) => key_of(o),
            Some(Kind::SnapshotComplete(s)) => {
                (s.api_version.clone(), s.kind.clone(), s.namespace.clone())
            }
            _ => return vec![Step::Send(message)],
        };
        let Some(held) = self.held.get_mut(&key) else {
            return vec![Step::Send(message)];
        };
        held.since.get_or_insert(now);
        match message.kind {
            Some(Kind::Upsert(upsert)) => {
                let name = upsert.object.as_ref().map(|o| o.name.clone());
                held.upserts.insert(name.unwrap_or_default(), upsert);
                Vec::new()
            }
            Some(Kind::Delete(delete)) => {
                // Never held: the Upsert it follows is dropped, so nothing resurrects it.
                if let Some(o) = &delete.object {
                    held.upserts.remove(&o.name);
                }
                vec![Step::Send(LocalMessage {
                    kind: Some(Kind::Delete(delete)),
                })]
            }
            Some(Kind::SnapshotComplete(_)) if held.inventory.is_some() => Vec::new(),
            Some(Kind::SnapshotComplete(_)) => self.snapshot_complete(key),
            // Not a bucket message (the match above let none through): it passes.
            kind => vec![Step::Send(LocalMessage { kind })],
        }
    }

    /// The producers finished a described bucket: compare digests.
    fn snapshot_complete(&mut self, key: BucketKey) -> Vec<Step> {
        let Some(held) = self.held.get_mut(&key) else {
            return Vec::new();
        };
        let hashes: Vec<(String, String)> = held
            .upserts
            .iter()
            .map(|(name, u)| (name.clone(), bytes_hash(&u.object_json)))
            .collect();
        let local = bucket_digest(hashes.iter().map(|(n, h)| (n.as_str(), h.as_str())));
        if local == held.digest {
            self.tally.equal += 1;
            let upserts = self.held.remove(&key).map(|held| held.upserts);
            return upserts
                .unwrap_or_default()
                .into_values()
                .map(|u| self.answer_locally(u))
                .collect();
        }
        self.tally.different += 1;
        held.inventory = Some(BTreeMap::new());
        let (api_version, kind, namespace) = key;
        vec![Step::Send(LocalMessage {
            kind: Some(local_message::Kind::InventoryRequest(InventoryRequest {
                api_version,
                kind,
                namespace,
            })),
        })]
    }

    /// A page of an inventory asked for. Pages nobody asked for are ignored; an inventory
    /// larger than Welcome announced gives up resuming that bucket.
    pub fn inventory(&mut self, page: Inventory) -> Vec<Step> {
        let key = (page.api_version, page.kind, page.namespace);
        let Some(held) = self.held.get_mut(&key) else {
            return Vec::new();
        };
        let Some(inventory) = held.inventory.as_mut() else {
            return Vec::new();
        };
        // Names are Kubernetes names, hashes 32 hex characters: anything else is not an
        // inventory this agent can use.
        let sane = page
            .entries
            .iter()
            .all(|e| e.name.len() <= 253 && e.origin_hash.len() <= 64);
        for entry in page.entries {
            inventory.insert(entry.name, entry.origin_hash);
        }
        if !sane || inventory.len() > held.count.min(MAX_INVENTORY) {
            tracing::warn!(kind = %key.1, namespace = %key.2, announced = held.count, "the provider's inventory is larger than announced or malformed; sending the bucket in full");
            return self.send_in_full(key);
        }
        if !page.last {
            return Vec::new();
        }
        let Some(held) = self.held.remove(&key) else {
            return Vec::new();
        };
        let inventory = held.inventory.unwrap_or_default();
        let mut steps = Vec::new();
        for (name, upsert) in &held.upserts {
            if inventory.get(name) == Some(&bytes_hash(&upsert.object_json)) {
                steps.push(self.answer_locally(upsert.clone()));
            } else {
                steps.push(send(local_message::Kind::Upsert(upsert.clone())));
            }
        }
        let (api_version, kind, namespace) = key;
        for name in inventory.keys() {
            if !held.upserts.contains_key(name) {
                steps.push(send(local_message::Kind::Delete(Delete {
                    object: Some(ObjectRef {
                        api_version: api_version.clone(),
                        kind: kind.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    }),
                    revision: String::new(),
                    grace_period_seconds: None,
                })));
            }
        }
        steps.push(send(local_message::Kind::SnapshotComplete(
            SnapshotComplete {
                api_version,
                kind,
                namespace,
                resumed: true,
            },
        )));
        steps
    }

    /// Buckets held past [`HOLD_LIMIT`], sent in full (nothing, for one never touched).
    pub fn expire(&mut self, now: Instant) -> Vec<Step> {
        let due: Vec<BucketKey> = self
            .held
            .iter()
            .filter(|(_, h)| now.duration_since(h.since.unwrap_or(self.began)) >= HOLD_LIMIT)
            .map(|(k, _)| k.clone())
            .collect();
        due.into_iter()
            .flat_map(|key| {
                tracing::info!(kind = %key.1, namespace = %key.2, "bucket not settled in time; sending it in full");
                self.tally.expired += 1;
                self.send_in_full(key)
            })
            .collect()
    }

    /// When [`Resume::expire`] has something to do next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held
            .values()
            .map(|h| h.since.unwrap_or(self.began))
            .min()
            .map(|s| s + HOLD_LIMIT)
    }

    /// Sends what is held of a bucket as a plain listing: every Upsert, then SnapshotComplete
    /// if the producers finished it; later messages of the bucket pass.
    fn send_in_full(&mut self, key: BucketKey) -> Vec<Step> {
        let Some(held) = self.held.remove(&key) else {
            return Vec::new();
        };
        let finished = held.inventory.is_some();
        let mut steps: Vec<Step> = held
            .upserts
            .into_values()
            .map(|u| send(local_message::Kind::Upsert(u)))
            .collect();
        if finished {
            let (api_version, kind, namespace) = key;
            steps.push(send(local_message::Kind::SnapshotComplete(
                SnapshotComplete {
                    api_version,
                    kind,
                    namespace,
                    resumed: false,
                },
            )));
        }
        steps
    }

    fn answer_locally(&mut self, upsert: Upsert) -> Step {
        self.tally.skipped_objects += 1;
        self.tally.skipped_bytes += upsert.encoded_len() as u64;
        Step::Ack(Ack {
            object: upsert.object,
            revision: upsert.revision,
            outcome: Outcome::Unchanged as i32,
            message: UNCHANGED_MESSAGE.into(),
            awaited: upsert.awaited,
            restores: 0,
        })
    }
}

fn key_of(o: &ObjectRef) -> BucketKey {
    (o.api_version.clone(), o.kind.clone(), o.namespace.clone())
}

fn send(kind: local_message::Kind) -> Step {
    Step::Send(LocalMessage { kind: Some(kind) })
}

#[cfg(test)]
mod tests;
