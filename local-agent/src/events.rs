//! Events recorded on the provider, recorded again on the origin objects they are about.
//!
//! A provider could send any number of events about anything, so each one passes four gates
//! before it costs the origin's API server a write:
//! 0. The operator's event reflection policy (`offloading.reflection.event`,
//!    `--event-reflection-type|workers`), read as Liqo does on the provider event's own
//!    annotations: skipped events are counted, not written; 0 workers skips them all.
//! 1. It must be about an object this agent reflected to that provider ([`Reflected`]): the
//!    provider names the object by its provider namespace and name, and only an object the
//!    agent sent there resolves to an origin object (and its UID, with no read). One about an
//!    object not sent on the session yet (a session starting) waits for it, bounded
//!    ([`crate::early`]).
//! 2. Repeats are aggregated: events with the same object, type, reason and message are one
//!    origin event whose count rises ([`aggregate`]); the backlog holds at most
//!    [`MAX_PENDING`] distinct events, and what comes beyond it is dropped and counted.
//! 3. Writes are paced at `--event-rate` per second with an equal burst, however fast events
//!    arrive.
//!
//! Origin events never go to the provider.

pub mod aggregate;
pub mod origin;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use refract_core::lock::{Locked, RwLocked};
use refract_core::options::KindOptions;
use refract_core::policy::skip_reason;
use refract_wire::proto;

use crate::early::{self, Early};
use crate::key::Key;
use aggregate::{Aggregator, Offer, Pending};

/// The most distinct events waiting to be written.
pub const MAX_PENDING: usize = 1024;

/// Resolves provider objects of one kind to the origin objects this agent reflected as them.
pub trait Reflected: Send + Sync {
    /// The origin object and its UID that provider object `remote_namespace/remote_name`
    /// stands for, when this agent sent it on the current session.
    fn origin_of(&self, remote_namespace: &str, remote_name: &str) -> Option<(Key, String)>;
}

/// What each provider kind resolves through: `Pod` and `ShadowPod` through pod offloading,
/// every reflected kind through its reflector.
pub type ReflectedKinds = HashMap<&'static str, Arc<dyn Reflected>>;

/// Writes aggregated events to the origin.
pub trait EventWriter: Send + Sync + 'static {
    /// Creates or updates one origin event; an error is logged and the event dropped.
    fn write(&self, pending: Pending) -> impl std::future::Future<Output = ()> + Send;
}

/// Counters of what happened to provider events.
#[derive(Clone, Default)]
pub struct EventCounters {
    /// Written to the origin.
    pub written: prometheus_client::metrics::counter::Counter,
    /// Folded into an event already waiting or written.
    pub aggregated: prometheus_client::metrics::counter::Counter,
    /// Dropped: malformed, about an object this agent did not reflect, or over the backlog.
    pub refused: prometheus_client::metrics::counter::Counter,
    /// Not written because the event reflection policy leaves them out.
    pub skipped: prometheus_client::metrics::counter::Counter,
}

/// The intake: gates, aggregation and paced writing.
pub struct EventIntake {
    /// Grows when the settings name a custom kind while the agent runs.
    kinds: std::sync::RwLock<ReflectedKinds>,
    /// The event reflection policy, and workers (0: none is written); the reflection values
    /// file can change it while the agent runs.
    reflection: Mutex<KindOptions>,
    aggregator: Arc<Aggregator>,
    counters: EventCounters,
    /// Events about objects not sent on the session yet, by arrival.
    early: Mutex<Early<u64, proto::Event>>,
    sequence: AtomicU64,
    log: crate::throttle::Throttle,
}

/// The most events, and event bytes, held for objects not sent yet.
const EARLY_EVENTS: usize = 1024;
const EARLY_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Why an event is not written.
enum Refusal {
    /// It is about an object this agent has not sent on the session (yet).
    NotSentYet(Box<proto::Event>),
    /// It is not acceptable.
    Invalid(String),
    /// The event reflection policy leaves it out.
    Skipped,
}

