//! Who is calling: the tenant identity from the verified client certificate.

use std::net::SocketAddr;

use refract_shared::tls::identity::{self, ClusterId};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Status};

/// The verified identity of a gRPC caller.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The cluster id in the client certificate.
    pub cluster_id: ClusterId,
    /// The client certificate's expiry.
    pub not_after: time::OffsetDateTime,
    /// The remote address.
    pub addr: Option<SocketAddr>,
}

impl Peer {
    /// Reads the caller's identity. rustls has already verified the chain against the client
    /// CA bundle; this only reads the Refract identity out of the leaf. A request never names
    /// its own tenant.
    pub fn from_request<T>(request: &Request<T>) -> Result<Self, Status> {
        let info = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .ok_or_else(|| Status::unauthenticated("connection is not mutual TLS"))?;
        let certs = info
            .peer_certs()
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let leaf = certs
            .first()
            .ok_or_else(|| Status::unauthenticated("empty client certificate chain"))?;
        let summary = identity::summarize(leaf)
            .map_err(|e| Status::unauthenticated(format!("unreadable client certificate: {e}")))?;
        let cluster_id = summary.cluster_id.map_err(|e| {
            Status::permission_denied(format!("client certificate has no Refract identity: {e}"))
        })?;
        Ok(Self {
            cluster_id,
            not_after: summary.not_after,
            addr: info.get_ref().remote_addr(),
        })
    }
}
