//! One SPDY/3.1 session over an upgraded connection, in either role.
//!
//! A reader task decodes frames and hands each stream's data to a small bounded channel: when
//! a stream's reader falls behind, the session stops reading the socket, so TCP (and whatever
//! feeds it) slows the sender down. A writer task owns the socket's write half and the header
//! compressor. The server role accepts streams and answers each with SYN_REPLY at once, as
//! Kubernetes' clients wait for that before writing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Frame, FrameError, FRAME_HEADER_BYTES, MAX_DATA_CHUNK};
use super::headers::{HeaderDecoder, HeaderEncoder, Headers};
use refract_core::lock::Locked;

/// Streams open at once in one session; more are refused. Port-forward uses two per
/// forwarded connection.
pub const MAX_STREAMS: usize = 256;
/// Data chunks buffered per stream before the session stops reading the socket.
const STREAM_BUFFER: usize = 8;
/// Frames queued for the writer.
const OUTBOUND_BUFFER: usize = 64;
/// How long an opened stream waits for the peer's SYN_REPLY.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Which side of the session this is: clients open odd streams, servers even ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Opens streams (the remote agent towards the provider's API server).
    Client,
    /// Accepts streams (the virtual node's kubelet endpoint).
    Server,
}

/// Why a stream operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The session ended.
    #[error("the SPDY session is closed")]
    Closed,
    /// The peer refused or reset the stream.
    #[error("the peer reset the stream")]
    Reset,
    /// The peer did not answer a new stream in time.
    #[error("the peer did not accept the stream within {REPLY_TIMEOUT:?}")]
    NoReply,
}

#[derive(Default)]
struct Entry {
    data: Option<mpsc::Sender<Bytes>>,
    reply: Option<oneshot::Sender<()>>,
    local_done: bool,
}

enum Outgoing {
    Frame(Frame),
    Shutdown,
}

struct Inner {
    out: mpsc::Sender<Outgoing>,
    streams: Mutex<HashMap<u32, Entry>>,
    next_id: AtomicU32,
    closed: CancellationToken,
}

/// A handle on a session; clones share it.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

/// One stream: its headers and the data the peer sends on it.
pub struct Stream {
    /// The stream id.
    pub id: u32,
    /// The headers it was opened with.
    pub headers: Headers,
    incoming: mpsc::Receiver<Bytes>,
    writer: StreamWriter,
}

/// Writes to one stream; clones share it.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    session: Session,
}

/// Starts a session over `io`. In the server role, accepted streams arrive on the returned
/// receiver; in the client role it never yields.
pub fn start<IO>(io: IO, role: Role) -> (Session, mpsc::Receiver<Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (out_tx, out_rx) = mpsc::channel(OUTBOUND_BUFFER);
    let (accept_tx, accept_rx) = mpsc::channel(32);
    let session = Session {
        inner: Arc::new(Inner {
            out: out_tx,
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(match role {
                Role::Client => 1,
                Role::Server => 2,
            }),
            closed: CancellationToken::new(),
        }),
    };
    let (read, write) = tokio::io::split(io);
    tokio::spawn(write_loop(write, out_rx, session.inner.closed.clone()));
    let reader = session.clone();
    tokio::spawn(async move {
        let result = reader.read_loop(read, role, accept_tx).await;
        if let Err(error) = result {
            tracing::debug!(%error, "SPDY session ended");
        }
        reader.inner.closed.cancel();
        reader.inner.streams.locked().clear();
    });
    (session, accept_rx)
}

impl Session {
    /// Opens a stream (client role) and waits until the peer accepts it.
    pub async fn open(&self, headers: Headers) -> Result<Stream, SessionError> {
        let id = self.inner.next_id.fetch_add(2, Ordering::Relaxed);
        let (data_tx, data_rx) = mpsc::channel(STREAM_BUFFER);
        let (reply_tx, reply_rx) = oneshot::channel();
        {
            let mut streams = self.inner.streams.locked();
            if streams.len() >= MAX_STREAMS {
                return Err(SessionError::Closed);
            }
            streams.insert(
                id,
                Entry {
                    data: Some(data_tx),
                    reply: Some(reply_tx),
                    local_done: false,
                },
            );
        }
        self.send(Frame::SynStream {
            stream_id: id,
            fin: false,
            headers: headers.clone(),
        })
        .await?;
        match tokio::time::timeout(REPLY_TIMEOUT, reply_rx).await {
            Ok(Ok(())) => Ok(self.stream(id, headers, data_rx)),
            Ok(Err(_)) => Err(SessionError::Reset),
            Err(_) => Err(SessionError::NoReply),
        }
    }

