//! A provider API for unit tests of the code that calls it: answers from a table of
//! `(method, path)`, records every request with its body, and serves 404 for the rest.

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};

/// A request the API received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its method.
    pub method: Method,
    /// Its path, without the query.
    pub path: String,
    /// Its body as JSON (`Null` when empty or not JSON).
    pub body: Value,
}

/// Every request received, in order.
pub type Log = Arc<Mutex<Vec<Seen>>>;

/// A provider API answering `routes` (method, exact path → status, body); 404 otherwise.
pub fn provider(routes: Vec<(Method, &'static str, u16, Value)>) -> (kube::Client, Log) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let routes = Arc::new(routes);
    let service = tower::service_fn(move |req: Request<Body>| {
        let (seen, routes) = (seen.clone(), routes.clone());
        async move {
            let (method, path) = (req.method().clone(), req.uri().path().to_string());
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            seen.lock().unwrap().push(Seen {
                method: method.clone(),
                path: path.clone(),
                body,
            });
            let (status, body) = routes
                .iter()
                .find(|(m, p, _, _)| *m == method && path == *p)
                .map(|(_, _, s, b)| (*s, b.clone()))
                .unwrap_or((404, not_found()));
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(StatusCode::from_u16(status).unwrap())
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            )
        }
    });
    (kube::Client::new(service, "default"), log)
}

/// The requests that were not reads, as (method, path).
pub fn writes(log: &Log) -> Vec<(Method, String)> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|s| s.method != Method::GET)
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect()
}

/// The bodies of the requests of `method` to `path`.
pub fn bodies(log: &Log, method: Method, path: &str) -> Vec<Value> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|s| s.method == method && s.path == path)
        .map(|s| s.body.clone())
        .collect()
}

/// A 404 Status.
pub fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
}

/// An applier for tenant `provider`'s objects writing through `client`, with the default policy
/// and limits, and no watch of tenant objects.
pub fn applier(client: kube::Client) -> crate::apply::Applier {
    use crate::apply::{Applier, DeletionSafety, Limits};
    use crate::policy::{Policies, ProviderNetworks, TenantPolicy};
    #[allow(clippy::unwrap_used, reason = "a valid id")]
    let provider = refract_shared::tls::ClusterId::parse("provider").unwrap();
    Applier::new(
        crate::identity::Identities::shared(client),
        provider,
        Limits {
            policies: Policies::uniform(TenantPolicy::default()),
            networks: ProviderNetworks::default(),
            max_object_bytes: 64 * 1024,
            safety: DeletionSafety::default(),
            own_namespace: "refract-system".into(),
        },
        crate::objects::TenantObjects::none(),
    )
}

/// A 409 Status.
pub fn conflict() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409, "message": "already exists"})
}

/// A 403 Status saying `message`.
pub fn forbidden(message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": message})
}
