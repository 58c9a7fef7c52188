//! The local agent's Prometheus metrics.

use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use refract_shared::telemetry::Admin;
use refract_wire::proto::Outcome;

use crate::events::EventCounters;

/// Labels of the counter of refused provider input: `what` was refused (bounded set).
pub type Refused = Vec<(&'static str, &'static str)>;

/// The label set for refused input of one sort: `pod_status`, `capacity`, `node_label`.
pub fn refused(what: &'static str) -> Refused {
    vec![("what", what)]
}

/// Every metric the local agent exports, registered under `refract_local_`.
#[derive(Clone, Default)]
pub struct Metrics {
    /// 1 while a stream to the remote agent is open.
    pub connected: Gauge,
    /// 1 while this replica leads.
    pub leader: Gauge,
    /// Reconnect attempts.
    pub reconnects: Counter,
    /// Provider input refused or left out, by what it was.
    pub refused: Family<Refused, Counter>,
    /// What became of provider events.
    pub events: EventCounters,
    /// Resuming sessions: what was sent and what was not.
    pub resume: ResumeCounters,
    /// What the outbox waits for.
    pub outbox: OutboxGauges,
    /// Relists of origin watches (after `410 Gone`), by kind.
    pub relists: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// From a change queued, and from its Upsert sent, to the provider's answer.
    pub answer_latency: AnswerLatency,
    /// Whether the settings files are in force, and how often they changed.
    pub settings: crate::settings::SettingsMetrics,
    /// From an offloaded pod's creation at the origin to Running written at the origin.
    pub pod_running_latency: PodRunningLatency,
    /// From the remote agent sending a pod status to the local agent writing it.
    pub pod_status_latency: PodStatusLatency,
}

/// Seconds from the remote agent sending a pod status to the local agent writing it at the
/// origin, by the two clusters' clocks: a status the provider claims was sent in the future
/// counts as 0, and one claimed over an hour old is not counted (a wrong clock, or a lie).
#[derive(Clone)]
pub struct PodStatusLatency(pub Histogram);

impl Default for PodStatusLatency {
    fn default() -> Self {
        // 5 ms to about 41 s.
        Self(Histogram::new(exponential_buckets(0.005, 2.0, 14)))
    }
}

impl PodStatusLatency {
    /// Observes a status sent at `sent_unix_millis` (provider's clock) written at `now_millis`.
    pub fn observe(&self, sent_unix_millis: i64, now_millis: i64) {
        if let Some(seconds) = status_delay(sent_unix_millis, now_millis) {
            self.0.observe(seconds);
        }
    }
}

/// The delay to count, if any (see [`PodStatusLatency`]).
pub fn status_delay(sent_unix_millis: i64, now_millis: i64) -> Option<f64> {
    const HOUR_MILLIS: i64 = 3_600_000;
    if sent_unix_millis <= 0 {
        return None; // not set (an older remote agent) or nonsense
    }
    let delay = now_millis.saturating_sub(sent_unix_millis).max(0);
    (delay <= HOUR_MILLIS).then(|| delay as f64 / 1000.0)
}

/// Seconds from an offloaded pod's creation at the origin to the first time the local agent
/// writes it Running there: what a user waits for, scheduling, the stream, the provider's
/// image pull and start, and the status back included. One series.
#[derive(Clone)]
pub struct PodRunningLatency(pub Histogram);

impl Default for PodRunningLatency {
    fn default() -> Self {
        // 0.25 s to about 17 min.
        Self(Histogram::new(exponential_buckets(0.25, 2.0, 13)))
    }
}

/// The latency of a change to the provider's answer, two ways: from its Upsert sent (the
/// link and the provider, by kind and outcome), and from the change first queued at the origin
/// to an answer that it is applied (the whole path an operator waits on, by kind).
#[derive(Clone)]
pub struct AnswerLatency {
    answered: Family<Vec<(&'static str, &'static str)>, Histogram>,
    applied: Family<Vec<(&'static str, &'static str)>, Histogram>,
}

impl Default for AnswerLatency {
    fn default() -> Self {
        // 5 ms to about 41 s.
        let buckets = || Histogram::new(exponential_buckets(0.005, 2.0, 14));
        Self {
            answered: Family::new_with_constructor(buckets),
            applied: Family::new_with_constructor(buckets),
        }
    }
}

impl AnswerLatency {
    /// Observes one answer of `outcome` about a `kind` object whose change was `noticed`
    /// (queued at the origin) and `sent` then.
    pub fn observe(&self, kind: &'static str, outcome: Outcome, noticed: Instant, sent: Instant) {
        let now = Instant::now();
        // Applied first: a scrape between the two never shows an applied answer without
        // its change-to-applied time.
        if matches!(outcome, Outcome::Applied | Outcome::Unchanged) {
            self.applied
                .get_or_create(&vec![("kind", kind)])
                .observe(now.saturating_duration_since(noticed).as_secs_f64());
        }
        self.answered
            .get_or_create(&vec![("kind", kind), ("outcome", outcome.label())])
            .observe(now.saturating_duration_since(sent).as_secs_f64());
    }
}

