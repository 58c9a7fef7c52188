//! Fuzz-style properties of every decoder of what a provider sends the local agent: the
//! protobuf envelope, pod statuses, events, capacity quantities, node labels and pod addresses.
//! Each takes arbitrary or mutated input and must end in a value that keeps the origin's
//! rules, or a refusal; never a panic, a hang or a value outside the bounds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
use proptest::prelude::*;
use prost::Message;
use refract_core::inbound::address::PodAddresses;
use refract_core::inbound::{capacity, labels};
use refract_core::pod_status::{origin_status, StatusContext};
use refract_core::quantity::parse_milli;
use refract_local_agent::events::origin as event_origin;
use refract_testkit::fuzz::{config, json_value, mutated, tricky_text};
use refract_wire::proto::{self, remote_message, RemoteMessage};

fn valid_messages() -> Vec<Vec<u8>> {
    let status = serde_json::json!({"phase": "Running", "podIP": "10.200.0.5",
        "containerStatuses": [{"name": "app", "ready": true, "restartCount": 3, "image": "x", "imageID": "x"}]});
    let kinds = [
        remote_message::Kind::PodStatus(proto::PodStatus {
            origin_uid: "u".into(),
            namespace: "apps-origin".into(),
            name: "web".into(),
            status_json: serde_json::to_vec(&status).unwrap().into(),
            recreations: 1,
            sent_unix_millis: i64::MAX,
        }),
        remote_message::Kind::Capacity(proto::Capacity {
            free: [("cpu".to_string(), "8".to_string())].into_iter().collect(),
            node_labels: [("zone".to_string(), "a".to_string())]
                .into_iter()
                .collect(),
            api_server_ready: true,
            quota: [("cpu".to_string(), "2".to_string())].into_iter().collect(),
        }),
        remote_message::Kind::Event(proto::Event {
            involved: None,
            origin_uid: "u".into(),
            event_json: valid_event(),
        }),
    ];
    kinds
        .into_iter()
        .map(|kind| RemoteMessage { kind: Some(kind) }.encode_to_vec())
        .collect()
}

fn valid_event() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "metadata": {"name": "web.1", "namespace": "apps-origin"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "apps-origin"},
        "type": "Warning", "reason": "BackOff", "message": "restarting", "count": 3,
    }))
    .unwrap()
}

fn addresses() -> PodAddresses {
    PodAddresses {
        remapping: refract_core::remap::Remapping(vec!["10.200.0.0/16=10.71.0.0/16"
            .parse()
            .unwrap()]),
        allowed: vec!["172.20.0.0/16".parse().unwrap()],
    }
}

