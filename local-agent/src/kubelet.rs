//! The kubelet API of the virtual node, answered by the provider over the link.
//!
//! The origin's API server calls this endpoint for `kubectl logs`, `exec`, `attach`,
//! `port-forward` and node stats of pods on the virtual node, as it calls any kubelet: HTTPS on
//! the address and port the node advertises. Each request is authenticated and authorized as a
//! kubelet does ([`auth`]), mapped to the provider pod this agent offloaded the origin pod as,
//! and carried as its own `refract.v1.Kubelet` call on the link's connection ([`logs`],
//! [`remote_command`], [`port_forward`], [`stats`]). The provider's credentials never come here.

mod logs;
mod port_forward;
mod remote_command;
pub mod route;
pub mod stats;
mod upgrade;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use refract_shared::tls::serving::{self, ServingCert};
use refract_wire::proto::kubelet_client::KubeletClient;
use refract_wire::proto::PodRef;
use rustls::server::WebPkiClientVerifier;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::key::Key;
use crate::link::SessionTx;
use crate::pods::PodOffloader;
use refract_shared::kube_auth::{self as auth, token_cache, User};
use route::{Route, Target};

/// The body of every response.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// Where and how the endpoint is served.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Serving certificate, re-read when it changes.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// CA bundle for client certificates (the API server's kubelet client certificate). Without
    /// it, only bearer tokens are accepted.
    pub client_ca: Option<PathBuf>,
    /// How often the serving certificate is checked for changes.
    pub cert_poll: Duration,
}

/// What requests are answered from.
#[derive(Clone)]
pub struct Backend {
    /// The origin's API server (for token and access reviews).
    pub origin: kube::Client,
    /// The link's current session.
    pub sessions: watch::Receiver<Option<SessionTx>>,
    /// Which origin pods were offloaded as which provider pods.
    pub pods: Arc<PodOffloader>,
    /// The virtual node's name.
    pub node_name: String,
    /// When the agent started, nanoseconds since the Unix epoch (the node's start time).
    pub started_unix_nanos: i64,
    /// Allowed access decisions, reused for a while.
    pub decisions: Arc<auth::DecisionCache>,
    /// Token reviews, reused for a while, and failed authentications per source.
    pub tokens: Arc<token_cache::TokenCache>,
}

/// A request that ends before reaching the provider, with the status a kubelet would give.
#[derive(Debug)]
pub struct HttpError {
    /// The status.
    pub status: StatusCode,
    /// The body.
    pub message: String,
}

impl HttpError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn into_response(self) -> Response<Body> {
        text(self.status, self.message)
    }
}

impl From<tonic::Status> for HttpError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let status = match s.code() {
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable | Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, format!("provider: {}", s.message()))
    }
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    typed(status, "text/plain; charset=utf-8", body)
}

/// A whole response of `content_type`.
fn typed(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<String>,
) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// A whole body.
pub fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|e: Infallible| match e {}).boxed()
}

impl Backend {
    /// A client of the provider's kubelet service on the current session.
    fn client(&self) -> Result<KubeletClient<tonic::transport::Channel>, HttpError> {
        self.sessions
            .borrow()
            .as_ref()
            .map(|s| KubeletClient::new(s.calls.clone()))
            .ok_or_else(|| {
                HttpError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the virtual node is not connected to its provider; try again when it is",
                )
            })
    }

    /// The provider pod the target pod was offloaded as.
    fn remote(&self, target: &Target) -> Result<PodRef, HttpError> {
        let key = Key {
            namespace: target.namespace.clone(),
            name: target.pod.clone(),
        };
        let not_here = || {
            HttpError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "pod {}/{} is not offloaded through virtual node {}",
                    target.namespace, target.pod, self.node_name
                ),
            )
        };
        let (namespace, name, uid) = self.pods.offloaded(&key).ok_or_else(not_here)?;
        if target.uid.as_ref().is_some_and(|u| *u != uid) {
            return Err(not_here());
        }
        Ok(PodRef { namespace, name })
    }
}