    /// Ends the session: GOAWAY, then the connection is flushed and shut down after what was
    /// already queued.
    pub async fn shutdown(&self) {
        let _ = self
            .send(Frame::GoAway {
                last_good_stream_id: 0,
            })
            .await;
        let _ = self.inner.out.send(Outgoing::Shutdown).await;
    }

    /// Resolves when the session has ended.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await
    }

    fn stream(&self, id: u32, headers: Headers, incoming: mpsc::Receiver<Bytes>) -> Stream {
        Stream {
            id,
            headers,
            incoming,
            writer: StreamWriter {
                id,
                session: self.clone(),
            },
        }
    }

    async fn send(&self, frame: Frame) -> Result<(), SessionError> {
        if self.inner.closed.is_cancelled() {
            return Err(SessionError::Closed);
        }
        self.inner
            .out
            .send(Outgoing::Frame(frame))
            .await
            .map_err(|_| SessionError::Closed)
    }

    async fn read_loop<R: AsyncRead + Unpin>(
        &self,
        mut read: R,
        role: Role,
        accept: mpsc::Sender<Stream>,
    ) -> Result<(), FrameError> {
        let mut decoder = HeaderDecoder::new();
        loop {
            let mut head = [0u8; FRAME_HEADER_BYTES];
            tokio::select! {
                _ = self.inner.closed.cancelled() => return Ok(()),
                r = read.read_exact(&mut head) => if r.is_err() { return Ok(()) },
            }
            let len = frame::payload_len(&head)?;
            let mut payload = BytesMut::zeroed(len);
            if read.read_exact(&mut payload).await.is_err() {
                return Ok(());
            }
            match frame::decode(&head, payload.freeze(), &mut decoder)? {
                Frame::SynStream {
                    stream_id,
                    fin,
                    headers,
                } => self.accepted(role, stream_id, fin, headers, &accept).await,
                Frame::SynReply { stream_id, fin, .. } => {
                    let mut streams = self.inner.streams.locked();
                    if let Some(entry) = streams.get_mut(&stream_id) {
                        if let Some(reply) = entry.reply.take() {
                            let _ = reply.send(());
                        }
                        if fin {
                            entry.data = None;
                        }
                    }
                }
                Frame::Data {
                    stream_id,
                    fin,
                    data,
                } => {
                    let sender = {
                        let streams = self.inner.streams.locked();
                        streams.get(&stream_id).and_then(|e| e.data.clone())
                    };
                    if let Some(sender) = sender {
                        if !data.is_empty() {
                            // Waiting here is the flow control: the socket is not read
                            // until this stream's reader takes the chunk.
                            let _ = sender.send(data).await;
                        }
                    }
                    if fin {
                        self.remote_finished(stream_id);
                    }
                }
                Frame::RstStream { stream_id, .. } => {
                    self.inner.streams.locked().remove(&stream_id);
                }
                Frame::Ping { id } => {
                    // Echo the peer's pings; ours come back with our parity and end here.
                    let ours = (id % 2 == 1) == (role == Role::Client);
                    if !ours {
                        let _ = self.send(Frame::Ping { id }).await;
                    }
                }
                Frame::GoAway { .. } | Frame::Ignored => {}
            }
        }
    }

    async fn accepted(
        &self,
        role: Role,
        id: u32,
        fin: bool,
        headers: Headers,
        accept: &mpsc::Sender<Stream>,
    ) {
        let peer_parity = if role == Role::Server { 1 } else { 0 };
        let refuse = role != Role::Server || id % 2 != peer_parity || {
            let streams = self.inner.streams.locked();
            streams.len() >= MAX_STREAMS || streams.contains_key(&id)
        };
        if refuse {
            let _ = self
                .send(Frame::RstStream {
                    stream_id: id,
                    status: frame::RST_REFUSED_STREAM,
                })
                .await;
            return;
        }
        let (data_tx, data_rx) = mpsc::channel(STREAM_BUFFER);
        self.inner.streams.locked().insert(
            id,
            Entry {
                data: (!fin).then_some(data_tx),
                reply: None,
                local_done: false,
            },
        );
        let _ = self
            .send(Frame::SynReply {
                stream_id: id,
                fin: false,
                headers: Vec::new(),
            })
            .await;
        if accept
            .send(self.stream(id, headers, data_rx))
            .await
            .is_err()
        {
            self.forget(id);
        }
    }

    fn remote_finished(&self, id: u32) {
        let mut streams = self.inner.streams.locked();
        if let Some(entry) = streams.get_mut(&id) {
            entry.data = None;
            if entry.local_done {
                streams.remove(&id);
            }
        }
    }

    fn local_finished(&self, id: u32) {
        let mut streams = self.inner.streams.locked();
        if let Some(entry) = streams.get_mut(&id) {
            entry.local_done = true;
            if entry.data.is_none() {
                streams.remove(&id);
            }
        }
    }

    fn forget(&self, id: u32) {
        self.inner.streams.locked().remove(&id);
    }
}

