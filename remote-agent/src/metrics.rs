//! The remote agent's Prometheus metrics.

use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use refract_core::lock::Locked;
use refract_shared::telemetry::Admin;
use refract_shared::tls::ClusterId;
use refract_wire::proto::Outcome;

use crate::tls_listener::HandshakeCounter;

/// Every reason a Sync stream is refused after the handshake; each series exists from the start
/// (at 0), so alerts and dashboards see it before the first refusal.
pub const STREAM_REFUSALS: [StreamRefusal; 4] = [
    StreamRefusal::HelloTimeout,
    StreamRefusal::NoHello,
    StreamRefusal::IdentityMismatch,
    StreamRefusal::ProtocolVersion,
];

/// Why a Sync stream was refused after the handshake: the `reason` label of
/// `refract_remote_streams_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRefusal {
    /// No Hello within the time allowed.
    HelloTimeout,
    /// The first message was not a Hello.
    NoHello,
    /// The Hello names another cluster than the client certificate.
    IdentityMismatch,
    /// The Hello's protocol version is not this agent's.
    ProtocolVersion,
    /// Another replica serves the tenant and did not hand it over in time.
    ServedElsewhere,
}

impl StreamRefusal {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamRefusal::HelloTimeout => "hello_timeout",
            StreamRefusal::NoHello => "no_hello",
            StreamRefusal::IdentityMismatch => "identity_mismatch",
            StreamRefusal::ProtocolVersion => "protocol_version",
            StreamRefusal::ServedElsewhere => "served_elsewhere",
        }
    }
}

/// Labels of per-message counters.
pub type Labels = Vec<(String, String)>;

/// Every metric the remote agent exports, registered under `refract_remote_`.
#[derive(Clone, Default)]
pub struct Metrics {
    /// TLS handshakes by result.
    pub handshakes: HandshakeCounter,
    /// Sync streams open now.
    pub streams: Gauge,
    /// Streams refused after the handshake, by reason.
    pub streams_refused: Family<Labels, Counter>,
    /// Messages received, by tenant and kind.
    pub received: Family<Labels, Counter>,
    /// Acks sent, by tenant and outcome.
    pub acks: Family<Labels, Counter>,
    /// The policy file's state, and what its changes refused.
    pub policy: PolicyMetrics,
    /// Copies rewritten on the provider, restored and quarantined.
    pub drift: DriftMetrics,
}

impl Metrics {
    /// Creates the metrics and registers them with the admin endpoint.
    pub fn register(admin: &Admin) -> Self {
        let m = Self::default();
        // No policy file is a valid one; a file refused later sets it to 0.
        m.policy.valid.set(1);
        // Every reason exported from the start at 0, so `increase()` sees the first refusal.
        for reason in STREAM_REFUSALS {
            let _ = m
                .streams_refused
                .get_or_create(&label("reason", reason.as_str()));
        }
        admin.register("refract_remote", |r| {
            r.register(
                "tls_handshakes",
                "TLS handshakes by result",
                m.handshakes.clone(),
            );
            r.register("streams", "Sync streams open now", m.streams.clone());
            r.register(
                "streams_refused",
                "Sync streams refused after the handshake, by reason",
                m.streams_refused.clone(),
            );
            r.register(
                "messages_received",
                "Messages received from local agents, by tenant and kind",
                m.received.clone(),
            );
            r.register("acks", "Acks sent, by tenant and outcome", m.acks.clone());
            r.register(
                "policy_file_valid",
                "1 while the policy file on disk is the one in force, 0 while it is refused (the last good policy stays)",
                m.policy.valid.clone(),
            );
            r.register(
                "policy_refusals",
                "Objects already written that a changed policy refused, by tenant",
                m.policy.refused.clone(),
            );
            r.register(
                "drift_restores",
                "Tenant copies changed or deleted on the provider by someone else and restored, by tenant and kind",
                m.drift.restores.clone(),
            );
            r.register(
                "drift_quarantines",
                "Tenant copies quarantined because someone on the provider kept rewriting them, by tenant and kind",
                m.drift.quarantines.clone(),
            );
            r.register(
                "drift_quarantined_objects",
                "Tenant copies quarantined now (left as the provider's other writer made them), by tenant",
                m.drift.quarantined.clone(),
            );
        });
        m
    }
}

