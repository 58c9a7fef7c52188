//! The remote agent's Prometheus metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use refract_shared::telemetry::Admin;

use crate::tls_listener::HandshakeCounter;

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
    /// Messages received, by kind.
    pub received: Family<Labels, Counter>,
    /// Acks sent, by outcome.
    pub acks: Family<Labels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them with the admin endpoint.
    pub fn register(admin: &Admin) -> Self {
        let m = Self::default();
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
                "Messages received from local agents, by kind",
                m.received.clone(),
            );
            r.register("acks", "Acks sent, by outcome", m.acks.clone());
        });
        m
    }
}

/// One label pair.
pub fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_string(), value.to_string())]
}
