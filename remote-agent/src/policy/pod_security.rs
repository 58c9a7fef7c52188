//! The Kubernetes Pod Security Standards, checked by the remote agent before a tenant's pod is
//! written: `baseline` (nothing that reaches into the node) and `restricted` (hardened pods).
//! The tenant's namespaces also carry the Pod Security Admission label of the same level, so a
//! provider whose API server enforces it checks twice; one that does not (Kubernetes before
//! 1.23) is covered by this check alone.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, PodSecurityContext, PodSpec, SeccompProfile,
    WindowsSecurityContextOptions,
};
use std::borrow::Cow;
use std::collections::BTreeMap;

use super::Violation;
use restricted::restricted;

mod restricted;
#[cfg(test)]
mod tests;

/// A Pod Security Standards level.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Anything goes.
    Privileged,
    /// Nothing that reaches into the node.
    Baseline,
    /// Hardened pods: non-root, no privilege escalation, all capabilities dropped, a seccomp
    /// profile, and only volume types that carry no node access.
    Restricted,
}

impl Level {
    /// The level's name, as Pod Security Admission labels spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

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

/// Sysctls `baseline` allows: namespaced and isolated from the node and other pods.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types `baseline` allows.
const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

const APPARMOR_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

/// The first violation of `level` by a pod of `spec` and `annotations`.
pub fn check(
    level: Level,
    spec: &PodSpec,
    spec_json: &serde_json::Value,
    annotations: &BTreeMap<String, String>,
) -> Result<(), Violation> {
    if level == Level::Privileged {
        return Ok(());
    }
    baseline(spec, annotations)?;
    if level == Level::Restricted {
        restricted(spec, spec_json)?;
    }
    Ok(())
}

/// Every container of the pod with its field path: init, regular and ephemeral (the fields
/// that matter here are the same; an ephemeral one is compared as a container).
fn containers(spec: &PodSpec) -> Vec<(String, Cow<'_, Container>)> {
    let init = spec.init_containers.iter().flatten().enumerate();
    let init = init.map(|(i, c)| (format!("spec.initContainers[{i}]"), Cow::Borrowed(c)));
    let regular = spec.containers.iter().enumerate();
    let regular = regular.map(|(i, c)| (format!("spec.containers[{i}]"), Cow::Borrowed(c)));
    let ephemeral = spec.ephemeral_containers.iter().flatten().enumerate();
    let ephemeral = ephemeral.map(|(i, e)| {
        let c = Container {
            name: e.name.clone(),
            security_context: e.security_context.clone(),
            ports: e.ports.clone(),
            ..Container::default()
        };
        (format!("spec.ephemeralContainers[{i}]"), Cow::Owned(c))
    });
    init.chain(regular).chain(ephemeral).collect()
}

fn baseline(spec: &PodSpec, annotations: &BTreeMap<String, String>) -> Result<(), Violation> {
    for (field, on) in [
        ("spec.hostNetwork", spec.host_network),
        ("spec.hostPID", spec.host_pid),
        ("spec.hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            return Err(Violation::new(field, "host namespaces are not allowed"));
        }
    }
    if let Some((i, v)) = spec
        .volumes
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, v)| v.host_path.is_some())
    {
        return Err(Violation::new(
            format!("spec.volumes[{i}].hostPath"),
            format!("hostPath volume {:?} is not allowed", v.name),
        ));
    }
    let pod_sc = spec.security_context.as_ref();
    if let Some(sc) = pod_sc {
        pod_context_baseline(sc)?;
    }
    for (field, c) in containers(spec) {
        container_baseline(&field, &c)?;
    }
    for (key, value) in annotations {
        if key.starts_with(APPARMOR_PREFIX)
            && value != "runtime/default"
            && !value.starts_with("localhost/")
        {
            return Err(Violation::new(
                format!("metadata.annotations[{key}]"),
                format!("AppArmor profile {value:?} is not allowed (runtime/default or localhost/* only)"),
            ));
        }
        if (key == SECCOMP_POD_ANNOTATION || key.starts_with(SECCOMP_CONTAINER_PREFIX))
            && value == "unconfined"
        {
            return Err(Violation::new(
                format!("metadata.annotations[{key}]"),
                "an unconfined seccomp profile is not allowed",
            ));
        }
    }
    Ok(())
}

