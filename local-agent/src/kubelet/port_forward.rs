//! `/portForward`: a kubectl SPDY session (`portforward.k8s.io`) whose forwarded connections
//! each become one provider `PortForward` call.
//!
//! For every connection the client opens an error stream and a data stream with the same
//! port and request id. Once both are here the call starts: data both ways, the client's
//! half-close passed on, the provider's errors written on the error stream, and both streams
//! closed when the call ends. The session lives until the client closes it.

use std::collections::HashMap;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use refract_wire::kubelet_protocol as kp;
use refract_wire::proto::kubelet_client::KubeletClient;
use refract_wire::proto::{
    port_forward_input, port_forward_output, PodRef, PortForwardInput, PortForwardStart,
};
use refract_wire::spdy::{headers, Session, Stream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::route::Target;
use super::{upgrade, Backend, Body, HttpError};

/// Unpaired streams one session may hold; a client that opens more without pairing them is
/// misbehaving, and its session is ended.
const MAX_UNPAIRED: usize = 64;

#[derive(Default)]
struct Pair {
    error: Option<Stream>,
    data: Option<Stream>,
}

/// Answers the upgrade and serves the session in the background.
pub fn serve(
    backend: &Backend,
    target: Target,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, HttpError> {
    let pod = backend.remote(&target)?;
    let client = backend.client()?;
    let (response, session) = upgrade::accept(&mut req, kp::PORT_FORWARD_V1)?;
    tokio::spawn(async move {
        if let Some((session, accepted)) = session.await {
            pair_streams(session, accepted, pod, client).await;
        }
    });
    Ok(response)
}

async fn pair_streams(
    session: Session,
    mut accepted: mpsc::Receiver<Stream>,
    pod: PodRef,
    client: KubeletClient<tonic::transport::Channel>,
) {
    let mut pending: HashMap<(String, String), Pair> = HashMap::new();
    while let Some(stream) = accepted.recv().await {
        tracing::debug!(id = stream.id, headers = ?stream.headers, "port-forward stream");
        let port = headers::get(&stream.headers, kp::PORT)
            .unwrap_or_default()
            .to_string();
        let request = headers::get(&stream.headers, kp::REQUEST_ID)
            .unwrap_or_default()
            .to_string();
        let key = (port, request);
        let pair = pending.entry(key.clone()).or_default();
        match headers::get(&stream.headers, kp::STREAM_TYPE) {
            Some(kp::ERROR) => pair.error = Some(stream),
            Some(kp::DATA) => pair.data = Some(stream),
            _ => {
                stream.writer().reset().await;
                continue;
            }
        }
        if pair.error.is_some() && pair.data.is_some() {
            if let Some(Pair {
                error: Some(error),
                data: Some(data),
            }) = pending.remove(&key)
            {
                tokio::spawn(forward(key.0, pod.clone(), client.clone(), error, data));
            }
        } else if pending.len() > MAX_UNPAIRED {
            tracing::warn!(
                "port-forward client left too many streams unpaired; ending its session"
            );
            break;
        }
    }
    session.shutdown().await;
}

async fn forward(
    port: String,
    pod: PodRef,
    mut client: KubeletClient<tonic::transport::Channel>,
    error: Stream,
    mut data: Stream,
) {
    let (error_w, data_w) = (error.writer(), data.writer());
    // Only this side writes on the error stream; dropping its reader discards whatever a
    // client sends there instead of letting it fill the buffer and stall the session.
    drop(error);
    let fail = |message: String| async {
        let _ = error_w.write(Bytes::from(message)).await;
        let _ = error_w.close().await;
        let _ = data_w.close().await;
    };
    let Ok(port_number) = port.parse::<u16>() else {
        fail(format!("invalid port {port:?}")).await;
        return;
    };
    let (tx, rx) = mpsc::channel(8);
    let _ = tx
        .send(PortForwardInput {
            kind: Some(port_forward_input::Kind::Start(PortForwardStart {
                pod: Some(pod),
                port: u32::from(port_number),
            })),
        })
        .await;
    let mut outputs = match client.port_forward(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            fail(format!("provider: {}", status.message())).await;
            return;
        }
    };
    // Client → pod; the client's half-close ends the request stream, which the provider
    // passes on as a half-close in the pod.
    let upload = tokio::spawn(async move {
        while let Some(bytes) = data.read().await {
            let input = PortForwardInput {
                kind: Some(port_forward_input::Kind::Data(bytes.to_vec())),
            };
            if tx.send(input).await.is_err() {
                return;
            }
        }
    });
    let mut message = None;
    loop {
        match outputs.message().await {
            Ok(Some(out)) => match out.kind {
                Some(port_forward_output::Kind::Data(bytes)) => {
                    let written = data_w.write(Bytes::from(bytes)).await;
                    if written.is_err() {
                        break;
                    }
                }
                // The provider's words, bounded before they reach kubectl.
                Some(port_forward_output::Kind::Error(text)) => message = Some(kp::truncate(&text)),
                None => {}
            },
            Ok(None) => break,
            Err(status) => {
                message = Some(format!("provider: {}", status.message()));
                break;
            }
        }
    }
    upload.abort();
    if let Some(text) = message {
        let _ = error_w.write(Bytes::from(text)).await;
    }
    let _ = error_w.close().await;
    let _ = data_w.close().await;
}
