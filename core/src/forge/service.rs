//! Services: reflected verbatim except the addresses and ports the provider must allocate.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::meta::{name_of, remote_meta};
use super::{reflect, Context, Decision, ForgeError};
use crate::keys::FORCE_NODE_PORT_ANNOTATION;
use crate::options::Kind;

/// Whether this is `default/kubernetes`, which is never reflected.
pub fn is_default_kubernetes(meta: &ObjectMeta) -> bool {
    meta.namespace.as_deref() == Some("default") && meta.name.as_deref() == Some("kubernetes")
}

/// Forges a Service: `clusterIP`(s), `loadBalancerIP`, `externalIPs`, `ipFamilies`,
/// `healthCheckNodePort`, `loadBalancerClass` and node ports are left for the provider to
/// choose (they would likely conflict there); a headless Service stays headless.
pub fn forge(svc: &Service, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
    let name = name_of(&svc.metadata, "Service")?;
    let force_node_ports = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FORCE_NODE_PORT_ANNOTATION))
        .is_some_and(|v| v == "true");
    let spec = svc.spec.as_ref().map(|s| ServiceSpec {
        type_: s.type_.clone(),
        selector: s.selector.clone(),
        external_name: s.external_name.clone(),
        allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
        external_traffic_policy: s.external_traffic_policy.clone(),
        internal_traffic_policy: s.internal_traffic_policy.clone(),
        ip_family_policy: s.ip_family_policy.clone(),
        load_balancer_source_ranges: s.load_balancer_source_ranges.clone(),
        publish_not_ready_addresses: s.publish_not_ready_addresses,
        session_affinity: s.session_affinity.clone(),
        cluster_ip: s.cluster_ip.clone().filter(|ip| ip == "None"),
        ports: s.ports.as_ref().map(|ports| {
            ports
                .iter()
                .map(|p| ServicePort {
                    name: p.name.clone(),
                    port: p.port,
                    target_port: p.target_port.clone(),
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                    node_port: p.node_port.filter(|_| force_node_ports),
                })
                .collect()
        }),
        ..Default::default()
    });
    let out = Service {
        metadata: remote_meta(&svc.metadata, name, ctx),
        spec,
        status: None,
    };
    Ok(reflect(Kind::Service, ctx.remote_namespace, name, &out))
}
