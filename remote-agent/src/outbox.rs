//! The provider's outbox: one record per tenant of what the provider streams back on its own
//! (pod status, volumes, capacity, events), and one sender per session that sends what the
//! session lacks. The mirror of the origin's outbox.
//!
//! Producers say what changed, when it changes ([`Outbox::put`], [`Outbox::remove`]); nothing
//! rescans. The record keeps the latest state of every subject while its tenant is away, so a
//! reconnecting origin gets it all again from here, and a session gets each state once. A
//! session's sender waits for room on that session's stream only: a tenant that stops reading
//! holds up nobody else, and misses nothing (it gets the latest state when it reads again).
//! The decisions are in [`ledger`], tested without a cluster.

pub mod ledger;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, RemoteMessage};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use ledger::Ledger;
pub use ledger::{Put, Subject, Topic};

use crate::registry::{Outbound, Registry, TapMessage};

/// The record of every tenant, and the wake-ups of their senders; clones share them.
#[derive(Clone)]
pub struct Outbox {
    ledger: Arc<Mutex<Ledger>>,
    wake: Arc<Mutex<HashMap<ClusterId, Arc<Notify>>>>,
    /// Counts sessions opened, for producers whose state depends on who is connected
    /// (capacity is computed per connected tenant).
    opened: Arc<watch::Sender<u64>>,
}

impl Default for Outbox {
    fn default() -> Self {
        Self {
            ledger: Arc::default(),
            wake: Arc::default(),
            opened: Arc::new(watch::channel(0).0),
        }
    }
}

impl Outbox {
    /// Records the latest state of `subject` for `tenant` (`hash` identifies it, whatever in
    /// `message` changes on every send) and wakes the tenant's sender if its session lacks it.
    pub fn put(&self, tenant: &ClusterId, subject: Subject, hash: String, message: RemoteMessage) {
        let put = self.ledger.locked().put(tenant, subject, hash, message);
        match put {
            Put::Due => self.wake(tenant),
            Put::Held => {}
            Put::Refused { first } => {
                if first {
                    tracing::warn!(%tenant, limit = ledger::MAX_EVENTS, "the tenant's namespaces hold more events than are kept for it; newer events are not sent until older ones expire");
                }
            }
        }
    }

    /// Forgets `subject`: its object is gone.
    pub fn remove(&self, subject: &Subject) {
        self.ledger.locked().remove(subject);
    }

    /// Forgets the events of `tenant`'s namespace `namespace`: it is no longer watched.
    pub fn remove_events_of(&self, tenant: &ClusterId, namespace: &str) {
        self.ledger.locked().remove_events_of(tenant, namespace);
    }

    /// Changes whenever a session opens.
    pub fn sessions_opened(&self) -> watch::Receiver<u64> {
        self.opened.subscribe()
    }

    fn wake(&self, tenant: &ClusterId) {
        if let Some(notify) = self.wake.locked().get(tenant) {
            notify.notify_one();
        }
    }

    /// Sends session `session` of `tenant` what it lacks, on `outbound`, until `done` is
    /// cancelled or the stream closes. Each message goes through `registry`'s tap.
    pub fn spawn_sender(
        &self,
        tenant: ClusterId,
        session: String,
        outbound: Outbound,
        registry: Registry,
        done: CancellationToken,
    ) {
        let notify = Arc::new(Notify::new());
        self.wake.locked().insert(tenant.clone(), notify.clone());
        self.ledger.locked().open(&tenant, &session);
        self.opened.send_modify(|n| *n = n.wrapping_add(1));
        let outbox = self.clone();
        tokio::spawn(async move {
            outbox
                .send_while_open(&tenant, &session, &outbound, &registry, &notify, &done)
                .await;
            outbox.ledger.locked().close(&tenant, &session);
            let mut wake = outbox.wake.locked();
            if wake.get(&tenant).is_some_and(|n| Arc::ptr_eq(n, &notify)) {
                wake.remove(&tenant);
            }
        });
    }

    async fn send_while_open(
        &self,
        tenant: &ClusterId,
        session: &str,
        outbound: &Outbound,
        registry: &Registry,
        notify: &Notify,
        done: &CancellationToken,
    ) {
        loop {
            let due = self.ledger.locked().next(tenant, session);
            let Some(due) = due else {
                // `notify_one` keeps a wake-up that comes before this wait.
                tokio::select! {
                    _ = done.cancelled() => return,
                    _ = notify.notified() => continue,
                }
            };
            let permit = tokio::select! {
                _ = done.cancelled() => return,
                permit = outbound.reserve() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return, // the stream closed
                },
            };
            let message = stamped(due.message);
            registry.tap(tenant, TapMessage::FromRemote(&message));
            permit.send(Ok(message));
            self.ledger
                .locked()
                .delivered(tenant, session, due.subject, due.hash);
        }
    }
}

/// `message` as sent now: a pod status carries its sending time, which the origin measures
/// the status's latency from.
fn stamped(mut message: RemoteMessage) -> RemoteMessage {
    if let Some(remote_message::Kind::PodStatus(status)) = message.kind.as_mut() {
        status.sent_unix_millis = unix_millis_now();
    }
    message
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn unix_millis_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
