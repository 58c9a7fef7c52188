//! A tenant speaking the wire protocol by hand: what a compromised origin (or anyone holding a
//! tenant's certificate) can send. It dials the remote agent with the local agent's own
//! connector (mutual TLS, the provider's identity checked), says Hello, and then sends whatever
//! objects a test forges, one request at a time, returning the remote agent's Ack.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use refract_local_agent::connector::Connector;
use refract_shared::tls::{self, ClusterId, TlsFiles, Watched};
use refract_wire::proto::reflection_client::ReflectionClient;
use refract_wire::proto::{
    local_message, remote_message, Ack, Delete, Hello, LocalMessage, ObjectRef, Outcome,
    RemoteMessage, Upsert,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

/// How long the remote agent has to answer one request.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// One open stream of a hand-driven tenant.
pub struct Wire {
    tx: mpsc::Sender<LocalMessage>,
    inbound: Streaming<RemoteMessage>,
    revision: u64,
    _stop: tokio_util::sync::DropGuard,
}

/// What the remote agent answered.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The outcome.
    pub outcome: Outcome,
    /// Its explanation.
    pub message: String,
}

impl Wire {
    /// Opens a stream to `remote` (`127.0.0.1:port`, provider `provider`) as `tenant`, with
    /// the certificate folder `certs` (tls.crt, tls.key, ca.crt).
    pub async fn open(
        remote: &str,
        provider: &str,
        tenant: &str,
        certs: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let channel = connect(remote, provider, certs, &stop).await?;
        Self::on(channel, tenant, stop).await
    }

    /// Opens a stream as `tenant` on `channel`, a connection that may carry other calls too;
    /// `stop` is cancelled when the stream is dropped.
    pub async fn on(
        channel: tonic::transport::Channel,
        tenant: &str,
        stop: CancellationToken,
    ) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(LocalMessage {
            kind: Some(local_message::Kind::Hello(Hello {
                cluster_id: tenant.to_string(),
                agent_version: "forger".into(),
                protocol_version: refract_wire::proto::PROTOCOL_VERSION,
                resume: false,
            })),
        })
        .await?;
        let mut inbound = ReflectionClient::new(channel)
            .sync(ReceiverStream::new(rx))
            .await?
            .into_inner();
        match inbound.message().await? {
            Some(RemoteMessage {
                kind: Some(remote_message::Kind::Welcome(_)),
            }) => {}
            other => bail!("expected Welcome, got {other:?}"),
        }
        Ok(Self {
            tx,
            inbound,
            revision: 0,
            _stop: stop.drop_guard(),
        })
    }

    /// The stream's sending half, to send without waiting for answers (and without reading
    /// them: a tenant that stops reading its stream).
    pub fn sender(&self) -> mpsc::Sender<LocalMessage> {
        self.tx.clone()
    }

    /// The next message the remote agent sends on this stream, for a client that pipelines
    /// its requests through [`Wire::sender`]; `None` once the remote agent closed the stream.
    pub async fn next_message(&mut self) -> anyhow::Result<Option<RemoteMessage>> {
        Ok(self.inbound.message().await?)
    }

    /// Sends `object` (a whole Kubernetes object) as an Upsert and waits for its Ack.
    pub async fn upsert(&mut self, object: &serde_json::Value) -> anyhow::Result<Answer> {
        self.upsert_bytes(object_ref(object), serde_json::to_vec(object)?)
            .await
    }

    /// Sends an Upsert of `object` with `json` as the object's bytes, whatever they are.
    pub async fn upsert_bytes(
        &mut self,
        object: ObjectRef,
        json: Vec<u8>,
    ) -> anyhow::Result<Answer> {
        self.revision += 1;
        let upsert = Upsert {
            object: Some(object.clone()),
            revision: self.revision.to_string(),
            object_json: json,
            origin_uid: String::new(),
            // This client waits on each answer, as the local agent does for a twin namespace.
            awaited: true,
            trace_parent: String::new(),
        };
        self.request(local_message::Kind::Upsert(upsert), &object)
            .await
    }

    /// Sends a Delete of `object` and waits for its Ack.
    pub async fn delete(&mut self, object: ObjectRef) -> anyhow::Result<Answer> {
        self.revision += 1;
        let delete = Delete {
            object: Some(object.clone()),
            revision: self.revision.to_string(),
            grace_period_seconds: None,
        };
        self.request(local_message::Kind::Delete(delete), &object)
            .await
    }

    async fn request(
        &mut self,
        kind: local_message::Kind,
        object: &ObjectRef,
    ) -> anyhow::Result<Answer> {
        let revision = self.revision.to_string();
        self.tx
            .send(LocalMessage { kind: Some(kind) })
            .await
            .context("stream closed")?;
        let ack = tokio::time::timeout(ANSWER_WITHIN, self.ack_for(object, &revision))
            .await
            .with_context(|| format!("no Ack for {} within {ANSWER_WITHIN:?}", object.name))??;
        Ok(Answer {
            outcome: Outcome::try_from(ack.outcome).unwrap_or(Outcome::Unspecified),
            message: ack.message,
        })
    }

    async fn ack_for(&mut self, object: &ObjectRef, revision: &str) -> anyhow::Result<Ack> {
        loop {
            let Some(message) = self.inbound.message().await? else {
                bail!("the remote agent closed the stream");
            };
            if let Some(remote_message::Kind::Ack(ack)) = message.kind {
                if ack.object.as_ref() == Some(object) && ack.revision == revision {
                    return Ok(ack);
                }
            }
        }
    }
}

