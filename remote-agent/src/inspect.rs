//! `refract.v1.Inspect`: a view for operators, which changes nothing but the end of a copy's
//! quarantine (ClearQuarantine).
//!
//! A caller sees only its own tenant, unless its identity is one of `--inspect-admin`. Tap
//! shows messages as they crossed the link, with Secret data redacted (the registry redacts
//! what it copies to the tap).

use std::pin::Pin;

use futures::Stream;
use refract_shared::tls::ClusterId;
use refract_wire::proto::inspect_server::Inspect;
use refract_wire::proto::{
    ClearQuarantineRequest, ClearQuarantineResponse, ListObjectsRequest, ListObjectsResponse,
    ListTenantsRequest, ListTenantsResponse, ObjectStatus, QuotaUsage, TapEvent, TapRequest,
};
use tonic::{Request, Response, Status};

use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use crate::peer::Peer;
use crate::registry::tap_queue::{Ended, Next, MAX_READERS, READER_BYTES};
use crate::registry::Registry;
use crate::restore::Drift;
use crate::usage;

/// The Inspect service.
#[derive(Clone)]
pub struct InspectService {
    /// Tenant bookkeeping.
    pub registry: Registry,
    /// What tenants hold, against their quotas.
    pub applier: Applier,
    /// Copies someone on the provider rewrote: restores and quarantines.
    pub drift: Drift,
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

    /// Adds what the restorer knows of `status`'s copy: its restores and quarantine.
    fn with_fight(&self, tenant: &ClusterId, mut status: ObjectStatus) -> ObjectStatus {
        let Some(key) = status
            .object
            .as_ref()
            .and_then(|o| object_key(tenant, &o.kind, &o.namespace, &o.name))
        else {
            return status;
        };
        if let Some(fight) = self.drift.view(&key) {
            status.restores = fight.restores;
            status.quarantined_since = fight
                .quarantined_since
                .map(|since| {
                    let ago = std::time::Instant::now().saturating_duration_since(since);
                    crate::registry::rfc3339(time::OffsetDateTime::now_utc() - ago)
                })
                .unwrap_or_default();
        }
        status
    }
}

fn object_key(tenant: &ClusterId, kind: &str, namespace: &str, name: &str) -> Option<ObjectKey> {
    Some(ObjectKey {
        tenant: tenant.clone(),
        kind: Allowed::by_kind(kind)?,
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
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
        let objects = self
            .registry
            .objects(&tenant, &req.kind, &req.namespace)
            .into_iter()
            .map(|status| self.with_fight(&tenant, status))
            .collect();
        Ok(Response::new(ListObjectsResponse { objects }))
    }

    async fn clear_quarantine(
        &self,
        request: Request<ClearQuarantineRequest>,
    ) -> Result<Response<ClearQuarantineResponse>, Status> {
        let caller = Peer::from_request(&request)?;
        let req = request.into_inner();
        let tenant = self.authorize(&caller, &req.cluster_id)?;
        let object = req.object.ok_or_else(|| {
            Status::invalid_argument("name the object: object {kind, namespace, name}")
        })?;
        let key = object_key(&tenant, &object.kind, &object.namespace, &object.name).ok_or_else(
            || {
                Status::invalid_argument(format!(
                    "{:?} is not a kind tenants reflect; use the kind ListObjects shows",
                    object.kind
                ))
            },
        )?;
        let what = format!(
            "{} {}/{} of tenant {tenant}",
            object.kind, object.namespace, object.name
        );
        let cleared = self.drift.clear(&key);
        let message = if cleared {
            tracing::info!(caller = %caller.cluster_id, %tenant, kind = %object.kind, namespace = %object.namespace, name = %object.name, "quarantine cleared by an operator");
            format!("{what} is no longer quarantined; it is being restored now")
        } else {
            format!("{what} is not quarantined; nothing to clear")
        };
        Ok(Response::new(ClearQuarantineResponse { cleared, message }))
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
