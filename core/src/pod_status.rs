//! Pod status from the provider, as the origin should see it.
//!
//! The status comes from a party the origin does not trust: the pod IP must be an address the
//! operator allowed ([`PodAddresses`]), container statuses must name containers the origin pod
//! has, and counters saturate instead of wrapping. What is refused is left out and reported.

use k8s_openapi::api::core::v1::{ContainerStatus, HostIP, PodIP, PodSpec, PodStatus};

use crate::inbound::address::PodAddresses;

/// The largest provider pod status, in bytes of JSON, the local agent decodes.
pub const MAX_STATUS_BYTES: usize = 256 * 1024;

/// What the origin needs to rewrite a provider pod status.
#[derive(Debug, Clone)]
pub struct StatusContext<'a> {
    /// Which provider pod addresses are accepted, and how they are remapped.
    pub addresses: &'a PodAddresses,
    /// The host IP the origin shows: the local agent's own pod IP.
    pub host_ip: &'a str,
    /// How many times the provider re-created the pod (added to every restart count).
    pub recreations: u32,
    /// The origin pod's spec: container statuses must name its containers.
    pub spec: Option<&'a PodSpec>,
}

/// The origin pod's status, and what of the provider's was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct OriginStatus {
    /// The status to write.
    pub status: PodStatus,
    /// A reason for each part left out.
    pub refused: Vec<String>,
}

/// The origin pod's status: the provider's, with the pod IP admitted and remapped (secondary
/// IPs dropped), the host IP replaced, restart counts raised by the re-creations, and container
/// statuses only for the origin pod's containers.
pub fn origin_status(remote: &PodStatus, ctx: &StatusContext<'_>) -> OriginStatus {
    let mut status = remote.clone();
    let mut refused = Vec::new();
    status.pod_ip = None;
    status.pod_ips = None;
    if let Some(ip) = remote.pod_ip.as_deref().filter(|ip| !ip.is_empty()) {
        match ctx.addresses.admit(ip) {
            Ok(mapped) => {
                status.pod_ips = Some(vec![PodIP {
                    ip: mapped.to_string(),
                }]);
                status.pod_ip = Some(mapped.to_string());
            }
            Err(reason) => refused.push(format!("pod IP: {reason}")),
        }
    }
    status.host_ip = Some(ctx.host_ip.to_string());
    status.host_ips = Some(vec![HostIP {
        ip: ctx.host_ip.to_string(),
    }]);
    let recreations = i32::try_from(ctx.recreations).unwrap_or(i32::MAX);
    let names = |pick: fn(&PodSpec) -> Vec<&str>| ctx.spec.map(pick);
    keep_known(
        &mut status.container_statuses,
        names(|s| s.containers.iter().map(|c| c.name.as_str()).collect()),
        recreations,
        &mut refused,
    );
    keep_known(
        &mut status.init_container_statuses,
        names(|s| {
            s.init_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect()
        }),
        0,
        &mut refused,
    );
    keep_known(
        &mut status.ephemeral_container_statuses,
        names(|s| {
            s.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect()
        }),
        0,
        &mut refused,
    );
    OriginStatus { status, refused }
}

/// Drops statuses of containers the origin pod lacks (when its spec is known) and raises
/// restart counts, saturating: a provider's count never wraps to a negative one.
fn keep_known(
    statuses: &mut Option<Vec<ContainerStatus>>,
    names: Option<Vec<&str>>,
    add: i32,
    refused: &mut Vec<String>,
) {
    let Some(list) = statuses.as_mut() else {
        return;
    };
    if let Some(names) = names {
        list.retain(|c| {
            let known = names.contains(&c.name.as_str());
            if !known {
                refused.push(format!(
                    "status of container {:?}: the origin pod has no such container",
                    crate::inbound::excerpt(&c.name)
                ));
            }
            known
        });
    }
    for c in list.iter_mut() {
        c.restart_count = c.restart_count.max(0).saturating_add(add);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    fn container_status(name: &str, restarts: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            restart_count: restarts,
            ..Default::default()
        }
    }

    #[test]
    fn refuses_foreign_addresses_and_containers_and_saturates_counters() {
        let addresses = PodAddresses {
            remapping: crate::remap::Remapping(vec!["10.0.0.0/16=10.50.0.0/16".parse().unwrap()]),
            allowed: vec![],
        };
        let spec = PodSpec {
            containers: vec![Container {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let remote = PodStatus {
            pod_ip: Some("169.254.169.254".into()),
            pod_ips: Some(vec![PodIP {
                ip: "169.254.169.254".into(),
            }]),
            container_statuses: Some(vec![
                container_status("app", i32::MAX - 1),
                container_status("smuggled", 0),
            ]),
            ..Default::default()
        };
        let ctx = StatusContext {
            addresses: &addresses,
            host_ip: "192.0.2.1",
            recreations: u32::MAX,
            spec: Some(&spec),
        };
        let out = origin_status(&remote, &ctx);
        assert_eq!(out.status.pod_ip, None);
        assert_eq!(out.status.pod_ips, None);
        let statuses = out.status.container_statuses.unwrap();
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0].restart_count, i32::MAX);
        assert_eq!(out.refused.len(), 2, "{:?}", out.refused);

        let fine = PodStatus {
            pod_ip: Some("10.0.3.7".into()),
            container_statuses: Some(vec![container_status("app", -4)]),
            ..Default::default()
        };
        let out = origin_status(
            &fine,
            &StatusContext {
                recreations: 2,
                ..ctx
            },
        );
        assert_eq!(out.status.pod_ip.as_deref(), Some("10.50.3.7"));
        assert_eq!(out.status.container_statuses.unwrap()[0].restart_count, 2);
        assert!(out.refused.is_empty());
    }
}