/// Serves the endpoint until `shutdown`; returns the bound address.
pub async fn spawn(
    config: KubeletConfig,
    backend: Backend,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let cert = ServingCert::watch(
        config.cert.clone(),
        config.key.clone(),
        config.cert_poll,
        shutdown.clone(),
    )
    .context("failed to load the kubelet serving certificate (--kubelet-cert, --kubelet-key)")?;
    let provider = refract_shared::tls::crypto_provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &config.client_ca {
        Some(ca) => {
            let roots = serving::load_roots(ca).context("failed to load --kubelet-client-ca")?;
            // A missing client certificate is allowed here: a bearer token may still follow.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_cert_resolver(cert);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("failed to bind --kubelet-listen {}", config.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, node = %backend.node_name, "serving the virtual node's kubelet API");
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(_) => continue,
                },
            };
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                else {
                    return;
                };
                let cert_user = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|leaf| refract_shared::tls::identity::kubernetes_user(leaf).ok())
                    .map(|(name, groups)| User {
                        name,
                        groups,
                        ..Default::default()
                    });
                let service = hyper::service::service_fn(move |req| {
                    let (backend, cert_user) = (backend.clone(), cert_user.clone());
                    async move { Ok::<_, Infallible>(handle(backend, cert_user, peer.ip(), req).await) }
                });
                // A caller that never finishes its request headers is dropped.
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(30))
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Ok(local)
}

async fn handle(
    backend: Backend,
    cert_user: Option<User>,
    source: std::net::IpAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    tracing::debug!(method = %req.method(), path = %req.uri().path(), upgrade = ?req.headers().get(http::header::UPGRADE), "kubelet request");
    let Some(route) = Route::parse(req.uri().path()) else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    let user = match cert_user {
        Some(user) => user,
        None => {
            let header = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            match backend
                .tokens
                .bearer_user(&backend.origin, header, source)
                .await
            {
                Ok(user) => user,
                Err(e) => return text(e.http_status(), e.to_string()),
            }
        }
    };
    let verb = route::verb(req.method());
    let access = auth::Access::Node {
        verb,
        subresource: route.subresource(),
        node: &backend.node_name,
    };
    if let Err(e) = backend
        .decisions
        .authorize(&backend.origin, &user, &access)
        .await
    {
        let status = e.http_status();
        tracing::info!(user = %user.name, verb, path = %req.uri().path(), error = %e, "kubelet request refused");
        return text(status, e.to_string());
    }
    let result = match route {
        Route::Healthz => Ok(text(StatusCode::OK, "ok")),
        Route::ContainerLogs(target) => {
            logs::serve(&backend, &target, req.uri().query().unwrap_or_default()).await
        }
        Route::Exec(target) => {
            remote_command::serve(&backend, target, remote_command::Call::Exec, req)
        }
        Route::Attach(target) => {
            remote_command::serve(&backend, target, remote_command::Call::Attach, req)
        }
        Route::PortForward(target) => port_forward::serve(&backend, target, req),
        Route::StatsSummary => node_stats(&backend).await.map(|pods| {
            let summary = stats::summary(&backend.node_name, backend.started_unix_nanos, &pods);
            typed(StatusCode::OK, "application/json", summary.to_string())
        }),
        Route::MetricsResource => node_stats(&backend).await.map(|pods| {
            typed(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                stats::resource_metrics(&pods),
            )
        }),
    };
    result.unwrap_or_else(HttpError::into_response)
}

/// The most containers of one pod shown in the stats; the provider's answer is not trusted
/// to be sane.
const MAX_CONTAINERS_PER_POD: usize = 64;

/// The provider's figures for the pods this agent offloaded, named as at the origin.
async fn node_stats(backend: &Backend) -> Result<Vec<stats::OriginPodStats>, HttpError> {
    let answer = backend
        .client()?
        .pod_stats(refract_wire::proto::PodStatsRequest {})
        .await?
        .into_inner();
    let mut seen = std::collections::HashSet::new();
    Ok(answer
        .pods
        .into_iter()
        .filter_map(|mut p| {
            let remote = p.pod.as_ref()?;
            // Only pods this agent offloaded, each once: anything else is dropped.
            let (key, uid) = backend.pods.origin_of(&remote.namespace, &remote.name)?;
            if !seen.insert(uid.clone()) {
                return None;
            }
            p.containers.truncate(MAX_CONTAINERS_PER_POD);
            Some(stats::OriginPodStats {
                namespace: key.namespace,
                name: key.name,
                uid,
                stats: p,
            })
        })
        .collect())
}
