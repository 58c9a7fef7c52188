//! A TLS connection that [`super::Access`] can close: once its registration is cancelled,
//! every read and write fails, so the HTTP/2 connection and every call on it end at once.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

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

/// A TLS stream that fails once its connection is cut off.
pub struct Guarded {
    inner: TlsStream<TcpStream>,
    registration: Registration,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Guarded {
    /// Wraps `inner`, closed when `registration` is cancelled.
    pub fn new(inner: TlsStream<TcpStream>, registration: Registration) -> Self {
        let cut = Box::pin(registration.closer.clone().cancelled_owned());
        Self {
            inner,
            registration,
            cut,
        }
    }

    /// Ready (with the error to return) once the connection is cut off; otherwise registers
    /// the task to be woken when it is.
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.registration.closer.is_cancelled() || self.cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection's client was cut off by the provider",
            ));
        }
        Poll::Pending
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
        if let Poll::Ready(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
