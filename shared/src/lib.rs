//! Refract's shared core.
//!
//! - [`proto`]: the `refract.v1` wire API (generated from `proto/refract/v1`).
//! - [`tls`]: certificate identity (`spiffe://refract/cluster/<id>`), loading and validating
//!   PEM files, and rustls configurations that follow their files on disk.
//! - [`keys`]: every label, annotation and field-manager name Refract reads or writes.
//! - [`kubeconfig`]: the client each agent builds for its own cluster.
//! - [`lock`]: taking a `std::sync` lock without a panic path.
//! - [`stdout`]: command output that ends quietly when its reader closes the pipe.
//! - [`telemetry`]: logging setup and the admin endpoint (`/healthz`, `/readyz`, `/metrics`)
//!   both agents serve.
//!
//! Data flow: a local agent turns origin objects into `Upsert`s; the remote agent authorizes
//! them by the identity [`tls`] extracts from the verified client certificate.

pub mod backoff;
pub mod duration;
pub mod forge;
pub mod hash;
pub mod inbound;
pub mod json;
pub mod keys;
pub mod kubeconfig;
pub mod kubelet_protocol;
pub mod limits;
pub mod lock;
pub mod offloading;
pub mod options;
pub mod placement;
pub mod pod_status;
pub mod policy;
pub mod proto;
pub mod quantity;
pub mod remap;
pub mod runtime;
pub mod selector;
pub mod spdy;
pub mod stdout;
pub mod telemetry;
pub mod tls;

/// This build's version, sent in Hello and Welcome.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

#[cfg(test)]
mod test_support {
    use std::collections::BTreeMap;

    /// A string map (labels, annotations, resource lists) from literal pairs.
    pub fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}
