//! A TLS connection that [`super::Access`] can close: once its registration is cancelled,
//! every read and write fails, so the HTTP/2 connection and every call on it end at once. One
//! that sends nothing within [`FIRST_BYTES_WITHIN`] of its handshake (no HTTP/2 preface) is
//! closed too: it would hold its place among its identity's connections for nothing.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use super::sources::SourceSlot;
use super::{Access, Registration};

/// What every call on a connection can read from its request: the TLS session and the access
/// rules that apply to it.
#[derive(Clone)]
pub struct ConnectionInfo {
    /// The TLS session (peer certificates, addresses).
    pub tls: TlsConnectInfo<TcpConnectInfo>,
    /// The access rules.
    pub access: Arc<Access>,
}

/// How long an established connection has to send its first bytes (the HTTP/2 preface).
pub const FIRST_BYTES_WITHIN: Duration = Duration::from_secs(10);

/// A TLS stream that fails once its connection is cut off.
pub struct Guarded {
    inner: TlsStream<TcpStream>,
    registration: Registration,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Until the first bytes are read: when they are due.
    first_bytes_due: Option<Pin<Box<Sleep>>>,
    /// The connection's place among its source address's.
    _source: Option<SourceSlot>,
}

impl Guarded {
    /// Wraps `inner`, closed when `registration` is cancelled; `source` is held as long as
    /// the connection is.
    pub fn new(
        inner: TlsStream<TcpStream>,
        registration: Registration,
        source: Option<SourceSlot>,
    ) -> Self {
        let cut = Box::pin(registration.closer.clone().cancelled_owned());
        Self {
            inner,
            registration,
            cut,
            first_bytes_due: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_WITHIN))),
            _source: source,
        }
    }

    /// Polls `op` on the TLS stream, unless the connection is cut off: then every read and
    /// write fails, and until it is, the task is woken when it is.
    fn unless_cut<T>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut TlsStream<TcpStream>>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let this = self.get_mut();
        if this.registration.closer.is_cancelled() || this.cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection's client was cut off by the provider",
            )));
        }
        op(Pin::new(&mut this.inner), cx)
    }
}

impl Connected for Guarded {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            tls: self.inner.connect_info(),
            access: self.registration.access.clone(),
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let filled = buf.filled().len();
        let read = Pin::new(&mut *this).unless_cut(cx, |inner, cx| inner.poll_read(cx, buf));
        if let Some(due) = this.first_bytes_due.as_mut() {
            if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > filled {
                this.first_bytes_due = None;
            } else if read.is_pending() && due.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("nothing received within {FIRST_BYTES_WITHIN:?} of the handshake"),
                )));
            }
        }
        read
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.unless_cut(cx, |inner, cx| inner.poll_write(cx, buf))
    }

    // Forwarded, not left to the defaults: HTTP/2 asks the stream whether it takes several
    // buffers at once, and when told no, writes a frame's header and a payload over 1 KiB
    // with a TLS record and a system call each instead of one.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.unless_cut(cx, |inner, cx| inner.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use refract_certs::{LeafRequest, Role, Validity};
    use refract_shared::tls::{self, ClusterId, TlsFiles};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::access::DenyList;

    fn material(ca: &refract_certs::Issued, id: &str, role: Role) -> tls::TlsMaterial {
        let request = LeafRequest {
            cluster_id: ClusterId::parse(id).unwrap(),
            role,
            dns_names: vec!["localhost".into()],
            ips: vec![],
            validity: Validity::days_from_now(1),
        };
        let leaf = refract_certs::issue(ca, &request).unwrap();
        TlsFiles::in_folder(Path::new(id))
            .parse(
                leaf.cert_pem.as_bytes(),
                leaf.key_pem.as_bytes(),
                ca.cert_pem.as_bytes(),
            )
            .unwrap()
    }

    /// The buffers of one vectored write reach the peer together: left to the default, the
    /// stream would take only the first and report a short write.
    #[tokio::test]
    async fn a_vectored_write_goes_through_whole() {
        tls::install_default_crypto_provider();
        let ca = refract_certs::create_ca("test-ca", Validity::days_from_now(1)).unwrap();
        let server = tls::server_config(&material(&ca, "provider", Role::Server)).unwrap();
        let client = tls::client_config(&material(&ca, "shop", Role::Client)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dial = tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(client)
                .connect(name, tcp)
                .await
                .unwrap();
            let mut received = vec![0; 11];
            tls.read_exact(&mut received).await.unwrap();
            received
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(server)
            .accept(tcp)
            .await
            .unwrap();
        let access = Access::new(BTreeSet::new(), DenyList::default());
        let registration = access
            .register(Some(ClusterId::parse("shop").unwrap()), "0a".into())
            .unwrap();
        let mut guarded = Guarded::new(tls, registration, None);

        assert!(guarded.is_write_vectored());
        let bufs = [io::IoSlice::new(b"head"), io::IoSlice::new(b"payload")];
        assert_eq!(guarded.write_vectored(&bufs).await.unwrap(), 11);
        guarded.flush().await.unwrap();
        assert_eq!(dial.await.unwrap(), b"headpayload");
    }
}
