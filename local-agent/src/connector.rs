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

/// The remote agent's address as given to `--remote`: `host:port`, `[v6]:port`, or the same
/// behind `https://` (the link is always TLS, so that is the only scheme taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteAddress {
    /// The host: a DNS name or an IP address, without brackets.
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl RemoteAddress {
    /// What [`TcpStream::connect`] dials: `host:port`, an IPv6 host in brackets.
    pub fn dial(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The name the server certificate must carry: `override_name` (`--tls-server-name`) when
    /// given, else the host.
    pub fn server_name(&self, override_name: Option<&str>) -> Result<ServerName<'static>, String> {
        let name = override_name.unwrap_or(&self.host).to_string();
        ServerName::try_from(name.clone())
            .map_err(|e| format!("{name:?} is not a valid TLS server name: {e}"))
    }
}

impl std::str::FromStr for RemoteAddress {
    type Err = String;

    fn from_str(given: &str) -> Result<Self, String> {
        const FORM: &str = "the form is host:port or https://host:port, e.g. remote.example:6443";
        let rest = match given.split_once("://") {
            None => given,
            Some(("https", rest)) => rest,
            Some((scheme, _)) => {
                return Err(format!(
                    "{given:?}: scheme {scheme:?} is not supported; the link is always mutual TLS ({FORM})"
                ))
            }
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') {
            return Err(format!("{given:?} has a path; {FORM}"));
        }
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("{given:?} has no port; {FORM}"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("{given:?} has an invalid port {port:?}; {FORM}"))?;
        let host = match host.strip_prefix('[') {
            Some(v6) => v6
                .strip_suffix(']')
                .ok_or_else(|| format!("{given:?}: unclosed '[' around an IPv6 address"))?,
            None if host.contains(':') => {
                return Err(format!(
                    "{given:?}: write an IPv6 address in brackets, e.g. [::1]:6443"
                ))
            }
            None => host,
        };
        if host.is_empty() {
            return Err(format!("{given:?} has no host; {FORM}"));
        }
        Ok(Self {
            host: host.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for RemoteAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.dial())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<RemoteAddress, String> {
        s.parse()
    }

    #[test]
    fn remote_addresses_in_every_accepted_form() {
        for given in [
            "remote.example:6443",
            "https://remote.example:6443",
            "https://remote.example:6443/",
        ] {
            let addr = parse(given).unwrap();
            assert_eq!(addr.dial(), "remote.example:6443", "{given}");
            assert!(matches!(addr.server_name(None), Ok(ServerName::DnsName(_))));
        }
        let v4 = parse("https://127.0.0.1:7443").unwrap();
        assert!(matches!(v4.server_name(None), Ok(ServerName::IpAddress(_))));
        let v6 = parse("[::1]:6443").unwrap();
        assert_eq!(v6.dial(), "[::1]:6443");
        assert!(matches!(v6.server_name(None), Ok(ServerName::IpAddress(_))));
        assert!(matches!(
            parse("10.0.0.1:1")
                .unwrap()
                .server_name(Some("provider.svc")),
            Ok(ServerName::DnsName(_))
        ));
    }

    #[test]
    fn remote_addresses_refused_with_the_expected_form() {
        for (given, says) in [
            ("remote.example", "has no port"),
            ("remote.example:http", "invalid port"),
            ("http://remote.example:6443", "always mutual TLS"),
            ("https://remote.example:6443/sync", "has a path"),
            ("::1:6443", "in brackets"),
            (":6443", "has no host"),
        ] {
            let error = parse(given).unwrap_err();
            assert!(error.contains(says), "{given}: {error}");
            assert!(
                error.contains("host:port") || error.contains("[::1]"),
                "{error}"
            );
        }
    }
}
