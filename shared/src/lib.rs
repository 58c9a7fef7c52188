//! The runtime pieces both agents (and `refractctl`) share: what a process needs around the
//! pure core (`refract-core`) and the wire (`refract-wire`).
//!
//! - [`tls`]: certificate identity (`spiffe://refract/cluster/<id>`), loading and validating
//!   PEM files, and rustls configurations that follow their files on disk.
//! - [`cli`]: an agent's command line, its flags or one of its tools.
//! - [`journey`]: each change's journey across both agents as OpenTelemetry traces.
//! - [`kubeconfig`]: the client each agent builds for its own cluster.
//! - [`kube_auth`]: bearer tokens and access reviewed by a cluster (TokenReview,
//!   SubjectAccessReview), answers reused for a while.
//! - [`leader`]: leader election among an agent's replicas on a Lease.
//! - [`runtime`]: the tokio runtime flags and the allocator every binary uses.
//! - [`stored`]: what the agents' watch stores keep of each object.
//! - [`stdout`]: command output that ends quietly when its reader closes the pipe.
//! - [`telemetry`]: logging setup and the admin endpoint (`/healthz`, `/readyz`, `/metrics`)
//!   both agents serve.
//! - [`work_queue`]: coalescing work queues handing each key to one worker at a time (the
//!   local agent's reflectors, the remote agent's ShadowPod controller).
//!
//! The remote agent authorizes a tenant by the identity [`tls`] extracts from the verified
//! client certificate; nothing a message says chooses it.

pub mod cli;
pub mod custom_kind;
pub mod journey;
pub mod kube_auth;
pub mod kubeconfig;
pub mod leader;
pub mod runtime;
pub mod stdout;
pub mod stored;
pub mod telemetry;
pub mod tls;
pub mod work_queue;
