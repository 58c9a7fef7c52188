//! `PortForward`: one forwarded connection through the provider's `pods/portforward`.
//!
//! Like Kubernetes' own client, each connection gets an error stream (which only the server
//! writes) and a data stream, paired by port and request id.

use bytes::Bytes;
use refract_wire::kubelet_protocol as kp;
use refract_wire::proto::{
    port_forward_input, port_forward_output, PortForwardInput, PortForwardOutput,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::Output;
use crate::registry::KubeletSessionGuard;
use crate::shadowpod_controller::ProviderPod;

/// Outputs buffered towards the caller.
const OUTPUT_BUFFER: usize = 8;
/// The longest error message passed on.
const MAX_ERROR_BYTES: usize = 4096;

/// Opens the forward and starts the pumps.
pub async fn run(
    client: &kube::Client,
    pod: &ProviderPod,
    port: u16,
    mut inbound: Streaming<PortForwardInput>,
    guard: KubeletSessionGuard,
) -> Result<Output<PortForwardOutput>, Status> {
    let path = format!(
        "/api/v1/namespaces/{}/pods/{}/portforward",
        pod.meta().namespace(),
        pod.meta().name()
    );
    let session = super::upgrade::connect(client, &path, kp::PORT_FORWARD_V1).await?;
    let headers = |role: &str| {
        vec![
            (kp::STREAM_TYPE.to_string(), role.to_string()),
            (kp::PORT.to_string(), port.to_string()),
            (kp::REQUEST_ID.to_string(), "0".to_string()),
        ]
    };
    let open_failed = |e| Status::unavailable(format!("opening the forward: {e}"));
    let mut error = session
        .open(headers(kp::ERROR))
        .await
        .map_err(open_failed)?;
    // Only the server writes on the error stream.
    let _ = error.writer().close().await;
    let mut data = session.open(headers(kp::DATA)).await.map_err(open_failed)?;
    let writer = data.writer();

    let input_session = session.clone();
    tokio::spawn(async move {
        use port_forward_input::Kind;
        loop {
            let message = tokio::select! {
                _ = input_session.closed() => return,
                m = inbound.message() => m,
            };
            match message {
                Ok(Some(PortForwardInput {
                    kind: Some(Kind::Data(bytes)),
                })) => {
                    if writer.write(Bytes::from(bytes)).await.is_err() {
                        return;
                    }
                }
                Ok(Some(_)) => {}
                // The caller's side of the connection closed: close the write side in the pod.
                Ok(None) => {
                    let _ = writer.close().await;
                    return;
                }
                Err(_) => {
                    input_session.shutdown().await;
                    return;
                }
            }
        }
    });

    let (tx, rx) = mpsc::channel(OUTPUT_BUFFER);
    tokio::spawn(async move {
        use port_forward_output::Kind;
        let _guard = guard;
        let mut message = Vec::new();
        let mut error_open = true;
        loop {
            let out = tokio::select! {
                chunk = data.read() => match chunk {
                    Some(bytes) => {
                        // Were the data to end meanwhile, what was gathered still goes and
                        // the next read ends the loop.
                        let (bytes, _) = super::coalesce::gather(bytes, &mut data).await;
                        Kind::Data(bytes)
                    }
                    None => break,
                },
                chunk = error.read(), if error_open => {
                    match chunk {
                        Some(bytes) if message.len() + bytes.len() <= MAX_ERROR_BYTES => message.extend_from_slice(&bytes),
                        Some(_) => {}
                        None => error_open = false,
                    }
                    continue;
                }
                _ = tx.closed() => break,
            };
            if tx
                .send(Ok(PortForwardOutput { kind: Some(out) }))
                .await
                .is_err()
            {
                break;
            }
        }
        // An error the server writes arrives just before or after the data ends.
        if error_open {
            let wait = tokio::time::timeout(std::time::Duration::from_secs(1), async {
                while let Some(bytes) = error.read().await {
                    if message.len() + bytes.len() <= MAX_ERROR_BYTES {
                        message.extend_from_slice(&bytes);
                    }
                }
            });
            let _ = wait.await;
        }
        if !message.is_empty() {
            let text = String::from_utf8_lossy(&message).into_owned();
            let _ = tx
                .send(Ok(PortForwardOutput {
                    kind: Some(Kind::Error(text)),
                }))
                .await;
        }
        session.shutdown().await;
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}
