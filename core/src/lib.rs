//! Refract's pure core: what both agents decide, with no I/O.
//!
//! - [`forge`]: the mutation rules per kind, from an origin object to what the provider holds.
//! - [`options`] and [`policy`]: which kinds are reflected and how (Liqo's reflection values),
//!   and the DenyList/AllowList rules of one object.
//! - [`offloading`], [`placement`] and [`selector`]: namespace offloading, which virtual nodes
//!   a namespace may use, and node selectors over their labels.
//! - [`inbound`] and [`pod_status`]: the checks and remapping of what a provider sends back.
//! - [`keys`]: every label, annotation and field-manager name Refract reads or writes.
//! - [`hash`], [`json`], [`quantity`], [`remap`], [`duration`], [`limits`], [`backoff`] and
//!   [`lock`]: the small pieces the rules share.
//!
//! The crate's dependencies are data-shape crates only (k8s-openapi, serde, ipnet, sha2):
//! no async runtime, no gRPC, no Kubernetes client, no command-line parser, so the compiler
//! keeps it pure. `refract-wire` carries it over the link; the agents run it.

pub mod backoff;
pub mod custom_kind;
pub mod duration;
pub mod forge;
pub mod hash;
pub mod inbound;
pub mod json;
pub mod keys;
pub mod limits;
pub mod lock;
pub mod offloading;
pub mod options;
pub mod placement;
pub mod pod_status;
pub mod policy;
pub mod quantity;
pub mod remap;
pub mod selector;

/// This build's version, sent in Hello and Welcome and shown in the agents' info metric.
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