fn spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "app".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The rules every origin status keeps, whatever the provider sent.
fn assert_origin_rules(remote: &PodStatus, recreations: u32) {
    let addresses = addresses();
    let spec = spec();
    let out = origin_status(
        remote,
        &StatusContext {
            addresses: &addresses,
            host_ip: "192.0.2.1",
            recreations,
            spec: Some(&spec),
        },
    );
    let status = out.status;
    assert_eq!(status.host_ip.as_deref(), Some("192.0.2.1"));
    if let Some(ip) = &status.pod_ip {
        let ip: std::net::IpAddr = ip.parse().expect("an admitted pod IP is an address");
        let shown: [ipnet::IpNet; 2] = [
            "10.71.0.0/16".parse().unwrap(),
            "172.20.0.0/16".parse().unwrap(),
        ];
        assert!(
            shown.iter().any(|n| n.contains(&ip)),
            "{ip} outside the allowed ranges"
        );
    }
    for c in status.container_statuses.iter().flatten() {
        assert_eq!(c.name, "app", "only the origin pod's containers");
        assert!(c.restart_count >= 0);
    }
    assert!(status
        .init_container_statuses
        .iter()
        .flatten()
        .next()
        .is_none());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_envelope_decodes_or_refuses_anything(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = RemoteMessage::decode(bytes.as_slice());
    }

    #[test]
    fn mutated_messages_decode_or_refuse(bytes in prop::sample::select(valid_messages()).prop_flat_map(|m| mutated(m, 8))) {
        if let Ok(RemoteMessage { kind: Some(remote_message::Kind::PodStatus(s)) }) = RemoteMessage::decode(bytes.as_slice()) {
            if let Ok(status) = serde_json::from_slice::<PodStatus>(&s.status_json) {
                assert_origin_rules(&status, s.recreations);
            }
        }
    }

    #[test]
    fn any_pod_status_keeps_the_origin_rules(value in json_value(), recreations in any::<u32>()) {
        if let Ok(status) = serde_json::from_value::<PodStatus>(value) {
            assert_origin_rules(&status, recreations);
        }
    }

    #[test]
    fn structured_pod_statuses_keep_the_origin_rules(
        ip in tricky_text(),
        names in prop::collection::vec(prop_oneof![Just("app".to_string()), tricky_text()], 0..4),
        restarts in any::<i32>(),
        recreations in any::<u32>(),
    ) {
        let statuses: Vec<serde_json::Value> = names.iter().map(|n| serde_json::json!({"name": n, "ready": true, "restartCount": restarts, "image": "x", "imageID": "x"})).collect();
        let value = serde_json::json!({"podIP": ip, "podIPs": [{"ip": ip}], "containerStatuses": statuses});
        let status: PodStatus = serde_json::from_value(value).unwrap();
        assert_origin_rules(&status, recreations);
    }

    #[test]
    fn events_decode_within_bounds_or_are_refused(bytes in prop_oneof![
        mutated(valid_event(), 12),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        prop::collection::vec(any::<u8>(), 0..512),
    ]) {
        if let Ok(event) = event_origin::decode(&bytes) {
            assert!(matches!(event.type_.as_deref(), Some("Normal" | "Warning")));
            assert!(event.reason.as_deref().unwrap_or_default().chars().count() <= 128);
            assert!(event.message.as_deref().unwrap_or_default().chars().count() <= 1024);
        }
    }

    #[test]
    fn capacity_is_bounded_whatever_is_reported(
        free in prop::collection::btree_map(tricky_text(), tricky_text(), 0..80),
        percent in 1u32..=100,
    ) {
        let out = capacity::node_resources(&free, percent);
        assert!(out.resources.len() <= capacity::MAX_RESOURCES);
        // Every entry is kept, or refused (a capped one is both).
        assert!(out.resources.len() + out.refused.len() >= free.len());
        for (name, quantity) in &out.resources {
            assert!(labels::is_qualified_name(name));
            let milli = parse_milli(&quantity.0).expect("what is written is a quantity");
            assert!((0..=capacity::cap(name)).contains(&milli), "{name}={}", quantity.0);
        }
    }

    #[test]
    fn quantities_parse_or_refuse_quickly(text in tricky_text()) {
        let started = std::time::Instant::now();
        let _ = parse_milli(&text);
        assert!(started.elapsed() < std::time::Duration::from_millis(50));
    }

    #[test]
    fn millicores_round_trip(n in any::<i64>()) {
        assert_eq!(parse_milli(&format!("{n}m")), Some(i128::from(n)));
    }

    #[test]
    fn only_valid_unreserved_labels_reach_the_node(
        suggested in prop::collection::btree_map(tricky_text(), tricky_text(), 0..100),
    ) {
        let out = labels::node_labels(&suggested);
        assert!(out.kept.len() <= labels::MAX_NODE_LABELS);
        assert_eq!(out.kept.len() + out.refused.len(), suggested.len());
        for (key, value) in &out.kept {
            assert!(labels::is_qualified_name(key), "{key}");
            assert!(labels::is_label_value(value), "{value}");
            assert!(!key.starts_with("kubernetes.io/hostname"));
            assert!(!key.contains("node-role.kubernetes.io"));
        }
    }

    #[test]
    fn admitted_addresses_are_pod_addresses(text in tricky_text()) {
        if let Ok(ip) = addresses().admit(&text) {
            let shown: [ipnet::IpNet; 2] = ["10.71.0.0/16".parse().unwrap(), "172.20.0.0/16".parse().unwrap()];
            assert!(shown.iter().any(|n| n.contains(&ip)), "{text} → {ip}");
        }
        if let Ok(ip) = PodAddresses::default().admit(&text) {
            assert!(!ip.is_loopback() && !ip.is_unspecified() && !ip.is_multicast());
        }
    }
}