/// One mutual-TLS connection to `remote` (provider `provider`) with the certificate folder
/// `certs`, as the local agent makes it; every call on the channel shares it. The certificate
/// files are watched until `stop` is cancelled.
pub async fn connect(
    remote: &str,
    provider: &str,
    certs: &std::path::Path,
    stop: &CancellationToken,
) -> anyhow::Result<tonic::transport::Channel> {
    let connector = connector(remote, provider, certs, stop)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{remote}"))?
        .initial_stream_window_size(refract_core::limits::STREAM_WINDOW_BYTES)
        .initial_connection_window_size(refract_core::limits::CONNECTION_WINDOW_BYTES)
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move { connector.connect().await }
        }))
        .await
        .context("dial the remote agent")?;
    Ok(channel)
}

/// What dials `remote` (provider `provider`) with the certificate folder `certs`, as the local
/// agent dials.
fn connector(
    remote: &str,
    provider: &str,
    certs: &std::path::Path,
    stop: &CancellationToken,
) -> anyhow::Result<Connector> {
    tls::install_default_crypto_provider();
    let files = TlsFiles::in_folder(certs);
    let tls: Watched<Arc<rustls::ClientConfig>> = Watched::spawn(
        files,
        Duration::from_secs(60),
        tls::client_config,
        stop.clone(),
    )
    .context("client certificate")?;
    Ok(Connector {
        addr: remote.to_string(),
        server_name: rustls::pki_types::ServerName::try_from("localhost")?.to_owned(),
        expected: ClusterId::parse(provider)?,
        tls,
    })
}

/// A bare mutual-TLS connection to `remote`, handshaken and nothing sent on it.
pub async fn tls_connection(
    remote: &str,
    provider: &str,
    certs: &std::path::Path,
    stop: &CancellationToken,
) -> anyhow::Result<impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> {
    let io = connector(remote, provider, certs, stop)?.connect().await?;
    Ok(io.into_inner())
}

/// An Upsert message of `object` at `revision`.
pub fn upsert_message(object: &serde_json::Value, revision: u64) -> LocalMessage {
    LocalMessage {
        kind: Some(local_message::Kind::Upsert(Upsert {
            object: Some(object_ref(object)),
            revision: revision.to_string(),
            object_json: serde_json::to_vec(object).expect("JSON serializes"),
            origin_uid: String::new(),
            awaited: false,
            trace_parent: String::new(),
        })),
    }
}

/// A Delete message of `object` at `revision`.
pub fn delete_message(object: &serde_json::Value, revision: u64) -> LocalMessage {
    LocalMessage {
        kind: Some(local_message::Kind::Delete(Delete {
            object: Some(object_ref(object)),
            revision: revision.to_string(),
            grace_period_seconds: None,
        })),
    }
}

/// The envelope naming `object`.
pub fn object_ref(object: &serde_json::Value) -> ObjectRef {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    ObjectRef {
        api_version: s(&object["apiVersion"]),
        kind: s(&object["kind"]),
        namespace: s(&object["metadata"]["namespace"]),
        name: s(&object["metadata"]["name"]),
    }
}
