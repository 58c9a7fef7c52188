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
use tonic::{Request, Response, Status};

use crate::apply::Applier;
use crate::peer::Peer;
use crate::registry::tap_queue::{Ended, Next, MAX_READERS, READER_BYTES};
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
        Ok(Response::new(ListTenantsResponse {
            tenants,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        }))
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
        let reader = self.registry.subscribe(&tenant);
        // Read straight from the reader's byte-bounded queue: no other buffer holds events
        // for a reader that does not read.
        let stream = futures::stream::unfold(Some(reader), |reader| async move {
            let reader = reader?;
            match reader.next().await {
                Next::Event(event) => Some((Ok(event), Some(reader))),
                Next::Ended(Ended::Behind(behind)) => Some((
                    Err(Status::resource_exhausted(format!(
                        "this tap fell {behind} bytes behind (more than {READER_BYTES}) and was cut off; tap again to go on"
                    ))),
                    None,
                )),
                Next::Ended(Ended::Replaced) => Some((
                    Err(Status::resource_exhausted(format!(
                        "a newer tap of this tenant took this one's place (at most {MAX_READERS} at once)"
                    ))),
                    None,
                )),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