impl Stream {
    /// The next chunk the peer sent; `None` once the peer finished or reset the stream, or
    /// the session ended.
    pub async fn read(&mut self) -> Option<Bytes> {
        self.incoming.recv().await
    }

    /// A writer for this stream.
    pub fn writer(&self) -> StreamWriter {
        self.writer.clone()
    }
}

impl StreamWriter {
    /// Sends `data`, split into frames of at most [`MAX_DATA_CHUNK`] bytes.
    pub async fn write(&self, mut data: Bytes) -> Result<(), SessionError> {
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_DATA_CHUNK));
            self.session
                .send(Frame::Data {
                    stream_id: self.id,
                    fin: false,
                    data: chunk,
                })
                .await?;
        }
        Ok(())
    }

    /// Says this side will send nothing more (the peer reads end-of-file).
    pub async fn close(&self) -> Result<(), SessionError> {
        self.session.local_finished(self.id);
        self.session
            .send(Frame::Data {
                stream_id: self.id,
                fin: true,
                data: Bytes::new(),
            })
            .await
    }

    /// Abandons the stream in both directions.
    pub async fn reset(&self) {
        self.session.forget(self.id);
        let _ = self
            .session
            .send(Frame::RstStream {
                stream_id: self.id,
                status: frame::RST_CANCEL,
            })
            .await;
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut write: W,
    mut out: mpsc::Receiver<Outgoing>,
    closed: CancellationToken,
) {
    let mut encoder = HeaderEncoder::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        let next = tokio::select! {
            _ = closed.cancelled() => break,
            next = out.recv() => next,
        };
        let Some(Outgoing::Frame(frame)) = next else {
            let _ = write.flush().await;
            let _ = write.shutdown().await;
            closed.cancel();
            return;
        };
        if let Err(error) = frame::encode(&frame, &mut encoder, &mut buf) {
            tracing::debug!(%error, "SPDY frame not encodable");
            break;
        }
        // Batch what is already queued into one write.
        while buf.len() < 64 * 1024 {
            match out.try_recv() {
                Ok(Outgoing::Frame(frame)) => {
                    if frame::encode(&frame, &mut encoder, &mut buf).is_err() {
                        break;
                    }
                }
                Ok(Outgoing::Shutdown) => {
                    let _ = write.write_all(&buf).await;
                    let _ = write.flush().await;
                    let _ = write.shutdown().await;
                    closed.cancel();
                    return;
                }
                Err(_) => break,
            }
        }
        if write.write_all(&buf).await.is_err() || write.flush().await.is_err() {
            break;
        }
        buf.clear();
    }
    closed.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_and_a_server_exchange_data_both_ways() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, _) = start(a, Role::Client);
        let (_server, mut accepted) = start(b, Role::Server);
        let opening = tokio::spawn(async move {
            let stream = client
                .open(vec![("streamtype".into(), "stdin".into())])
                .await
                .unwrap();
            (client, stream)
        });
        let mut served = accepted.recv().await.unwrap();
        assert_eq!(
            super::super::headers::get(&served.headers, "streamType"),
            Some("stdin")
        );
        let (_client, mut opened) = opening.await.unwrap();
        let big = Bytes::from(vec![7u8; 200 * 1024]);
        let writer = opened.writer();
        let sent = big.clone();
        tokio::spawn(async move {
            writer.write(sent).await.unwrap();
            writer.close().await.unwrap();
        });
        let mut got = Vec::new();
        while let Some(chunk) = served.read().await {
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, big);
        served
            .writer()
            .write(Bytes::from_static(b"back"))
            .await
            .unwrap();
        served.writer().close().await.unwrap();
        assert_eq!(opened.read().await.as_deref(), Some(&b"back"[..]));
        assert_eq!(opened.read().await, None);
    }

    #[tokio::test]
    async fn the_session_ends_when_the_connection_drops() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, _) = start(a, Role::Client);
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), client.closed())
            .await
            .unwrap();
        assert!(client.open(Vec::new()).await.is_err());
    }
}
