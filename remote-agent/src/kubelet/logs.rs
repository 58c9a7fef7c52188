//! `ContainerLogs`: the provider's `pods/log`, streamed in chunks as they come.

use futures::{AsyncReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use refract_wire::proto::{LogChunk, LogsRequest};
use tonic::Status;

use super::{coalesce, Output};
use crate::registry::KubeletSessionGuard;
use crate::shadowpod_controller::ProviderPod;

/// Opens the log; the returned stream ends with it, or when the caller goes away (tonic drops
/// the stream, which drops the provider's response).
pub async fn stream(
    client: &kube::Client,
    pod: &ProviderPod,
    request: LogsRequest,
    guard: KubeletSessionGuard,
) -> Result<Output<LogChunk>, Status> {
    let since_time = match request.since_time.as_str() {
        "" => None,
        t => Some(t.parse().map_err(|e| {
            Status::invalid_argument(format!("sinceTime {t:?} is not an RFC 3339 time: {e}"))
        })?),
    };
    let params = LogParams {
        container: (!request.container.is_empty()).then(|| request.container.clone()),
        follow: request.follow,
        limit_bytes: request.limit_bytes,
        pretty: false,
        previous: request.previous,
        since_seconds: request.since_seconds,
        since_time,
        tail_lines: request.tail_lines,
        timestamps: request.timestamps,
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), pod.meta().namespace());
    let reader = api
        .log_stream(pod.meta().name(), &params)
        .await
        .map_err(kube_status)?;
    let chunks = futures::stream::unfold(
        (Box::pin(reader), guard),
        |(mut reader, guard)| async move {
            match next_chunk(&mut reader).await {
                Ok(buf) if buf.is_empty() => None,
                Ok(buf) => Some((Ok(LogChunk { data: buf }), (reader, guard))),
                Err(e) => Some((
                    Err(Status::unavailable(format!(
                        "the provider's log stream broke: {e}"
                    ))),
                    (reader, guard),
                )),
            }
        },
    );
    // One error ends the stream.
    let mut failed = false;
    Ok(Box::pin(chunks.take_while(move |r| {
        let go = !failed;
        failed |= r.is_err();
        futures::future::ready(go)
    })))
}

/// The log's next bytes, and whatever follows them within [`coalesce::LINGER`] (lines written
/// together leave in one message, see [`coalesce`]); empty at the end of the log.
async fn next_chunk(reader: &mut (impl futures::AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; coalesce::MAX_CHUNK];
    let mut filled = reader.read(&mut buf).await?;
    let deadline = tokio::time::Instant::now() + coalesce::LINGER;
    while filled > 0 && filled < buf.len() {
        // Reading is cancel-safe: a read the deadline drops has taken nothing.
        match tokio::time::timeout_at(deadline, reader.read(&mut buf[filled..])).await {
            Ok(Ok(n)) if n > 0 => filled += n,
            // The end, an error or the deadline: what was read leaves now. The end shows again
            // on the next read; an error may show there as the end.
            _ => break,
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// An API error as the gRPC status a caller can act on.
pub fn kube_status(e: kube::Error) -> Status {
    match &e {
        kube::Error::Api(s) if s.code == 404 => Status::not_found(s.message.clone()),
        kube::Error::Api(s) if s.code == 400 => Status::failed_precondition(s.message.clone()),
        kube::Error::Api(s) if s.code == 403 || s.code == 401 => {
            Status::permission_denied(s.message.clone())
        }
        _ => Status::unavailable(format!("the provider's API server: {e}")),
    }
}
