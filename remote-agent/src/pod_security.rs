//! The pod security level the provider enforces on tenants' pods, before anything is written.
//!
//! A subset of the Kubernetes Pod Security Standards' `baseline` level covering what lets a pod
//! reach into its node: privileged containers, host namespaces, hostPath volumes, host ports,
//! added capabilities beyond the baseline set. The tenant namespaces also carry the Pod Security
//! Admission label, so the provider's API server enforces the full level as well.

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// Capabilities `baseline` allows to be added.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The first violation of `level` in `spec`, if any.
pub fn violation(level: &str, spec: &PodSpec) -> Option<String> {
    if level == "privileged" {
        return None;
    }
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true)
    {
        return Some("host namespaces (hostNetwork, hostPID, hostIPC) are not allowed".into());
    }
    if let Some(v) = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.is_some())
    {
        return Some(format!("hostPath volume {:?} is not allowed", v.name));
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        if let Some(v) = container_violation(c) {
            return Some(format!("container {:?}: {v}", c.name));
        }
    }
    None
}

fn container_violation(c: &Container) -> Option<String> {
    let sc = c.security_context.as_ref();
    if sc.and_then(|s| s.privileged) == Some(true) {
        return Some("privileged containers are not allowed".into());
    }
    if let Some(cap) = sc
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.as_ref())
        .and_then(|add| {
            add.iter()
                .find(|a| !BASELINE_CAPABILITIES.contains(&a.as_str()))
        })
    {
        return Some(format!("adding capability {cap} is not allowed"));
    }
    if c.ports
        .iter()
        .flatten()
        .any(|p| p.host_port.unwrap_or(0) != 0)
    {
        return Some("host ports are not allowed".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> PodSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn baseline_refuses_node_access() {
        let ok = spec(serde_json::json!({"containers": [{"name": "a", "image": "x"}]}));
        assert_eq!(violation("baseline", &ok), None);
        let privileged = spec(
            serde_json::json!({"containers": [{"name": "a", "securityContext": {"privileged": true}}]}),
        );
        assert!(violation("baseline", &privileged)
            .unwrap()
            .contains("privileged"));
        assert_eq!(violation("privileged", &privileged), None);
        let host = spec(serde_json::json!({"hostNetwork": true, "containers": [{"name": "a"}]}));
        assert!(violation("baseline", &host).is_some());
        let path = spec(
            serde_json::json!({"containers": [{"name": "a"}], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
        );
        assert!(violation("baseline", &path).unwrap().contains("hostPath"));
        let cap = spec(
            serde_json::json!({"containers": [{"name": "a", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}),
        );
        assert!(violation("baseline", &cap).unwrap().contains("SYS_ADMIN"));
        let port = spec(
            serde_json::json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
        );
        assert!(violation("baseline", &port).is_some());
    }
}
