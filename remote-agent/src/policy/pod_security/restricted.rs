//! The `restricted` level, on top of `baseline`: non-root, no privilege escalation, every
//! capability dropped but NET_BIND_SERVICE, a confining seccomp profile, and only volume types
//! that carry no node access.

use k8s_openapi::api::core::v1::{PodSpec, SeccompProfile};

use super::{added, containers};
use crate::policy::Violation;

/// Volume types `restricted` allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

pub(super) fn restricted(spec: &PodSpec, spec_json: &serde_json::Value) -> Result<(), Violation> {
    for (i, v) in spec_json["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let types = v.as_object().into_iter().flatten().map(|(k, _)| k.as_str());
        if let Some(t) = types
            .filter(|k| *k != "name")
            .find(|k| !RESTRICTED_VOLUMES.contains(k))
        {
            return Err(Violation::new(
                format!("spec.volumes[{i}].{t}"),
                format!(
                    "volume type {t} is not allowed (only {})",
                    RESTRICTED_VOLUMES.join(", ")
                ),
            ));
        }
    }
    let pod_sc = spec.security_context.as_ref();
    if pod_sc.and_then(|s| s.run_as_user) == Some(0) {
        return Err(Violation::new(
            "spec.securityContext.runAsUser",
            "running as root (UID 0) is not allowed",
        ));
    }
    let pod_non_root = pod_sc.and_then(|s| s.run_as_non_root);
    let pod_seccomp = pod_sc.and_then(|s| s.seccomp_profile.as_ref());
    if pod_non_root == Some(false) {
        return Err(Violation::new(
            "spec.securityContext.runAsNonRoot",
            "must not be false",
        ));
    }
    if let Some(p) = pod_seccomp {
        confined("spec.securityContext", p)?;
    }
    for (field, c) in containers(spec) {
        let sc = c.security_context.as_ref();
        let field = format!("{field}.securityContext");
        if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
            return Err(Violation::new(
                format!("{field}.allowPrivilegeEscalation"),
                "must be false",
            ));
        }
        match sc.and_then(|s| s.run_as_non_root).or(pod_non_root) {
            Some(true) => {}
            _ => {
                return Err(Violation::new(
                    format!("{field}.runAsNonRoot"),
                    "must be true (on the container or the pod)",
                ))
            }
        }
        if sc.and_then(|s| s.run_as_user) == Some(0) {
            return Err(Violation::new(
                format!("{field}.runAsUser"),
                "running as root (UID 0) is not allowed",
            ));
        }
        match sc.and_then(|s| s.seccomp_profile.as_ref()) {
            Some(p) => confined(&field, p)?,
            None if pod_seccomp.is_some() => {}
            None => {
                return Err(Violation::new(
                    format!("{field}.seccompProfile"),
                    "must be RuntimeDefault or Localhost (on the container or the pod)",
                ))
            }
        }
        let caps = sc.and_then(|s| s.capabilities.as_ref());
        if !caps
            .and_then(|c| c.drop.as_ref())
            .is_some_and(|d| d.iter().any(|c| c == "ALL"))
        {
            return Err(Violation::new(
                format!("{field}.capabilities.drop"),
                "must include ALL",
            ));
        }
        if let Some(cap) = added(caps).find(|a| *a != "NET_BIND_SERVICE") {
            return Err(Violation::new(
                format!("{field}.capabilities.add"),
                format!("adding capability {cap} is not allowed (only NET_BIND_SERVICE)"),
            ));
        }
    }
    Ok(())
}

fn confined(field: &str, p: &SeccompProfile) -> Result<(), Violation> {
    if p.type_ == "RuntimeDefault" || p.type_ == "Localhost" {
        Ok(())
    } else {
        Err(Violation::new(
            format!("{field}.seccompProfile.type"),
            "must be RuntimeDefault or Localhost",
        ))
    }
}
