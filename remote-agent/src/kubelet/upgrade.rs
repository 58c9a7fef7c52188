//! Opens a SPDY session with the provider's API server for a pod's `exec`, `attach` or
//! `portforward` subresource, authenticated as this agent by its kube client.

use http::header::{CONNECTION, UPGRADE};
use http::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use refract_wire::kubelet_protocol::{PROTOCOL_HEADER, SPDY_UPGRADE};
use refract_wire::spdy::{self, Role, Session};
use tonic::Status;

/// Why the API server did not open the session.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The request could not be sent.
    #[error("the provider's API server could not be reached: {0}")]
    Request(#[from] kube::Error),
    /// It answered without upgrading.
    #[error("the provider's API server answered {status}: {message}")]
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// Its Status message, or the body.
        message: String,
    },
    /// It upgraded with another protocol than asked.
    #[error("the provider's API server chose protocol {0:?}")]
    Protocol(String),
    /// The upgrade itself failed.
    #[error("the connection upgrade failed: {0}")]
    Upgrade(String),
}

impl From<UpgradeError> for Status {
    fn from(e: UpgradeError) -> Self {
        match &e {
            UpgradeError::Refused { status, .. } if *status == StatusCode::NOT_FOUND => {
                Status::not_found(e.to_string())
            }
            UpgradeError::Refused { status, .. }
                if *status == StatusCode::FORBIDDEN || *status == StatusCode::UNAUTHORIZED =>
            {
                Status::permission_denied(e.to_string())
            }
            UpgradeError::Refused { status, .. } if status.is_client_error() => {
                Status::failed_precondition(e.to_string())
            }
            _ => Status::unavailable(e.to_string()),
        }
    }
}

/// POSTs `path_and_query` asking for a SPDY upgrade speaking `protocol`; returns the session.
pub async fn connect(
    client: &kube::Client,
    path_and_query: &str,
    protocol: &str,
) -> Result<Session, UpgradeError> {
    let request = Request::builder()
        .method(Method::POST)
        .uri(path_and_query)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, SPDY_UPGRADE)
        .header(PROTOCOL_HEADER, protocol)
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| UpgradeError::Upgrade(e.to_string()))?;
    let response = client.send(request).await?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned());
        return Err(UpgradeError::Refused { status, message });
    }
    let chosen = response
        .headers()
        .get(PROTOCOL_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if chosen != protocol {
        return Err(UpgradeError::Protocol(chosen));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| UpgradeError::Upgrade(e.to_string()))?;
    Ok(spdy::start(TokioIo::new(upgraded), Role::Client).0)
}

/// Appends `key=value` to a query string, percent-encoding the value.
pub fn query_pair(query: &mut String, key: &str, value: &str) {
    query.push(if query.is_empty() { '?' } else { '&' });
    query.push_str(key);
    query.push('=');
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            query.push(b as char);
        } else {
            query.push_str(&format!("%{b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        let mut q = String::new();
        query_pair(&mut q, "command", "sh");
        query_pair(&mut q, "command", "echo a&b=c");
        assert_eq!(q, "?command=sh&command=echo%20a%26b%3Dc");
    }
}
