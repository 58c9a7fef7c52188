//! The admission webhooks (AdmissionReview v1).
//!
//! `POST /mutate-pods`: a pod created in a namespace with a NamespaceOffloading gets the
//! virtual-node toleration and the node affinity its `podOffloadingStrategy` and
//! `clusterSelector` require ([`refract_core::placement`]), so the stock scheduler places it.
//! Anything else is allowed unchanged; the webhook itself never refuses a pod. deploy/ calls it
//! for the namespaces the scheduling gate labels, and fails closed there: while no local agent
//! serves, the API server refuses pods of offloaded namespaces rather than run them at the
//! origin.
//!
//! `POST /gate-namespace`: a NamespaceOffloading that lets pods leave has its namespace
//! labelled ([`crate::scheduling_gate`]) before it is admitted, so pods created after it in the
//! same `kubectl apply` already meet the pod webhook. It never refuses anything.
//!
//! The NamespaceOffloading is looked up in a watch cache first. A `kubectl apply` that creates
//! the namespace, its NamespaceOffloading and its pods in one go can reach the webhook before the
//! watch has delivered the NamespaceOffloading, so a miss is checked against the API server:
//! a pod left unmutated would wait Pending forever in an origin without a fitting node.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::routing::post;
use axum::Json;
use base64::Engine;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use refract_core::placement::{self, Strategy};
use refract_shared::tls::serving::ServingCert;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::crd::{self, NamespaceOffloading, PodOffloadingStrategy};

/// Serves the webhook on `listen` with the given certificate (re-read every `cert_poll`) until
/// `shutdown`, reading NamespaceOffloadings from `store` (the agent's one watch of them).
pub async fn spawn(
    client: kube::Client,
    store: Store<NamespaceOffloading>,
    listen: SocketAddr,
    cert: &Path,
    key: &Path,
    cert_poll: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    // Followed in place: cert-manager renews the webhook's certificate without a restart.
    let served = ServingCert::watch(
        cert.to_path_buf(),
        key.to_path_buf(),
        cert_poll,
        shutdown.clone(),
    )
    .context("failed to load the webhook certificate (--webhook-cert, --webhook-key)")?;
    let mut tls =
        rustls::ServerConfig::builder_with_provider(refract_shared::tls::crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(served);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

    let app = axum::Router::new()
        .route("/mutate-pods", post(mutate))
        .route("/gate-namespace", post(gate))
        .with_state(OffloadingLookup { store, client });
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
            _ = serve => {}
        }
    });
    tracing::info!(%local, "admission webhook serving /mutate-pods and /gate-namespace");
    Ok(local)
}

/// Where the webhook finds a namespace's NamespaceOffloading: the watch cache, then the API.
#[derive(Clone)]
struct OffloadingLookup {
    store: Store<NamespaceOffloading>,
    client: kube::Client,
}

/// How long a cache miss may wait on the API server; the webhook itself has 5 s.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

impl OffloadingLookup {
    async fn of(&self, namespace: &str) -> Option<Arc<NamespaceOffloading>> {
        if let Some(nso) = self.store.get(&ObjectRef::new(crd::NAME).within(namespace)) {
            return Some(nso);
        }
        let api = Api::<NamespaceOffloading>::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(crd::NAME)).await {
            Ok(Ok(found)) => found.map(Arc::new),
            Ok(Err(error)) => {
                tracing::warn!(namespace, %error, "cannot read the NamespaceOffloading; pod admitted unchanged");
                None
            }
            Err(_) => {
                tracing::warn!(
                    namespace,
                    "reading the NamespaceOffloading timed out; pod admitted unchanged"
                );
                None
            }
        }
    }
}

