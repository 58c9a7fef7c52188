//! Refract's wire: what travels between the agents and what the kubelet calls speak.
//!
//! - [`proto`]: the `refract.v1` gRPC API (`Reflection`, `Inspect`, `Kubelet`), generated from
//!   `proto/refract/v1` at build time.
//! - [`spdy`]: the SPDY/3.1 codec that `kubectl exec`, `attach` and `port-forward` speak to a
//!   kubelet, served by the local agent and spoken by the remote agent to the provider.
//! - [`kubelet_protocol`]: the exit status and terminal sizes of those calls, as Kubernetes
//!   encodes them inside the streams.
//!
//! The rules applied to what travels are in `refract-core`; this crate only carries it.

pub mod kubelet_protocol;
pub mod proto;
pub mod spdy;