/// Upserts of the current session the provider has not answered yet ([`crate::outbox`]).
#[derive(Clone, Default)]
pub struct OutboxGauges {
    /// How many.
    pub unacked: Gauge,
    /// How long the oldest has waited, in seconds.
    pub oldest_unacked_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

/// What the stream sent, and what resuming saved ([`crate::resume`]).
#[derive(Clone, Default)]
pub struct ResumeCounters {
    /// Bytes of messages sent on the stream (protobuf encoding, before HTTP/2 framing).
    pub sent_bytes: Counter,
    /// Upserts not sent because the provider held them already.
    pub skipped_objects: Counter,
    /// Their bytes.
    pub skipped_bytes: Counter,
    /// Buckets settled, by result (`equal`, `different`, `expired`).
    pub buckets: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Buckets of the current session still held.
    pub pending: Gauge,
}

impl Metrics {
    /// The counter of refused provider input of one sort. The family's lock is held only
    /// while the series is looked up (holding two at once, as a struct literal's temporaries
    /// would, deadlocks).
    pub fn refused_counter(&self, what: &'static str) -> Counter {
        self.refused.get_or_create(&refused(what)).clone()
    }

    /// Creates the metrics and registers them with the admin endpoint.
    pub fn register(admin: &Admin) -> Self {
        let m = Self::default();
        admin.register("refract_local", |r| {
            r.register(
                "connected",
                "1 while a stream to the remote agent is open",
                m.connected.clone(),
            );
            r.register(
                "leader",
                "1 while this replica leads its peering (holds the Lease); a standby only serves the webhook",
                m.leader.clone(),
            );
            r.register(
                "reconnects",
                "Reconnect attempts to the remote agent",
                m.reconnects.clone(),
            );
            r.register(
                "settings_valid",
                "0 while a changed --reflection-config or --offloading-patch file is refused (the last good settings stay in force), else 1",
                m.settings.valid.clone(),
            );
            r.register(
                "settings_reloads",
                "Changes of the settings files put in force without a restart",
                m.settings.reloads.clone(),
            );
            r.register(
                "provider_input_refused",
                "Provider messages or parts of them refused (pod statuses, capacity, node labels)",
                m.refused.clone(),
            );
            r.register(
                "provider_events_written",
                "Provider events written to the origin (aggregated and paced)",
                m.events.written.clone(),
            );
            r.register(
                "provider_events_skipped",
                "Provider events not written because the event reflection policy leaves them out",
                m.events.skipped.clone(),
            );
            r.register(
                "provider_events_aggregated",
                "Provider events folded into an origin event already waiting or written",
                m.events.aggregated.clone(),
            );
            r.register(
                "stream_sent_bytes",
                "Bytes of messages sent to the remote agent (protobuf encoding)",
                m.resume.sent_bytes.clone(),
            );
            r.register(
                "resume_skipped_objects",
                "Objects not sent on a new session because the provider held them already",
                m.resume.skipped_objects.clone(),
            );
            r.register(
                "resume_skipped_bytes",
                "Bytes of the objects not sent on a new session",
                m.resume.skipped_bytes.clone(),
            );
            r.register(
                "resume_buckets",
                "Kinds-in-a-namespace compared on a new session, by result: equal, different, expired",
                m.resume.buckets.clone(),
            );
            r.register(
                "resume_pending_buckets",
                "Kinds-in-a-namespace of the current session still waiting to be compared",
                m.resume.pending.clone(),
            );
            r.register(
                "outbox_unacked",
                "Upserts of the current session the remote agent has not answered yet",
                m.outbox.unacked.clone(),
            );
            r.register(
                "outbox_oldest_unacked_seconds",
                "How long the oldest unanswered Upsert of the current session has waited",
                m.outbox.oldest_unacked_seconds.clone(),
            );
            r.register(
                "watch_relists",
                "Origin watches listed again because their resourceVersion expired (410 Gone), by kind",
                m.relists.clone(),
            );
            r.register(
                "provider_events_refused",
                "Provider events dropped: malformed, about objects not reflected, or over the backlog",
                m.events.refused.clone(),
            );
            r.register(
                "answer_seconds",
                "Seconds from an Upsert sent to the provider's answer, by kind and outcome",
                m.answer_latency.answered.clone(),
            );
            r.register(
                "change_applied_seconds",
                "Seconds from an origin change queued at the local agent to the provider's answer that it is applied, by kind",
                m.answer_latency.applied.clone(),
            );
            r.register(
                "pod_running_seconds",
                "Seconds from an offloaded pod's creation at the origin to Running written at the origin",
                m.pod_running_latency.0.clone(),
            );
            r.register(
                "pod_status_seconds",
                "Seconds from the remote agent sending a pod status to its write at the origin (both clusters' clocks)",
                m.pod_status_latency.0.clone(),
            );
        });
        m
    }
}

#[cfg(test)]
mod tests {
    use super::status_delay;

    #[test]
    fn a_provider_timestamp_is_counted_only_when_plausible() {
        assert_eq!(status_delay(1_000, 1_250), Some(0.25));
        // Sent "in the future" (clock skew): counted as no delay.
        assert_eq!(status_delay(2_000, 1_000), Some(0.0));
        // Unset, negative, or over an hour old: not counted.
        assert_eq!(status_delay(0, 1_000), None);
        assert_eq!(status_delay(i64::MIN, 1_000), None);
        assert_eq!(status_delay(1, 3_600_002), None);
        assert_eq!(status_delay(i64::MAX, 1_000), Some(0.0));
    }
}