async fn mutate(State(lookup): State<OffloadingLookup>, Json(review): Json<Value>) -> Json<Value> {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": true});
    let nso = match pod_creation_namespace(request) {
        Some(namespace) => lookup.of(namespace).await,
        None => None,
    };
    if let Some(patch) = nso.and_then(|nso| patch_for(&nso, request)) {
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

/// Labels the namespace of an admitted NamespaceOffloading that lets pods leave, then allows
/// it. A label that cannot be set in time is left to the scheduling gate.
async fn gate(State(lookup): State<OffloadingLookup>, Json(review): Json<Value>) -> Json<Value> {
    let request = &review["request"];
    if let Some(namespace) = gated_namespace(request) {
        let namespaces = Api::<Namespace>::all(lookup.client.clone());
        let labelled = tokio::time::timeout(
            LOOKUP_TIMEOUT,
            crate::scheduling_gate::set_label(&namespaces, namespace, true),
        )
        .await;
        if !matches!(labelled, Ok(true)) {
            tracing::warn!(
                namespace,
                "could not label the namespace while admitting its NamespaceOffloading; the scheduling gate will"
            );
        }
    }
    Json(json!({
        "apiVersion": review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": {"uid": request["uid"].clone(), "allowed": true},
    }))
}

/// The namespace to label for a NamespaceOffloading admission request: one named `offloading`
/// whose strategy lets pods leave, really created or updated (not a dry run).
fn gated_namespace(request: &Value) -> Option<&str> {
    if request["kind"]["kind"] != "NamespaceOffloading"
        || !matches!(request["operation"].as_str(), Some("CREATE" | "UPDATE"))
        || request["dryRun"] == true
    {
        return None;
    }
    let namespace = request["namespace"].as_str()?;
    let mut nso: NamespaceOffloading = serde_json::from_value(request["object"].clone()).ok()?;
    nso.metadata.namespace = Some(namespace.to_string());
    let gated = crate::scheduling_gate::gated(std::slice::from_ref(&nso));
    gated.contains(namespace).then_some(namespace)
}

/// The namespace of a pod creation request; `None` for anything else.
fn pod_creation_namespace(request: &Value) -> Option<&str> {
    if request["kind"]["kind"] != "Pod" || request["operation"] != "CREATE" {
        return None;
    }
    request["namespace"].as_str()
}

/// The JSON patch for a pod creation request in a namespace with NamespaceOffloading `nso`.
fn patch_for(nso: &NamespaceOffloading, request: &Value) -> Option<Value> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn review(kind: &str, operation: &str, strategy: &str, name: &str, dry_run: bool) -> Value {
        json!({
            "kind": {"kind": kind},
            "operation": operation,
            "namespace": "shop",
            "dryRun": dry_run,
            "object": {
                "apiVersion": "offloading.refract.io/v1alpha1",
                "kind": "NamespaceOffloading",
                "metadata": {"name": name},
                "spec": {"podOffloadingStrategy": strategy},
            },
        })
    }

    #[test]
    fn a_namespace_offloading_that_lets_pods_leave_gates_its_namespace() {
        let gate = |r: &Value| gated_namespace(r).map(str::to_string);
        for (operation, strategy) in [("CREATE", "Remote"), ("UPDATE", "LocalAndRemote")] {
            let r = review(
                "NamespaceOffloading",
                operation,
                strategy,
                "offloading",
                false,
            );
            assert_eq!(gate(&r).as_deref(), Some("shop"), "{operation} {strategy}");
        }
        for r in [
            review(
                "NamespaceOffloading",
                "CREATE",
                "Local",
                "offloading",
                false,
            ),
            review(
                "NamespaceOffloading",
                "CREATE",
                "Remote",
                "other-name",
                false,
            ),
            review(
                "NamespaceOffloading",
                "CREATE",
                "Remote",
                "offloading",
                true,
            ),
            review(
                "NamespaceOffloading",
                "DELETE",
                "Remote",
                "offloading",
                false,
            ),
            review("Pod", "CREATE", "Remote", "offloading", false),
        ] {
            assert_eq!(gate(&r), None, "{r}");
        }
    }
}
