//! The remote agent's Prometheus metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use refract_shared::telemetry::Admin;

use crate::tls_listener::HandshakeCounter;

/// Why a Sync stream is refused after the handshake (the `reason` label).
pub const STREAM_REFUSALS: [&str; 4] = [
    "hello_timeout",
    "no_hello",
    "identity_mismatch",
    "protocol_version",
];

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
            let _ = m.streams_refused.get_or_create(&label("reason", reason));
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
