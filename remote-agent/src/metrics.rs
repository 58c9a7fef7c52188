//! The remote agent's Prometheus metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use refract_shared::telemetry::Admin;

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
}

impl StreamRefusal {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamRefusal::HelloTimeout => "hello_timeout",
            StreamRefusal::NoHello => "no_hello",
            StreamRefusal::IdentityMismatch => "identity_mismatch",
            StreamRefusal::ProtocolVersion => "protocol_version",
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
}

impl Metrics {
    /// Creates the metrics and registers them with the admin endpoint.
    pub fn register(admin: &Admin) -> Self {
        let m = Self::default();
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
        });
        m
    }
}

/// One label pair.
pub fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_string(), value.to_string())]
}