fn pod_context_baseline(sc: &PodSecurityContext) -> Result<(), Violation> {
    let field = "spec.securityContext";
    not_host_process(field, sc.windows_options.as_ref())?;
    if let Some(se) = &sc.se_linux_options {
        selinux(field, se)?;
    }
    seccomp_not_unconfined(field, sc.seccomp_profile.as_ref())?;
    if let Some(p) = &sc.app_armor_profile {
        apparmor(field, &p.type_)?;
    }
    for (i, s) in sc.sysctls.iter().flatten().enumerate() {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            return Err(Violation::new(
                format!("{field}.sysctls[{i}]"),
                format!("sysctl {:?} is not allowed", s.name),
            ));
        }
    }
    Ok(())
}

fn container_baseline(field: &str, c: &Container) -> Result<(), Violation> {
    if let Some((i, _)) = c
        .ports
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, p)| p.host_port.unwrap_or(0) != 0)
    {
        return Err(Violation::new(
            format!("{field}.ports[{i}].hostPort"),
            "host ports are not allowed",
        ));
    }
    let Some(sc) = c.security_context.as_ref() else {
        return Ok(());
    };
    let field = format!("{field}.securityContext");
    if sc.privileged == Some(true) {
        return Err(Violation::new(
            format!("{field}.privileged"),
            "privileged containers are not allowed",
        ));
    }
    not_host_process(&field, sc.windows_options.as_ref())?;
    if let Some(cap) =
        added(sc.capabilities.as_ref()).find(|a| !BASELINE_CAPABILITIES.contains(&a.as_str()))
    {
        return Err(Violation::new(
            format!("{field}.capabilities.add"),
            format!("adding capability {cap} is not allowed"),
        ));
    }
    if let Some(se) = &sc.se_linux_options {
        selinux(&field, se)?;
    }
    if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
        return Err(Violation::new(
            format!("{field}.procMount"),
            "only the Default /proc mount is allowed",
        ));
    }
    seccomp_not_unconfined(&field, sc.seccomp_profile.as_ref())?;
    if let Some(p) = &sc.app_armor_profile {
        apparmor(&field, &p.type_)?;
    }
    Ok(())
}

fn not_host_process(
    field: &str,
    windows: Option<&WindowsSecurityContextOptions>,
) -> Result<(), Violation> {
    if windows.and_then(|w| w.host_process) == Some(true) {
        return Err(Violation::new(
            format!("{field}.windowsOptions.hostProcess"),
            "HostProcess (Windows host) pods and containers are not allowed",
        ));
    }
    Ok(())
}

fn added(caps: Option<&Capabilities>) -> impl Iterator<Item = &String> {
    caps.and_then(|c| c.add.as_ref()).into_iter().flatten()
}

fn selinux(field: &str, se: &k8s_openapi::api::core::v1::SELinuxOptions) -> Result<(), Violation> {
    if let Some(t) = se.type_.as_deref().filter(|t| !t.is_empty()) {
        if !SELINUX_TYPES.contains(&t) {
            return Err(Violation::new(
                format!("{field}.seLinuxOptions.type"),
                format!("SELinux type {t:?} is not allowed"),
            ));
        }
    }
    if se.user.as_deref().is_some_and(|u| !u.is_empty())
        || se.role.as_deref().is_some_and(|r| !r.is_empty())
    {
        return Err(Violation::new(
            format!("{field}.seLinuxOptions"),
            "a custom SELinux user or role is not allowed",
        ));
    }
    Ok(())
}

fn seccomp_not_unconfined(field: &str, p: Option<&SeccompProfile>) -> Result<(), Violation> {
    if p.is_some_and(|p| p.type_ == "Unconfined") {
        return Err(Violation::new(
            format!("{field}.seccompProfile.type"),
            "an Unconfined seccomp profile is not allowed",
        ));
    }
    Ok(())
}

fn apparmor(field: &str, type_: &str) -> Result<(), Violation> {
    if type_ == "Unconfined" {
        return Err(Violation::new(
            format!("{field}.appArmorProfile.type"),
            "an Unconfined AppArmor profile is not allowed",
        ));
    }
    Ok(())
}
