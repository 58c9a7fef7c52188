//! Messages from the remote agent, each handed to its intake without waiting.
//!
//! The link reads messages one at a time into a bounded channel; this dispatcher takes them
//! from there and never blocks on the origin's API server: acks and capacity are cheap and
//! handled at once; pod statuses, custom kinds' statuses and volumes are checked and kept as the latest per object for
//! their writers; events pass the gates and pacing of [`crate::events`]. Nothing spawns a task
//! per message, so a provider that floods the link costs bounded memory and a paced number of
//! origin writes.

use std::sync::{Arc, OnceLock};

use refract_wire::proto::{remote_message, Capacity, Outcome, RemoteMessage};
use tokio::sync::watch;

use crate::custom_status::CustomStatusIntake;
use crate::events::EventIntake;
use crate::outbox::Outbox;
use crate::pods::PodOffloader;
use crate::volumes::VolumeIntake;

/// Where messages from the remote agent go.
pub struct Inbound {
    /// Acks, to the outbox that sent the object.
    pub outbox: Outbox,
    /// The provider's capacity, for the virtual node.
    pub capacity: watch::Sender<Option<Capacity>>,
    /// Pod statuses.
    pub pods: Arc<PodOffloader>,
    /// Provider volumes of reflected claims (none until claims are reflected).
    pub volumes: Arc<OnceLock<Arc<VolumeIntake>>>,
    /// Provider events.
    pub events: Arc<EventIntake>,
    /// Custom kinds' statuses.
    pub custom_status: Arc<CustomStatusIntake>,
}

impl Inbound {
    /// Hands one message to its intake.
    pub fn dispatch(&self, message: RemoteMessage) {
        match message.kind {
            Some(remote_message::Kind::Ack(ack)) => {
                // Fields inside the macro are built only when debug logging is on: one ack per
                // object, so nothing is formatted for nobody.
                tracing::debug!(
                    object = %ack.object.as_ref().map(|o| o.display()).unwrap_or_default(),
                    outcome = Outcome::try_from(ack.outcome).unwrap_or(Outcome::Unspecified).as_str_name(),
                    message = %ack.message,
                    "ack"
                );
                self.outbox.dispatch(ack);
            }
            Some(remote_message::Kind::Capacity(capacity)) => {
                self.capacity.send_replace(Some(capacity));
            }
            Some(remote_message::Kind::Event(event)) => self.events.offer(event),
            Some(remote_message::Kind::PodStatus(status)) => self.pods.offer_status(status),
            Some(remote_message::Kind::CustomStatus(status)) => self.custom_status.offer(status),
            Some(remote_message::Kind::PersistentVolume(volume)) => match self.volumes.get() {
                Some(volumes) => volumes.offer(volume),
                None => {
                    tracing::debug!(claim = %volume.claim_name, "ignoring a volume from the provider: claim reflection is disabled")
                }
            },
            // Inventory pages go to the link ([`crate::resume`]); one here came after its session.
            Some(remote_message::Kind::Welcome(_))
            | Some(remote_message::Kind::Inventory(_))
            | None => {
                tracing::debug!("ignoring an unexpected message from the remote agent")
            }
        }
    }
}
