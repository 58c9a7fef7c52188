//! Answering a SPDY upgrade the way a kubelet does: pick a protocol version the client offers,
//! switch protocols, and hand the upgraded connection to a SPDY session.

use http::header::{CONNECTION, UPGRADE};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use refract_wire::kubelet_protocol::{PROTOCOL_HEADER, SPDY_UPGRADE};
use refract_wire::spdy::{self, Role, Session, Stream};
use tokio::sync::mpsc;

use super::{full, Body, HttpError};

/// A session once the connection has switched, or `None` when it never did.
pub type Switched = Option<(Session, mpsc::Receiver<Stream>)>;

/// Checks the request asks for a SPDY upgrade offering `protocol`; returns the 101 to send and
/// a future resolving to the session once the connection has switched.
pub fn accept(
    req: &mut Request<Incoming>,
    protocol: &'static str,
) -> Result<
    (
        Response<Body>,
        impl std::future::Future<Output = Switched> + Send + 'static,
    ),
    HttpError,
> {
    let upgrade = req
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !upgrade.eq_ignore_ascii_case(SPDY_UPGRADE) {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            format!("this endpoint needs a {SPDY_UPGRADE} upgrade (got {upgrade:?})"),
        ));
    }
    let offered = req
        .headers()
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == protocol);
    if !offered {
        return Err(HttpError::new(
            StatusCode::FORBIDDEN,
            format!("the client offers no protocol this kubelet speaks (it speaks {protocol})"),
        ));
    }
    let on_upgrade = hyper::upgrade::on(req);
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, SPDY_UPGRADE)
        .header(PROTOCOL_HEADER, protocol)
        .body(full(bytes::Bytes::new()))
        .map_err(|e| {
            HttpError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("failed to build the protocol switch: {e}"),
            )
        })?;
    let session = async move {
        match on_upgrade.await {
            Ok(upgraded) => Some(spdy::start(TokioIo::new(upgraded), Role::Server)),
            Err(error) => {
                tracing::debug!(%error, "the connection did not switch protocols");
                None
            }
        }
    };
    Ok((response, session))
}
