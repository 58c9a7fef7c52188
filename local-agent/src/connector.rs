//! Dialing the remote agent: TCP, then TLS with the current client certificate, then a check
//! that the server is the provider we expect.

use std::sync::Arc;

use hyper_util::rt::TokioIo;
use refract_shared::tls::identity::{self, ClusterId};
use refract_shared::tls::Watched;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Why a connection to the remote agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP connect failed.
    #[error("failed to connect to {addr}: {source}")]
    Tcp {
        /// The address dialled.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TLS handshake failed (untrusted server, refused client certificate, ...).
    #[error("TLS handshake with {addr} failed: {source}")]
    Handshake {
        /// The address dialled.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The server's certificate is valid but names another cluster.
    #[error("remote agent at {addr} identifies as {found}, expected {expected}")]
    WrongPeer {
        /// The address dialled.
        addr: String,
        /// What the certificate says.
        found: String,
        /// What --remote-cluster-id says.
        expected: ClusterId,
    },
}

/// Dials the remote agent for tonic, one new TLS connection per call.
#[derive(Clone)]
pub struct Connector {
    /// `host:port` to dial.
    pub addr: String,
    /// The name the server certificate must carry.
    pub server_name: ServerName<'static>,
    /// The provider's expected cluster id.
    pub expected: ClusterId,
    /// The current client configuration.
    pub tls: Watched<Arc<rustls::ClientConfig>>,
}

impl Connector {
    /// Opens one verified connection.
    pub async fn connect(&self) -> Result<TokioIo<TlsStream<TcpStream>>, ConnectError> {
        let tcp = TcpStream::connect(&self.addr)
            .await
            .map_err(|source| ConnectError::Tcp {
                addr: self.addr.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let config = self.tls.current().value.clone();
        let tls = TlsConnector::from(config)
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|source| ConnectError::Handshake {
                addr: self.addr.clone(),
                source,
            })?;
        let found = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|leaf| identity::cluster_id_from_der(leaf))
            .transpose()
            .map_err(|e| e.to_string())
            .and_then(|id| id.ok_or_else(|| "no certificate".to_string()));
        match found {
            Ok(id) if id == self.expected => Ok(TokioIo::new(tls)),
            Ok(id) => Err(self.wrong_peer(id.to_string())),
            Err(e) => Err(self.wrong_peer(format!("<unknown: {e}>"))),
        }
    }

    fn wrong_peer(&self, found: String) -> ConnectError {
        ConnectError::WrongPeer {
            addr: self.addr.clone(),
            found,
            expected: self.expected.clone(),
        }
    }
}

/// Splits `host:port` (or `[v6]:port`) and turns the host into a TLS server name.
pub fn server_name_of(
    remote: &str,
    override_name: Option<&str>,
) -> Result<ServerName<'static>, String> {
    let host = match override_name {
        Some(name) => name.to_string(),
        None => {
            let (host, port) = remote
                .rsplit_once(':')
                .ok_or_else(|| format!("--remote {remote:?} must be host:port"))?;
            port.parse::<u16>()
                .map_err(|_| format!("--remote {remote:?} has an invalid port"))?;
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string()
        }
    };
    ServerName::try_from(host.clone())
        .map_err(|e| format!("{host:?} is not a valid TLS server name: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names() {
        assert!(matches!(
            server_name_of("127.0.0.1:6443", None),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name_of("[::1]:6443", None),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name_of("remote.example:443", None),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name_of("remote.example", None).is_err());
        assert!(server_name_of("remote.example:http", None).is_err());
        assert!(matches!(
            server_name_of("10.0.0.1:1", Some("provider.svc")),
            Ok(ServerName::DnsName(_))
        ));
    }
}
