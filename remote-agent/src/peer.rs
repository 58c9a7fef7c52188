//! Who is calling: the tenant identity from the verified client certificate.

use std::net::SocketAddr;

use refract_shared::tls::identity::{self, ClusterId};
use tonic::{Request, Status};

use crate::access::ConnectionInfo;

/// The verified identity of a gRPC caller.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The cluster id in the client certificate.
    pub cluster_id: ClusterId,
    /// The client certificate's expiry.
    pub not_after: time::OffsetDateTime,
    /// The remote address.
    pub addr: Option<SocketAddr>,
    /// Whether the identity is an Inspect admin's (`--inspect-admin`), not a tenant's.
    pub admin: bool,
}

impl Peer {
    /// Reads the caller's identity. rustls has already verified the chain against the client
    /// CA bundle; this only reads the Refract identity out of the leaf. A request never names
    /// its own tenant. A caller the provider has cut off is refused, with the reason.
    pub fn from_request<T>(request: &Request<T>) -> Result<Self, Status> {
        let connection = request
            .extensions()
            .get::<ConnectionInfo>()
            .ok_or_else(|| Status::unauthenticated("connection is not mutual TLS"))?;
        let info = &connection.tls;
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
        if let Some(reason) = connection
            .access
            .refusal(Some(&cluster_id), &summary.serial)
        {
            return Err(Status::permission_denied(reason));
        }
        Ok(Self {
            admin: connection.access.is_admin(&cluster_id),
            cluster_id,
            not_after: summary.not_after,
            addr: info.get_ref().remote_addr(),
        })
    }

    /// Like [`Peer::from_request`], for what only a tenant may do (a Sync stream, unpeering,
    /// kubelet calls): an Inspect admin identity is refused.
    pub fn tenant_from_request<T>(request: &Request<T>) -> Result<Self, Status> {
        let peer = Self::from_request(request)?;
        if peer.admin {
            return Err(Status::permission_denied(format!(
                "{} is an Inspect admin identity (--inspect-admin); it may call Inspect only, not act as a tenant",
                peer.cluster_id
            )));
        }
        Ok(peer)
    }
}
