//! Routing the remote agent's acks: to whoever waits for one (namespace creation), else to
//! every sink registered for the object's kind (a sink ignores objects it did not send: the
//! Secret reflector and the token reflector share the kind Secret).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use refract_shared::proto::Ack;
use tokio::sync::oneshot;

/// `(kind, namespace, name)` of a provider object.
pub type AckKey = (String, String, String);

/// Receives acks for one kind.
pub trait AckSink: Send + Sync {
    /// Handles one ack.
    fn on_ack(&self, ack: Ack);
}

/// The sinks of one kind.
type Sinks = Vec<Arc<dyn AckSink>>;

/// Routes acks; clones share the routes.
#[derive(Clone, Default)]
pub struct AckRouter {
    waiters: Arc<Mutex<HashMap<AckKey, oneshot::Sender<Ack>>>>,
    sinks: Arc<Mutex<HashMap<String, Sinks>>>,
}

impl AckRouter {
    /// Sends acks of `kind` to `sink` (too).
    pub fn register(&self, kind: &str, sink: Arc<dyn AckSink>) {
        self.sinks
            .lock()
            .expect("ack router poisoned")
            .entry(kind.to_string())
            .or_default()
            .push(sink);
    }

    /// The next ack for `key` arrives on the returned receiver instead of the kind's sink.
    pub fn wait_for(&self, key: AckKey) -> oneshot::Receiver<Ack> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .expect("ack router poisoned")
            .insert(key, tx);
        rx
    }

    /// Delivers one ack.
    pub fn dispatch(&self, ack: Ack) {
        let Some(object) = ack.object.clone() else {
            return;
        };
        let key = (
            object.kind.clone(),
            object.namespace.clone(),
            object.name.clone(),
        );
        if let Some(waiter) = self
            .waiters
            .lock()
            .expect("ack router poisoned")
            .remove(&key)
        {
            let _ = waiter.send(ack);
            return;
        }
        let sinks = self
            .sinks
            .lock()
            .expect("ack router poisoned")
            .get(&object.kind)
            .cloned()
            .unwrap_or_default();
        for sink in sinks {
            sink.on_ack(ack.clone());
        }
    }
}
