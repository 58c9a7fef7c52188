//! `/containerLogs`: the provider's log, streamed to the API server as it comes.

use futures::StreamExt;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use refract_wire::proto::LogsRequest;

use super::route::Target;
use super::route::{query_flag, query_value};
use super::{Backend, Body, HttpError};

fn number(query: &str, key: &str) -> Result<Option<i64>, HttpError> {
    query_value(query, key)
        .map(|v| {
            v.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                HttpError::new(
                    StatusCode::BAD_REQUEST,
                    format!("{key}={v:?} is not a non-negative integer"),
                )
            })
        })
        .transpose()
}

/// Answers one log request.
pub async fn serve(
    backend: &Backend,
    target: &Target,
    query: &str,
) -> Result<Response<Body>, HttpError> {
    let request = LogsRequest {
        pod: Some(backend.remote(target)?),
        container: target.container.clone(),
        follow: query_flag(query, "follow"),
        tail_lines: number(query, "tailLines")?,
        since_seconds: number(query, "sinceSeconds")?,
        since_time: query_value(query, "sinceTime").unwrap_or_default(),
        timestamps: query_flag(query, "timestamps"),
        limit_bytes: number(query, "limitBytes")?,
        previous: query_flag(query, "previous"),
    };
    let stream = backend
        .client()?
        .container_logs(request)
        .await?
        .into_inner();
    // The body pulls from the gRPC stream only as the API server reads: flow control end to
    // end. The API server closing the request drops the body, which cancels the call.
    let frames = stream.map(|chunk| match chunk {
        Ok(chunk) => Ok(Frame::data(bytes::Bytes::from(chunk.data))),
        Err(status) => Err(std::io::Error::other(status.message().to_string())),
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    Ok(response)
}
