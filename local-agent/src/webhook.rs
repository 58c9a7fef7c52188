//! The mutating admission webhook for pods (`POST /mutate-pods`, AdmissionReview v1).
//!
//! A pod created in a namespace with a NamespaceOffloading gets the virtual-node toleration and
//! the node affinity its `podOffloadingStrategy` and `clusterSelector` require
//! ([`refract_shared::placement`]), so the stock scheduler places it. Anything else is allowed
//! unchanged; the webhook never refuses a pod.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::routing::post;
use axum::Json;
use base64::Engine;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use refract_shared::placement::{self, Strategy};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::crd::{self, NamespaceOffloading, PodOffloadingStrategy};

/// Serves the webhook on `listen` with the given certificate until `shutdown`.
pub async fn spawn(
    client: kube::Client,
    listen: SocketAddr,
    cert: &Path,
    key: &Path,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("failed to read --webhook-cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("failed to parse --webhook-cert {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("failed to read --webhook-key {}", key.display()))?;
    let mut tls =
        rustls::ServerConfig::builder_with_provider(refract_shared::tls::crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("webhook certificate and key do not fit together")?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

    let (store, writer) = reflector::store::<NamespaceOffloading>();
    let watch = watcher(
        Api::<NamespaceOffloading>::all(client),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .for_each(|_| futures::future::ready(()));
    let app = axum::Router::new()
        .route("/mutate-pods", post(mutate))
        .with_state(store);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("failed to bind --webhook-listen {listen}"))?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        let serve = async {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = watch => {}
            _ = serve => {}
        }
    });
    tracing::info!(%local, "admission webhook serving /mutate-pods");
    Ok(local)
}

async fn mutate(
    State(store): State<Store<NamespaceOffloading>>,
    Json(review): Json<Value>,
) -> Json<Value> {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(patch) = patch_for(&store, request) {
        let encoded = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
        response["patchType"] = "JSONPatch".into();
        response["patch"] = encoded.into();
    }
    Json(json!({
        "apiVersion": review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// The JSON patch for a pod creation request, if the pod's namespace is extended.
fn patch_for(store: &Store<NamespaceOffloading>, request: &Value) -> Option<Value> {
    if request["kind"]["kind"] != "Pod" || request["operation"] != "CREATE" {
        return None;
    }
    let namespace = request["namespace"].as_str()?;
    let nso = store.get(&ObjectRef::new(crd::NAME).within(namespace))?;
    if nso.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let strategy = match nso.spec.pod_offloading_strategy {
        PodOffloadingStrategy::Local => Strategy::Local,
        PodOffloadingStrategy::Remote => Strategy::Remote,
        PodOffloadingStrategy::LocalAndRemote => Strategy::LocalAndRemote,
    };
    let pod: Pod = serde_json::from_value(request["object"].clone()).ok()?;
    let mut spec = pod.spec?;
    if !placement::apply(&mut spec, strategy, nso.spec.cluster_selector.as_ref()) {
        return None;
    }
    let mut ops =
        vec![json!({"op": "add", "path": "/spec/tolerations", "value": spec.tolerations})];
    if spec.affinity.is_some() {
        ops.push(json!({"op": "add", "path": "/spec/affinity", "value": spec.affinity}));
    }
    Some(Value::Array(ops))
}
