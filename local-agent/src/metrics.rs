//! The local agent's Prometheus metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use refract_shared::telemetry::Admin;

/// Every metric the local agent exports, registered under `refract_local_`.
#[derive(Clone, Default)]
pub struct Metrics {
    /// 1 while a stream to the remote agent is open.
    pub connected: Gauge,
    /// Reconnect attempts.
    pub reconnects: Counter,
}

impl Metrics {
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
                "reconnects",
                "Reconnect attempts to the remote agent",
                m.reconnects.clone(),
            );
        });
        m
    }
}
