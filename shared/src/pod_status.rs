//! Pod status from the provider, as the origin should see it.

use k8s_openapi::api::core::v1::{HostIP, PodIP, PodStatus};

use crate::remap::Remapping;

/// What the origin needs to rewrite a provider pod status.
#[derive(Debug, Clone)]
pub struct StatusContext<'a> {
    /// Provider pod addresses → addresses the origin reaches them at.
    pub pod_remapping: &'a Remapping,
    /// The host IP the origin shows: the local agent's own pod IP.
    pub host_ip: &'a str,
    /// How many times the provider re-created the pod (added to every restart count).
    pub recreations: u32,
}

/// The origin pod's status: the provider's, with the pod IP remapped (secondary IPs
/// dropped), the host IP replaced, and restart counts raised by the re-creations.
pub fn origin_status(remote: &PodStatus, ctx: &StatusContext<'_>) -> PodStatus {
    let mut status = remote.clone();
    if let Some(ip) = remote.pod_ip.as_deref().filter(|ip| !ip.is_empty()) {
        let mapped = ctx.pod_remapping.map_str(ip);
        status.pod_ips = Some(vec![PodIP { ip: mapped.clone() }]);
        status.pod_ip = Some(mapped);
    }
    status.host_ip = Some(ctx.host_ip.to_string());
    status.host_ips = Some(vec![HostIP {
        ip: ctx.host_ip.to_string(),
    }]);
    for c in status.container_statuses.iter_mut().flatten() {
        c.restart_count += ctx.recreations as i32;
    }
    status
}
