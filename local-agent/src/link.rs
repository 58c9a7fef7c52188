//! The link to the remote agent: connect, Hello/Welcome, pump messages, reconnect.
//!
//! The link publishes the current session's sender on a watch channel; whoever produces
//! desired state watches it and resends everything on each new session (followed by
//! SnapshotComplete), so a reconnect never leaves the provider with a stale view. What the
//! producers send passes through [`crate::resume`], which holds back what the provider has
//! already. Messages from the remote agent are forwarded to `inbound_tx`.

use std::time::{Duration, Instant};

use prost::Message;
use refract_shared::tls::ClusterId;
use refract_wire::proto::reflection_client::ReflectionClient;
use refract_wire::proto::{
    local_message, remote_message, Hello, Inventory, LocalMessage, RemoteMessage,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::connector::Connector;
use crate::metrics::{Metrics, ResumeCounters};
use crate::resume::{Resume, Step, Tally};
use refract_core::backoff::Backoff;

/// How long the remote agent has to answer Hello.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
/// Outbound messages buffered per session before producers wait.
const OUTBOUND_BUFFER: usize = 1024;
/// A session that lived this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);
/// Inventory pages waiting for the pump (1,000 entries each).
const PAGES_BUFFER: usize = 256;
/// Buckets a Welcome may describe; a longer description is not used (everything is sent).
const MAX_BUCKETS: usize = 100_000;

/// The sending side of the current session.
#[derive(Clone, Debug)]
pub struct SessionTx {
    /// Increases with every new session.
    pub generation: u64,
    /// The remote agent's session id from Welcome.
    pub session_id: String,
    /// Messages to send on this session; those of objects the provider may hold already are
    /// held back for comparison first ([`crate::resume`]).
    pub tx: mpsc::Sender<LocalMessage>,
    /// Messages sent as they come, for objects outside any SnapshotComplete (token Secrets).
    pub direct: mpsc::Sender<LocalMessage>,
    /// A connection of the session's own for kubelet API calls, beside the stream's.
    pub calls: tonic::transport::Channel,
}

/// What the link needs to know.
#[derive(Clone)]
pub struct LinkConfig {
    /// How to dial.
    pub connector: Connector,
    /// This origin.
    pub cluster_id: ClusterId,
    /// HTTP/2 keepalive interval.
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive timeout.
    pub keepalive_timeout: Duration,
    /// How long a message may wait for others to share its write (`--send-window`).
    pub send_window: Duration,
    /// Reconnect backoff.
    pub backoff: Backoff,
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Could not connect.
    #[error(transparent)]
    Connect(#[from] tonic::transport::Error),
    /// The remote agent refused or ended the stream.
    #[error("remote agent ended the stream: {code:?}: {message}")]
    Status {
        /// gRPC code.
        code: tonic::Code,
        /// Message.
        message: String,
    },
    /// The first answer was not Welcome.
    #[error("remote agent did not answer Hello with Welcome: {0}")]
    NoWelcome(String),
    /// The stream closed.
    #[error("remote agent closed the stream")]
    Closed,
}

impl From<tonic::Status> for SessionError {
    fn from(s: tonic::Status) -> Self {
        Self::Status {
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

/// Runs the link until `shutdown`; returns the watch of the current session.
pub fn spawn_link(
    config: LinkConfig,
    inbound_tx: mpsc::Sender<RemoteMessage>,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> watch::Receiver<Option<SessionTx>> {
    let (session_tx, session_rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut backoff = config.backoff.clone();
        let mut generation = 0;
        loop {
            generation += 1;
            let started = Instant::now();
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = run_session(&config, generation, &session_tx, &inbound_tx, &metrics) => r,
            };
            session_tx.send_replace(None);
            metrics.connected.set(0);
            if started.elapsed() > STABLE_AFTER {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            metrics.reconnects.inc();
            match result {
                Ok(()) | Err(SessionError::Closed) => {
                    tracing::warn!(retry_in = ?delay, "stream to the remote agent closed; reconnecting")
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?delay, "stream to the remote agent failed; reconnecting")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    });
    session_rx
}

async fn run_session(
    config: &LinkConfig,
    generation: u64,
    session_tx: &watch::Sender<Option<SessionTx>>,
    inbound_tx: &mpsc::Sender<RemoteMessage>,
    metrics: &Metrics,
) -> Result<(), SessionError> {
    let connector = config.connector.clone();
    // The URI only names the authority for HTTP/2; the connector dials and does TLS itself.
    let endpoint = Endpoint::from_shared(format!("http://{}", connector.addr))?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(config.keepalive_interval)
        .keep_alive_timeout(config.keepalive_timeout)
        .keep_alive_while_idle(true)
        // Room for every kubelet call the provider allows to fill its window, and the
        // connection still to move (`refract_core::limits::MAX_KUBELET_SESSIONS`).
        .initial_stream_window_size(refract_core::limits::STREAM_WINDOW_BYTES)
        .initial_connection_window_size(refract_core::limits::CONNECTION_WINDOW_BYTES);
    let dial = move |_| {
        let connector = connector.clone();
        async move { connector.connect().await }
    };
    let channel = endpoint
        .clone()
        .connect_with_connector(tower::service_fn(dial.clone()))
        .await?;
    // Kubelet calls get a connection of their own, dialled on first use and again after it
    // breaks: what their callers leave unread (every `logs -f` into a pager) fills its windows
    // and its buffers, and h2 closes a connection that holds too many unread frames. That must
    // never be the reflection stream's.
    let calls = endpoint.connect_with_connector_lazy(tower::service_fn(dial));

    let (wire, wire_rx) = mpsc::channel(OUTBOUND_BUFFER);
    wire.send(LocalMessage {
        kind: Some(local_message::Kind::Hello(Hello {
            cluster_id: config.cluster_id.to_string(),
            agent_version: refract_core::AGENT_VERSION.to_string(),
            protocol_version: refract_wire::proto::PROTOCOL_VERSION,
            resume: true,
        })),
    })
    .await
    .map_err(|_| SessionError::Closed)?;
    let mut inbound = ReflectionClient::new(channel.clone())
        .max_decoding_message_size(64 * 1024 * 1024)
        .sync(outbound(wire_rx, config.send_window))
        .await?
        .into_inner();

    let welcome = match tokio::time::timeout(WELCOME_TIMEOUT, inbound.message()).await {
        Err(_) => return Err(SessionError::NoWelcome("no answer within 10s".into())),
        Ok(Err(status)) => return Err(status.into()),
        Ok(Ok(None)) => return Err(SessionError::Closed),
        Ok(Ok(Some(RemoteMessage {
            kind: Some(remote_message::Kind::Welcome(w)),
        }))) => w,
        Ok(Ok(Some(other))) => return Err(SessionError::NoWelcome(format!("{other:?}"))),
    };
    let described = if !welcome.resume {
        Vec::new()
    } else if welcome.buckets.len() > MAX_BUCKETS {
        tracing::warn!(
            buckets = welcome.buckets.len(),
            limit = MAX_BUCKETS,
            "Welcome describes too many buckets; sending everything"
        );
        Vec::new()
    } else {
        welcome.buckets
    };
    tracing::info!(
        remote = %welcome.cluster_id,
        session = %welcome.session_id,
        remote_version = %welcome.agent_version,
        resuming = welcome.resume,
        buckets = described.len(),
        "connected to remote agent"
    );
    metrics.connected.set(1);
    let (tx, produced) = mpsc::channel(OUTBOUND_BUFFER);
    let (direct, direct_rx) = mpsc::channel(OUTBOUND_BUFFER);
    session_tx.send_replace(Some(SessionTx {
        generation,
        session_id: welcome.session_id,
        tx,
        direct,
        calls,
    }));
    // Pages are handed over without waiting: the reader must never wait on the pump, which may
    // itself wait for the remote agent to read (and it for this reader). A page dropped when
    // the pump is that far behind leaves its bucket to be sent in full after the hold limit.
    let (pages_tx, pages) = mpsc::channel(PAGES_BUFFER);
    let pump = Pump {
        resume: Resume::new(described, Instant::now()),
        reported: Tally::default(),
        wire,
        inbound_tx: inbound_tx.clone(),
        metrics: metrics.resume.clone(),
    };
    let pump = pump.run(produced, direct_rx, pages);
    let read = async {
        while let Some(message) = inbound.message().await? {
            let delivered = match message.kind {
                Some(remote_message::Kind::Inventory(page)) => match pages_tx.try_send(page) {
                    Err(mpsc::error::TrySendError::Full(page)) => {
                        tracing::warn!(kind = %page.kind, namespace = %page.namespace, "inventory page dropped: too many waiting; the bucket is sent in full later");
                        true
                    }
                    sent => sent.is_ok(),
                },
                _ => inbound_tx.send(message).await.is_ok(),
            };
            if !delivered {
                return Ok(());
            }
        }
        Err(SessionError::Closed)
    };
    tokio::select! {
        result = read => result,
        () = pump => Err(SessionError::Closed),
    }
}

/// Most messages one send window gathers before they go.
const MAX_MESSAGES_PER_WINDOW: usize = 64;

/// The stream's messages as tonic reads them. With a window, each message waits up to `window`
/// for others (or until [`MAX_MESSAGES_PER_WINDOW`] are there); tonic then encodes all that are
/// ready into one HTTP/2 frame, one TLS record and one write, and the remote agent reads them
/// in one wake-up. In order, and none held back when the channel closes.
fn outbound(
    wire_rx: mpsc::Receiver<LocalMessage>,
    window: Duration,
) -> impl futures::Stream<Item = LocalMessage> + Send + 'static {
    use futures::StreamExt as _;
    let messages = ReceiverStream::new(wire_rx);
    if window.is_zero() {
        return messages.map(trace_send).left_stream();
    }
    tokio_stream::StreamExt::chunks_timeout(messages, MAX_MESSAGES_PER_WINDOW, window)
        .flat_map(futures::stream::iter)
        .map(trace_send)
        .right_stream()
}

/// Marks a traced Upsert as tonic takes it to encode and write: a span `send` in its change's
/// trace (the time since the `outbox` span ended is the wait in the stream's queues).
fn trace_send(message: LocalMessage) -> LocalMessage {
    if let Some(local_message::Kind::Upsert(upsert)) = &message.kind {
        if !upsert.trace_parent.is_empty() {
            let span = tracing::trace_span!(
                target: refract_shared::journey::TARGET,
                parent: None,
                "send",
                bytes = upsert.object_json.len(),
            );
            refract_shared::journey::continue_from(&span, &upsert.trace_parent);
        }
    }
    message
}

/// Moves the producers' messages to the stream through [`Resume`].
struct Pump {
    resume: Resume,
    /// What of the tally is in the metrics already.
    reported: Tally,
    wire: mpsc::Sender<LocalMessage>,
    inbound_tx: mpsc::Sender<RemoteMessage>,
    metrics: ResumeCounters,
}

impl Pump {
    /// Runs until the stream or the inbound side closes.
    async fn run(
        mut self,
        mut produced: mpsc::Receiver<LocalMessage>,
        mut direct: mpsc::Receiver<LocalMessage>,
        mut pages: mpsc::Receiver<Inventory>,
    ) {
        self.metrics.pending.set(self.resume.pending() as i64);
        loop {
            let deadline = self.resume.next_deadline();
            let expiry = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let steps = tokio::select! {
                Some(message) = produced.recv() => self.resume.outgoing(message, Instant::now()),
                Some(message) = direct.recv() => vec![Step::Send(message)],
                Some(page) = pages.recv() => self.resume.inventory(page),
                () = expiry => self.resume.expire(Instant::now()),
                else => return,
            };
            for step in steps {
                let delivered = match step {
                    Step::Send(message) => {
                        self.metrics.sent_bytes.inc_by(message.encoded_len() as u64);
                        self.wire.send(message).await.is_ok()
                    }
                    Step::Ack(ack) => {
                        let message = RemoteMessage {
                            kind: Some(remote_message::Kind::Ack(ack)),
                        };
                        self.inbound_tx.send(message).await.is_ok()
                    }
                };
                if !delivered {
                    return;
                }
            }
            self.report();
        }
    }

    /// Adds what the tally gained since the last report to the metrics.
    fn report(&mut self) {
        let now = self.resume.tally();
        self.metrics.pending.set(self.resume.pending() as i64);
        if now == self.reported {
            return;
        }
        let was = std::mem::replace(&mut self.reported, now);
        let m = &self.metrics;
        m.skipped_objects
            .inc_by(now.skipped_objects - was.skipped_objects);
        m.skipped_bytes
            .inc_by(now.skipped_bytes - was.skipped_bytes);
        for (result, n, before) in [
            ("equal", now.equal, was.equal),
            ("different", now.different, was.different),
            ("expired", now.expired, was.expired),
        ] {
            if n > before {
                m.buckets
                    .get_or_create(&vec![("result", result)])
                    .inc_by(n - before);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;

    fn upsert(name: &str) -> LocalMessage {
        LocalMessage {
            kind: Some(local_message::Kind::Upsert(refract_wire::proto::Upsert {
                object: Some(refract_wire::proto::ObjectRef {
                    name: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        }
    }

    fn name(message: Option<LocalMessage>) -> String {
        match message.and_then(|m| m.kind) {
            Some(local_message::Kind::Upsert(u)) => u.object.unwrap_or_default().name,
            other => panic!("not an upsert: {other:?}"),
        }
    }

    const LONG: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn without_a_window_each_message_goes_at_once() {
        let (tx, rx) = mpsc::channel(8);
        let stream = outbound(rx, Duration::ZERO);
        futures::pin_mut!(stream);
        tx.send(upsert("a")).await.unwrap();
        let first = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
        assert_eq!(name(first.unwrap()), "a");
    }

    #[tokio::test]
    async fn a_window_holds_a_message_for_others_then_sends_all_in_order() {
        let window = Duration::from_millis(300);
        let (tx, rx) = mpsc::channel(8);
        let stream = outbound(rx, window);
        futures::pin_mut!(stream);
        let start = Instant::now();
        tx.send(upsert("a")).await.unwrap();
        tx.send(upsert("b")).await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
        assert!(early.is_err(), "nothing before the window ends");
        assert_eq!(
            name(tokio::time::timeout(LONG, stream.next()).await.unwrap()),
            "a"
        );
        assert!(start.elapsed() >= window);
        assert_eq!(
            name(tokio::time::timeout(LONG, stream.next()).await.unwrap()),
            "b"
        );
    }

    #[tokio::test]
    async fn a_full_window_goes_at_once_and_a_closed_channel_holds_nothing_back() {
        let (tx, rx) = mpsc::channel(MAX_MESSAGES_PER_WINDOW * 2);
        let stream = outbound(rx, Duration::from_secs(3600));
        futures::pin_mut!(stream);
        for i in 0..MAX_MESSAGES_PER_WINDOW + 1 {
            tx.send(upsert(&i.to_string())).await.unwrap();
        }
        for i in 0..MAX_MESSAGES_PER_WINDOW {
            let next = tokio::time::timeout(LONG, stream.next()).await.unwrap();
            assert_eq!(name(next), i.to_string());
        }
        drop(tx);
        let last = tokio::time::timeout(LONG, stream.next()).await.unwrap();
        assert_eq!(name(last), MAX_MESSAGES_PER_WINDOW.to_string());
        assert!(tokio::time::timeout(LONG, stream.next())
            .await
            .unwrap()
            .is_none());
    }
}
