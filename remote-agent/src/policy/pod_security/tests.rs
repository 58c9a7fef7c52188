//! Pods against each level, field by field.

use super::*;
use serde_json::json;

fn verdict(level: Level, spec: serde_json::Value) -> Result<(), Violation> {
    let typed: PodSpec = serde_json::from_value(spec.clone()).unwrap();
    check(level, &typed, &spec, &BTreeMap::new())
}

fn field(level: Level, spec: serde_json::Value) -> String {
    verdict(level, spec).unwrap_err().field
}

fn container(sc: serde_json::Value) -> serde_json::Value {
    json!({"containers": [{"name": "a", "image": "x", "securityContext": sc}]})
}

const HARDENED: &str = r#"{"allowPrivilegeEscalation": false, "runAsNonRoot": true,
    "seccompProfile": {"type": "RuntimeDefault"}, "capabilities": {"drop": ["ALL"]}}"#;

fn hardened() -> serde_json::Value {
    serde_json::from_str(HARDENED).unwrap()
}

#[test]
fn baseline_refuses_what_reaches_into_the_node() {
    let plain = json!({"containers": [{"name": "a", "image": "x"}]});
    assert_eq!(verdict(Level::Baseline, plain), Ok(()));
    let cases = [
        (
            container(json!({"privileged": true})),
            "spec.containers[0].securityContext.privileged",
        ),
        (
            json!({"hostNetwork": true, "containers": [{"name": "a"}]}),
            "spec.hostNetwork",
        ),
        (
            json!({"hostPID": true, "containers": [{"name": "a"}]}),
            "spec.hostPID",
        ),
        (
            json!({"containers": [{"name": "a"}], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            "spec.volumes[0].hostPath",
        ),
        (
            container(json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
            "spec.containers[0].securityContext.capabilities.add",
        ),
        (
            json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
            "spec.containers[0].ports[0].hostPort",
        ),
        (
            container(json!({"procMount": "Unmasked"})),
            "spec.containers[0].securityContext.procMount",
        ),
        (
            container(json!({"seccompProfile": {"type": "Unconfined"}})),
            "spec.containers[0].securityContext.seccompProfile.type",
        ),
        (
            container(json!({"seLinuxOptions": {"type": "spc_t"}})),
            "spec.containers[0].securityContext.seLinuxOptions.type",
        ),
        (
            json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}, "containers": [{"name": "a"}]}),
            "spec.securityContext.sysctls[0]",
        ),
        (
            json!({"initContainers": [{"name": "i", "securityContext": {"privileged": true}}], "containers": [{"name": "a"}]}),
            "spec.initContainers[0].securityContext.privileged",
        ),
        (
            json!({"ephemeralContainers": [{"name": "e", "securityContext": {"privileged": true}}], "containers": [{"name": "a"}]}),
            "spec.ephemeralContainers[0].securityContext.privileged",
        ),
    ];
    for (spec, expected) in cases {
        assert_eq!(field(Level::Baseline, spec.clone()), expected);
        assert_eq!(verdict(Level::Privileged, spec), Ok(()));
    }
    let safe_sysctl = json!({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}, "containers": [{"name": "a"}]});
    assert_eq!(verdict(Level::Baseline, safe_sysctl), Ok(()));
}

#[test]
fn baseline_refuses_unconfined_annotations() {
    let spec: PodSpec = serde_json::from_value(json!({"containers": [{"name": "a"}]})).unwrap();
    let a = BTreeMap::from([(format!("{APPARMOR_PREFIX}a"), "unconfined".to_string())]);
    assert!(check(Level::Baseline, &spec, &json!({}), &a).is_err());
    let a = BTreeMap::from([(SECCOMP_POD_ANNOTATION.to_string(), "unconfined".to_string())]);
    assert!(check(Level::Baseline, &spec, &json!({}), &a).is_err());
    let a = BTreeMap::from([(format!("{APPARMOR_PREFIX}a"), "runtime/default".to_string())]);
    assert_eq!(check(Level::Baseline, &spec, &json!({}), &a), Ok(()));
}

#[test]
fn restricted_wants_hardened_containers() {
    assert_eq!(verdict(Level::Restricted, container(hardened())), Ok(()));
    // Pod-level runAsNonRoot and seccomp cover every container.
    let pod_level = json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "a", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
    });
    assert_eq!(verdict(Level::Restricted, pod_level), Ok(()));
    let without = |key: &str| {
        let mut sc = hardened();
        sc.as_object_mut().unwrap().remove(key);
        container(sc)
    };
    for (key, expected) in [
        ("allowPrivilegeEscalation", "allowPrivilegeEscalation"),
        ("runAsNonRoot", "runAsNonRoot"),
        ("seccompProfile", "seccompProfile"),
        ("capabilities", "capabilities.drop"),
    ] {
        let spec = without(key);
        assert_eq!(verdict(Level::Baseline, spec.clone()), Ok(()), "{key}");
        assert!(field(Level::Restricted, spec).ends_with(expected), "{key}");
    }
    let mut sc = hardened();
    sc["capabilities"]["add"] = json!(["CHOWN"]);
    assert!(field(Level::Restricted, container(sc)).ends_with("capabilities.add"));
    let mut sc = hardened();
    sc["runAsUser"] = json!(0);
    assert!(field(Level::Restricted, container(sc)).ends_with("runAsUser"));
    let mut spec = container(hardened());
    spec["volumes"] = json!([{"name": "n", "nfs": {"server": "x", "path": "/"}}]);
    assert_eq!(
        field(Level::Restricted, spec.clone()),
        "spec.volumes[0].nfs"
    );
    assert_eq!(verdict(Level::Baseline, spec), Ok(()));
    let mut spec = container(hardened());
    spec["volumes"] =
        json!([{"name": "c", "configMap": {"name": "x"}}, {"name": "e", "emptyDir": {}}]);
    assert_eq!(verdict(Level::Restricted, spec), Ok(()));
}
