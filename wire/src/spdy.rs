//! SPDY/3.1, the multiplexing that `kubectl exec`, `attach` and `port-forward` speak to a
//! kubelet through the API server (Kubernetes' `k8s.io/apimachinery/pkg/util/httpstream/spdy`).
//!
//! [`frame`] encodes and decodes frames, [`headers`] the compressed header blocks, and
//! [`session`] runs one session over an upgraded connection in either role: the local agent
//! serves its virtual node's kubelet endpoint with it, the remote agent calls the provider's
//! API server with it.

pub mod frame;
pub mod headers;
pub mod session;

pub use headers::Headers;
pub use session::{start, Role, Session, SessionError, Stream, StreamWriter};
