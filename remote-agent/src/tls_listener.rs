//! Accepting mutual-TLS connections with whatever certificate is current.
//!
//! Each accepted TCP connection is handshaken with the rustls configuration current at that
//! moment, so a rotated certificate or CA bundle applies from the next connection on without a
//! restart. Handshakes run in their own tasks with a deadline, so a slow or hostile client
//! cannot stall the accept loop. Each established connection is registered with [`Access`]
//! under its client certificate's identity, so cutting that client off closes it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use refract_shared::tls::Watched;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::access::sources::Sources;
use crate::access::{Access, Guarded, TooManyConnections};

/// How long a client has to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Counts handshakes by result (`ok`, `refused`, `timeout`), and connections closed unserved:
/// `too_many_from_source` (before the handshake), `too_many_for_identity` (after an `ok` one).
pub type HandshakeCounter = Family<Vec<(String, String)>, Counter>;

/// Starts accepting on `listener`; yields established TLS streams.
pub fn incoming(
    listener: TcpListener,
    tls: Watched<Arc<rustls::ServerConfig>>,
    access: Arc<Access>,
    handshakes: HandshakeCounter,
    sources: Sources,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<Guarded, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        // Usually EMFILE: back off briefly instead of spinning.
                        tracing::warn!(%error, "failed to accept connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let count = {
                let handshakes = handshakes.clone();
                move |label: &str| {
                    handshakes
                        .get_or_create(&vec![("result".to_string(), label.to_string())])
                        .inc();
                }
            };
            // Closed before any handshake work: the address holds its share already.
            let Some(slot) = sources.take(peer.ip()) else {
                count("too_many_from_source");
                tracing::debug!(%peer, max = sources.max(), "refused connection: too many from this address");
                continue;
            };
            let acceptor = TlsAcceptor::from(tls.current().value.clone());
            let tx = tx.clone();
            let access = access.clone();
            tokio::spawn(async move {
                let result = handshake(acceptor, tcp, peer).await;
                count(match &result {
                    Ok(_) => "ok",
                    Err(HandshakeError::Timeout) => "timeout",
                    Err(HandshakeError::Refused(_)) => "refused",
                });
                let stream = match result {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::warn!(%peer, %error, "refused connection");
                        return;
                    }
                };
                match register(&access, &stream) {
                    Ok(registration) => {
                        let _ = tx
                            .send(Ok(Guarded::new(stream, registration, Some(slot))))
                            .await;
                    }
                    Err(error) => {
                        count("too_many_for_identity");
                        tracing::warn!(%peer, %error, "refused connection");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("TLS handshake did not finish within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    #[error("TLS handshake failed: {0}")]
    Refused(std::io::Error),
}

async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    _peer: SocketAddr,
) -> Result<TlsStream<TcpStream>, HandshakeError> {
    let _ = tcp.set_nodelay(true);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Err(_) => Err(HandshakeError::Timeout),
        Ok(Err(e)) => Err(HandshakeError::Refused(e)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Registers the connection under its client certificate's identity and serial (rustls has
/// verified the chain; a certificate without an identity is refused per call).
fn register(
    access: &Arc<Access>,
    stream: &TlsStream<TcpStream>,
) -> Result<crate::access::Registration, TooManyConnections> {
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|leaf| refract_shared::tls::identity::summarize(leaf).ok());
    match leaf {
        Some(summary) => access.register(summary.cluster_id.ok(), summary.serial),
        None => access.register(None, String::new()),
    }
}
