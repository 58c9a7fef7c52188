//! EndpointSlices: the endpoints the provider cannot see, with addresses remapped.
//!
//! The provider's own control plane already publishes endpoints of pods running there
//! (offloaded pods), so endpoints on this peering's virtual nodes are left out; every other
//! endpoint (origin pods, external endpoints) is reflected with its addresses rewritten by the
//! network remapping, so the provider can reach them.

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};

use super::meta::{name_of, remote_meta};
use super::{reflect, Context, Decision, ForgeError, NodeSite};
use crate::keys::{ENDPOINTSLICE_MANAGED_BY_LABEL, SERVICE_NAME_LABEL, SKIP_ANNOTATION};
use crate::options::Kind;
use crate::policy;

/// Refract's value of [`ENDPOINTSLICE_MANAGED_BY_LABEL`] on the provider, so the provider's
/// EndpointSlice controller leaves reflected slices alone.
pub const MANAGED_BY_REFRACT: &str = "endpointslice.reflection.refract.io";

/// Why a slice is skipped: its own allow/skip annotations win; otherwise its Service's policy
/// decides (the Service's annotations when the Service is known, else the slice's).
pub fn skip_reason(slice: &EndpointSlice, ctx: &Context<'_>) -> Result<Option<String>, ForgeError> {
    let meta = &slice.metadata;
    let service_name = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
    if meta.namespace.as_deref() == Some("default")
        && service_name.map(String::as_str) == Some("kubernetes")
    {
        return Ok(Some(
            "EndpointSlices of the default/kubernetes Service are never reflected".into(),
        ));
    }
    match policy::forced(meta.annotations.as_ref()).map_err(ForgeError::Annotations)? {
        Some(true) => return Ok(None),
        Some(false) => return Ok(Some(format!("annotated {}", SKIP_ANNOTATION))),
        None => {}
    }
    let policy = ctx.options.kind(Kind::Service).policy;
    let annotations = match (service_name, ctx.service) {
        (Some(_), Some(svc)) => svc.metadata.annotations.as_ref(),
        _ => meta.annotations.as_ref(),
    };
    Ok(
        policy::skip_reason(policy, annotations).map(|r| match service_name {
            Some(s) if ctx.service.is_some() => format!("its Service {s} is not reflected: {r}"),
            _ => r,
        }),
    )
}

/// Forges an EndpointSlice.
pub fn forge(slice: &EndpointSlice, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
    let name = name_of(&slice.metadata, "EndpointSlice")?;
    let mut metadata = remote_meta(&slice.metadata, name, ctx);
    metadata.labels.get_or_insert_with(Default::default).insert(
        ENDPOINTSLICE_MANAGED_BY_LABEL.into(),
        MANAGED_BY_REFRACT.into(),
    );
    let endpoints = slice
        .endpoints
        .iter()
        .filter(|e| endpoint_wanted(e, ctx))
        .map(|e| remote_endpoint(e, ctx))
        .collect();
    let out = EndpointSlice {
        metadata,
        address_type: slice.address_type.clone(),
        endpoints,
        ports: slice.ports.clone(),
    };
    Ok(reflect(
        Kind::EndpointSlice,
        ctx.remote_namespace,
        name,
        &out,
    ))
}

/// The nodes the slice's endpoints name, each once.
pub fn nodes_named(slice: &EndpointSlice) -> Vec<&str> {
    let mut nodes: Vec<&str> = slice
        .endpoints
        .iter()
        .filter_map(|e| e.node_name.as_deref())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

fn endpoint_wanted(e: &Endpoint, ctx: &Context<'_>) -> bool {
    match e.node_name.as_deref() {
        None => true,
        Some(node) => ctx.nodes.site(node) == NodeSite::Origin,
    }
}

fn remote_endpoint(e: &Endpoint, ctx: &Context<'_>) -> Endpoint {
    let remap = &ctx.options.remapping;
    Endpoint {
        addresses: e.addresses.iter().map(|a| remap.map_str(a)).collect(),
        // Only readiness means something on the other side.
        conditions: e.conditions.as_ref().map(|c| EndpointConditions {
            ready: c.ready,
            serving: None,
            terminating: None,
        }),
        hostname: e.hostname.clone(),
        zone: e.zone.clone(),
        hints: e.hints.clone(),
        // The provider has no such node; name the origin cluster instead.
        node_name: Some(ctx.options.local_cluster_id.clone()),
        target_ref: e.target_ref.clone().map(|mut r| {
            r.kind = r.kind.map(|k| format!("Remote{k}"));
            r
        }),
        deprecated_topology: None,
    }
}
