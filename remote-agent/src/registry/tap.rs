//! A tap of each tenant's live messages, for Inspect's `Tap`: copies that never block the
//! stream, what the local agent sent redacted ([`super::redact`]).

use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{
    local_message, remote_message, tap_event, LocalMessage, RemoteMessage, TapEvent,
};
use std::sync::Arc;

use super::tap_queue::TapReader;
use super::{now, redact, Registry, TenantState};

impl Registry {
    /// Copies a message to the tenant's tap readers, if any. Never blocks.
    pub fn tap(&self, tenant: &ClusterId, message: TapMessage<'_>) {
        let mut tenants = self.inner.locked();
        let Some(t) = tenants.get_mut(tenant) else {
            return;
        };
        if !t.tap.any() {
            return;
        }
        let message = match message {
            TapMessage::FromLocal(m) => tap_event::Message::FromLocal(redact::local_message(m)),
            TapMessage::FromRemote(m) => tap_event::Message::FromRemote(m.clone()),
        };
        t.tap.send(&TapEvent {
            at: now(),
            message: Some(message),
            dropped_before: 0,
        });
    }

    /// Subscribes to a tenant's live messages (creating the tenant entry if needed, so a tap
    /// can wait for a tenant that has not connected yet); past
    /// [`super::tap_queue::MAX_READERS`] per tenant the oldest tap ends.
    pub fn subscribe(&self, tenant: &ClusterId) -> Arc<TapReader> {
        self.inner
            .locked()
            .entry(tenant.clone())
            .or_insert_with(TenantState::new)
            .tap
            .add()
    }
}

/// A message to copy to tap readers.
pub enum TapMessage<'a> {
    /// Sent by the local agent.
    FromLocal(&'a LocalMessage),
    /// Sent by the remote agent.
    FromRemote(&'a RemoteMessage),
}

/// A short name of a message's kind, for logs and metrics.
pub fn local_kind(m: &LocalMessage) -> &'static str {
    match &m.kind {
        Some(local_message::Kind::Hello(_)) => "hello",
        Some(local_message::Kind::Upsert(_)) => "upsert",
        Some(local_message::Kind::Delete(_)) => "delete",
        Some(local_message::Kind::SnapshotComplete(_)) => "snapshot_complete",
        Some(local_message::Kind::StatusAck(_)) => "status_ack",
        Some(local_message::Kind::InventoryRequest(_)) => "inventory_request",
        None => "empty",
    }
}

/// See [`local_kind`].
pub fn remote_kind(m: &RemoteMessage) -> &'static str {
    match &m.kind {
        Some(remote_message::Kind::Welcome(_)) => "welcome",
        Some(remote_message::Kind::Ack(_)) => "ack",
        Some(remote_message::Kind::PodStatus(_)) => "pod_status",
        Some(remote_message::Kind::Event(_)) => "event",
        Some(remote_message::Kind::Capacity(_)) => "capacity",
        Some(remote_message::Kind::PersistentVolume(_)) => "persistent_volume",
        Some(remote_message::Kind::Inventory(_)) => "inventory",
        Some(remote_message::Kind::CustomStatus(_)) => "custom_status",
        None => "empty",
    }
}
