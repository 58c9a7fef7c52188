//! Golden-file tests of the forge: one folder per case under `tests/golden/`, holding
//! `input.yaml` (the origin object), optionally `options.yaml` (reflection options plus
//! `remoteNamespace`, `providerNodes`, `knownNodes`) and `service.yaml` (an EndpointSlice's
//! Service), and `expected.json` (the decision, or `{"error": ...}`). A provider
//! PersistentVolume as input, with `claim.yaml` (the origin claim), gives the origin PV.
//!
//! `REFRACT_BLESS=1 cargo test -p refract-shared --test golden` writes missing or changed
//! `expected.json` files; review them before committing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod, PodStatus, Service,
};
use refract_core::forge::{self, Context, NodeLists};
use refract_core::inbound::address::PodAddresses;
use refract_core::options::{Kind, ReflectionOptions};
use refract_core::pod_status::{origin_status, StatusContext};
use refract_core::remap::Remapping;
use serde_json::{json, Value};

fn run_case(dir: &Path) -> Value {
    if dir.join("remote-status.yaml").exists() {
        return run_status_case(dir);
    }
    let input: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("input.yaml")).unwrap()).unwrap();
    let mut opts: Value = match std::fs::read_to_string(dir.join("options.yaml")) {
        Ok(text) => serde_yaml_ng::from_str::<Option<Value>>(&text)
            .unwrap()
            .unwrap_or(json!({})),
        Err(_) => json!({}),
    };
    let map = opts.as_object_mut().unwrap();
    let remote_namespace = map
        .remove("remoteNamespace")
        .map(|v| v.as_str().unwrap().to_string())
        .unwrap_or_else(|| "shop-origin".into());
    let nodes = |v: Option<Value>| -> Option<BTreeSet<String>> {
        v.map(|v| serde_json::from_value(v).unwrap())
    };
    let node_lists = NodeLists {
        provider: nodes(map.remove("providerNodes")).unwrap_or_default(),
        known: nodes(map.remove("knownNodes")),
    };
    let virtual_node = map
        .remove("virtualNode")
        .map(|v| v.as_str().unwrap().to_string())
        .unwrap_or_else(|| "refract-provider".into());
    map.entry("localClusterId").or_insert(json!("origin"));
    map.entry("remoteClusterId").or_insert(json!("provider"));
    let options: ReflectionOptions = serde_json::from_value(opts).unwrap();
    let service: Option<Service> = std::fs::read_to_string(dir.join("service.yaml"))
        .ok()
        .map(|t| serde_yaml_ng::from_str(&t).unwrap());
    let ctx = Context {
        options: &options,
        remote_namespace: &remote_namespace,
        service: service.as_ref(),
        nodes: &node_lists,
    };
    if input["kind"] == "PersistentVolume" {
        let remote: PersistentVolume = serde_json::from_value(input).unwrap();
        let claim: PersistentVolumeClaim =
            serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("claim.yaml")).unwrap())
                .unwrap();
        return match forge::volume::origin_volume(&remote, &claim, &options) {
            Ok(v) => serde_json::to_value(v).unwrap(),
            Err(e) => json!({"error": e.to_string()}),
        };
    }
    if input["kind"] == "Pod" {
        let pod: Pod = serde_json::from_value(input).unwrap();
        return match forge::pod::shadow_pod(&pod, &virtual_node, &ctx) {
            Ok(v) => v,
            Err(e) => json!({"error": e.to_string()}),
        };
    }
    let kind = Kind::from_kind(input["kind"].as_str().unwrap()).expect("reflected kind");
    match forge::forge(kind, &input, &ctx) {
        Ok(decision) => serde_json::to_value(decision).unwrap(),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// A status case: `remote-status.yaml` (the provider pod's status) and `options.yaml` with
/// `podRemapping`, `podCidrs`, `hostIp` and `recreations`; the expected output adds
/// `refused` when something was left out.
fn run_status_case(dir: &Path) -> Value {
    let remote: PodStatus =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("remote-status.yaml")).unwrap())
            .unwrap();
    let opts: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("options.yaml")).unwrap())
            .unwrap();
    let remapping: Remapping =
        serde_json::from_value(opts["podRemapping"].clone()).unwrap_or_default();
    let addresses = PodAddresses {
        remapping,
        allowed: serde_json::from_value(opts["podCidrs"].clone()).unwrap_or_default(),
    };
    let ctx = StatusContext {
        addresses: &addresses,
        host_ip: opts["hostIp"].as_str().unwrap(),
        recreations: opts["recreations"].as_u64().unwrap_or(0) as u32,
        spec: None,
    };
    let out = origin_status(&remote, &ctx);
    let mut value = serde_json::to_value(out.status).unwrap();
    if !out.refused.is_empty() {
        value["refused"] = serde_json::json!(out.refused);
    }
    value
}

#[test]
fn golden_cases() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("REFRACT_BLESS").is_some();
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 15,
        "golden cases missing from {}",
        root.display()
    );
    let mut failures = Vec::new();
    for dir in &cases {
        let got = run_case(dir);
        let expected_path = dir.join("expected.json");
        let rendered = serde_json::to_string_pretty(&got).unwrap() + "\n";
        match std::fs::read_to_string(&expected_path) {
            Ok(expected) if expected == rendered => {}
            _ if bless => std::fs::write(&expected_path, &rendered).unwrap(),
            Ok(expected) => failures.push(format!(
                "{}:\n--- expected\n{expected}\n--- got\n{rendered}",
                dir.display()
            )),
            Err(_) => failures.push(format!(
                "{}: no expected.json (run with REFRACT_BLESS=1 and review)",
                dir.display()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