/// Drift and fights over tenant copies ([`crate::restore`]).
#[derive(Clone, Default)]
pub struct DriftMetrics {
    /// Restores, by tenant and kind.
    pub restores: Family<Labels, Counter>,
    /// Quarantines begun, by tenant and kind.
    pub quarantines: Family<Labels, Counter>,
    /// Objects quarantined now, by tenant.
    pub quarantined: Family<Labels, Gauge>,
}

/// The policy file's metrics ([`crate::policy_file`]).
#[derive(Clone, Default)]
pub struct PolicyMetrics {
    /// 1 while the file in force is the one on disk, 0 while the file on disk is refused.
    pub valid: Gauge,
    /// Objects a changed policy refused, by tenant.
    pub refused: Family<Labels, Counter>,
}

/// One label pair.
pub fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_string(), value.to_string())]
}

/// One tenant's series of the per-message counters, found once each and then kept: counting a
/// message is an increment, where looking its series up built, hashed and compared a label set
/// of four strings (twice a message: what was received, and the ack).
pub struct TenantCounters {
    tenant: String,
    received: Family<Labels, Counter>,
    acks: Family<Labels, Counter>,
    found: Mutex<Vec<(Series, Counter)>>,
}

/// A series of [`TenantCounters`]: which family, and the value of its second label.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Series {
    Received(&'static str),
    Ack(&'static str),
}

impl TenantCounters {
    /// `tenant`'s series in `metrics`.
    pub fn new(metrics: &Metrics, tenant: &ClusterId) -> Self {
        Self {
            tenant: tenant.to_string(),
            received: metrics.received.clone(),
            acks: metrics.acks.clone(),
            found: Mutex::default(),
        }
    }

    /// Counts a message received, of `kind` ([`crate::registry::local_kind`]).
    pub fn received(&self, kind: &'static str) {
        self.count(Series::Received(kind));
    }

    /// Counts an ack sent with `outcome`.
    pub fn ack(&self, outcome: Outcome) {
        self.count(Series::Ack(outcome.label()));
    }

    fn count(&self, series: Series) {
        let mut found = self.found.locked();
        if let Some((_, counter)) = found.iter().find(|(s, _)| *s == series) {
            counter.inc();
            return;
        }
        let (family, key, value) = match series {
            Series::Received(kind) => (&self.received, "kind", kind),
            Series::Ack(outcome) => (&self.acks, "outcome", outcome),
        };
        let counter = family
            .get_or_create(&vec![
                ("tenant".to_string(), self.tenant.clone()),
                (key.to_string(), value.to_string()),
            ])
            .clone();
        counter.inc();
        found.push((series, counter));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(tenant: &str, key: &str, value: &str) -> Labels {
        vec![
            ("tenant".to_string(), tenant.to_string()),
            (key.to_string(), value.to_string()),
        ]
    }

    #[test]
    fn a_tenants_counters_count_in_the_shared_series() {
        let metrics = Metrics::default();
        let tenant = ClusterId::parse("origin").unwrap();
        let counters = TenantCounters::new(&metrics, &tenant);
        counters.received("upsert");
        counters.received("upsert");
        counters.received("delete");
        counters.ack(Outcome::Applied);
        // A second stream of the same tenant counts in the same series.
        TenantCounters::new(&metrics, &tenant).ack(Outcome::Applied);
        let received = |kind| {
            metrics
                .received
                .get_or_create(&series("origin", "kind", kind))
                .get()
        };
        assert_eq!((received("upsert"), received("delete")), (2, 1));
        let applied = series("origin", "outcome", "applied");
        assert_eq!(metrics.acks.get_or_create(&applied).get(), 2);
    }
}
