//! `refract.v1.Inspect`: a read-only view for operators.
//!
//! A caller sees only its own tenant, unless its identity is one of `--inspect-admin`. Tap
//! shows messages as they crossed the link, with Secret data redacted (the registry redacts
//! what it copies to the tap).

use std::pin::Pin;

use futures::Stream;
use refract_shared::tls::ClusterId;
use refract_wire::proto::inspect_server::Inspect;
use refract_wire::proto::{
    ListObjectsRequest, ListObjectsResponse, ListTenantsRequest, ListTenantsResponse, QuotaUsage,
    TapEvent, TapRequest,
};
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

use crate::apply::Applier;
use crate::peer::Peer;
use crate::registry::Registry;
use crate::usage;

/// The Inspect service.
#[derive(Clone)]
pub struct InspectService {
    /// Tenant bookkeeping.
    pub registry: Registry,
    /// What tenants hold, against their quotas.
    pub applier: Applier,
}

impl InspectService {
    fn authorize(&self, caller: &Peer, tenant: &str) -> Result<ClusterId, Status> {
        let tenant =
            ClusterId::parse(tenant).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if caller.cluster_id == tenant || caller.admin {
            Ok(tenant)
        } else {
            Err(Status::permission_denied(format!(
                "{} may only inspect itself (add it to --inspect-admin to see every tenant)",
                caller.cluster_id
            )))
        }
    }
}

#[tonic::async_trait]
impl Inspect for InspectService {
    async fn list_tenants(
        &self,
        request: Request<ListTenantsRequest>,
    ) -> Result<Response<ListTenantsResponse>, Status> {
        let caller = Peer::from_request(&request)?;
        let only = (!caller.admin).then_some(&caller.cluster_id);
        let mut tenants = self.registry.tenants(only);
        for tenant in &mut tenants {
            let Ok(id) = ClusterId::parse(&tenant.cluster_id) else {
                continue;
            };
            tenant.quota = usage::lines(&self.applier, &id)
                .into_iter()
                .map(|line| QuotaUsage {
                    resource: line.resource,
                    used: line.used,
                    limit: line.limit,
                })
                .collect();
        }
        Ok(Response::new(ListTenantsResponse { tenants }))
    }

    async fn list_objects(
        &self,
        request: Request<ListObjectsRequest>,
    ) -> Result<Response<ListObjectsResponse>, Status> {
        let caller = Peer::from_request(&request)?;
        let req = request.into_inner();
        let tenant = self.authorize(&caller, &req.cluster_id)?;
        Ok(Response::new(ListObjectsResponse {
            objects: self.registry.objects(&tenant, &req.kind, &req.namespace),
        }))
    }

    type TapStream = Pin<Box<dyn Stream<Item = Result<TapEvent, Status>> + Send>>;

    async fn tap(&self, request: Request<TapRequest>) -> Result<Response<Self::TapStream>, Status> {
        let caller = Peer::from_request(&request)?;
        let tenant = self.authorize(&caller, &request.get_ref().cluster_id)?;
        let mut rx = self.registry.subscribe(&tenant);
        let stream = async_stream(move |yield_tx| async move {
            let mut dropped = 0u64;
            loop {
                match rx.recv().await {
                    Ok(mut event) => {
                        event.dropped_before = std::mem::take(&mut dropped);
                        if yield_tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(n)) => dropped += n,
                    Err(RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// A stream fed by a task, ending when the caller hangs up.
fn async_stream<F, Fut>(f: F) -> Pin<Box<dyn Stream<Item = Result<TapEvent, Status>> + Send>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<TapEvent, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