impl EventIntake {
    /// Starts the writer task; it writes at most `rate` events per second until `shutdown`.
    pub fn spawn<W: EventWriter>(
        kinds: ReflectedKinds,
        reflection: KindOptions,
        writer: W,
        rate: u32,
        counters: EventCounters,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Arc<Self> {
        let aggregator = Arc::new(Aggregator::new(MAX_PENDING));
        let intake = Arc::new(Self {
            kinds: std::sync::RwLock::new(kinds),
            reflection: Mutex::new(reflection),
            aggregator: aggregator.clone(),
            counters: counters.clone(),
            early: Mutex::new(Early::new(EARLY_EVENTS, EARLY_EVENT_BYTES)),
            sequence: AtomicU64::new(0),
            log: crate::throttle::Throttle::new(Duration::from_secs(10)),
        });
        let retrier = intake.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = write_paced(aggregator, writer, rate, counters) => {}
                _ = retrier.retry_early() => {}
            }
        });
        intake
    }

    /// Takes one event from the provider; never waits. One about an object this agent has
    /// not sent on the session yet waits for it ([`crate::early`]).
    pub fn offer(&self, message: proto::Event) {
        if let Some(message) = self.settle(self.admit(message)) {
            let key = self.sequence.fetch_add(1, Ordering::Relaxed);
            let dropped = self.early_events().hold(key, message, Instant::now());
            self.refuse_early(dropped);
        }
    }

    /// Counts what became of an event; gives back one that must wait for its object.
    fn settle(&self, admitted: Result<Offer, Refusal>) -> Option<proto::Event> {
        match admitted {
            Ok(Offer::New) => {}
            Ok(Offer::Aggregated) => {
                self.counters.aggregated.inc();
            }
            Ok(Offer::Dropped) => self.refuse(&format!(
                "{MAX_PENDING} provider events already wait to be written at --event-rate"
            )),
            Err(Refusal::NotSentYet(message)) => return Some(*message),
            Err(Refusal::Invalid(reason)) => self.refuse(&reason),
            Err(Refusal::Skipped) => {
                self.counters.skipped.inc();
            }
        }
        None
    }

    fn refuse(&self, reason: &str) {
        self.counters.refused.inc();
        if let Some(suppressed) = self.log.allow("event") {
            tracing::warn!(%reason, suppressed, "ignoring an event from the provider");
        }
    }

    fn refuse_early(&self, dropped: Vec<proto::Event>) {
        if dropped.is_empty() {
            return;
        }
        self.counters.refused.inc_by(dropped.len() as u64);
        if let Some(suppressed) = self.log.allow("early event") {
            tracing::warn!(
                dropped = dropped.len(),
                about = ?early::some_subjects(&dropped),
                suppressed,
                held_at_most_seconds = early::MAX_WAIT.as_secs(),
                "ignoring events from the provider: not about objects this agent reflected"
            );
        }
    }

    fn early_events(&self) -> std::sync::MutexGuard<'_, Early<u64, proto::Event>> {
        self.early.locked()
    }

    /// Offers the held events again each second.
    async fn retry_early(self: Arc<Self>) {
        early::retry_each_second(
            &self.early,
            |message| self.settle(self.admit(message)),
            |dropped| self.refuse_early(dropped),
        )
        .await;
    }

    /// Resolves events about objects of `kind` through `reflected` from now on, unless its
    /// kind resolves already.
    pub fn add_kind(&self, kind: &'static str, reflected: Arc<dyn Reflected>) {
        let mut kinds = self.kinds.write_locked();
        kinds.entry(kind).or_insert(reflected);
    }

    /// Puts a changed event reflection policy in force for the events that arrive next.
    pub fn set_reflection(&self, reflection: KindOptions) {
        *self.reflection.locked() = reflection;
    }

    fn admit(&self, message: proto::Event) -> Result<Offer, Refusal> {
        let reflection = *self.reflection.locked();
        if reflection.workers == 0 {
            return Err(Refusal::Skipped);
        }
        let Some(involved) = message.involved.as_ref() else {
            return Err(Refusal::Invalid("the event names no object".into()));
        };
        let kind = self
            .kinds
            .read_locked()
            .get(involved.kind.as_str())
            .cloned();
        let Some(kind) = kind else {
            return Err(Refusal::Invalid(format!(
                "kind {:?} is not reflected",
                involved.kind
            )));
        };
        let Some((key, uid)) = kind.origin_of(&involved.namespace, &involved.name) else {
            return Err(Refusal::NotSentYet(Box::new(message)));
        };
        let event = origin::decode(&message.event_json).map_err(Refusal::Invalid)?;
        if skip_reason(reflection.policy, event.metadata.annotations.as_ref()).is_some() {
            return Err(Refusal::Skipped);
        }
        Ok(self.aggregator.offer(
            origin::Target {
                kind: origin::local_kind(&involved.kind),
                key,
                uid,
            },
            event,
        ))
    }

    /// Distinct events waiting to be written.
    pub fn pending(&self) -> usize {
        self.aggregator.dirty_len()
    }
}

/// Writes waiting events, at most `rate` a second with a burst of `rate`.
async fn write_paced<W: EventWriter>(
    aggregator: Arc<Aggregator>,
    writer: W,
    rate: u32,
    counters: EventCounters,
) {
    let rate = rate.max(1);
    let period = Duration::from_secs(1) / rate;
    let mut tokens = f64::from(rate);
    let mut last = tokio::time::Instant::now();
    loop {
        let pending = aggregator.next().await;
        let now = tokio::time::Instant::now();
        tokens = (tokens + now.duration_since(last).as_secs_f64() * f64::from(rate))
            .min(f64::from(rate));
        last = now;
        if tokens < 1.0 {
            tokio::time::sleep(period.mul_f64(1.0 - tokens)).await;
            tokens = 1.0;
            last = tokio::time::Instant::now();
        }
        tokens -= 1.0;
        writer.write(pending).await;
        counters.written.inc();
    }
}

#[cfg(test)]
mod tests;
