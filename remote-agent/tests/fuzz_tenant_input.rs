//! Fuzz-style properties of every decoder of what a tenant sends the remote agent: the
//! protobuf envelope and the objects inside it, through the policy checks of each kind.
//! Arbitrary or mutated input must end in a refusal or an object that passes its check again
//! unchanged; never a panic.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use proptest::prelude::*;
use prost::Message;
use refract_core::options::Kind;
use refract_remote_agent::apply::judge::{decode_desired, Judge};
use refract_remote_agent::kinds::Allowed;
use refract_remote_agent::policy::{ProviderNetworks, ReservedNames, TenantPolicy};
use refract_shared::tls::ClusterId;
use refract_testkit::fuzz::{config, json_value, mutated};
use refract_wire::proto::{local_message, LocalMessage, ObjectRef, Upsert};
use serde_json::{json, Value};

/// One valid object of each kind a tenant may send, as the local agent forges them.
fn valid_objects() -> Vec<(Allowed, Value)> {
    let meta =
        |name: &str| json!({"name": name, "namespace": "apps-origin", "labels": {"app": "web"}});
    vec![
        (
            Allowed::Namespace,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps-origin"}}),
        ),
        (
            Allowed::ShadowPod,
            json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod", "metadata": meta("web"),
            "spec": {"pod": {"containers": [{"name": "app", "image": "nginx", "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": "100m"}}}], "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}]}}}),
        ),
        (
            Allowed::Reflected(Kind::Service),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("web"),
            "spec": {"type": "ClusterIP", "ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": "web"}}}),
        ),
        (
            Allowed::Reflected(Kind::EndpointSlice),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta("web-abc"),
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.5"]}], "ports": [{"port": 8080}]}),
        ),
        (
            Allowed::Reflected(Kind::Ingress),
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta("web"),
            "spec": {"rules": [{"host": "web.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
        ),
        (
            Allowed::Reflected(Kind::PersistentVolumeClaim),
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta("data"),
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        ),
        (
            Allowed::Reflected(Kind::Secret),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("creds"), "type": "Opaque", "data": {"k": "dg=="}}),
        ),
        (
            Allowed::Reflected(Kind::ConfigMap),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cfg"), "data": {"k": "v"}}),
        ),
    ]
}

/// Runs the remote agent's judgement on `object`, as the write path does after decoding;
/// when it passes, judging the result again must pass and change nothing (a restore of drift
/// goes through the same judgement).
fn check_twice(kind: Allowed, object: Value) {
    let policy = TenantPolicy::default();
    let networks = ProviderNetworks {
        cidrs: vec!["10.96.0.0/12".parse().unwrap()],
    };
    let (tenant, provider) = (
        ClusterId::parse("origin").unwrap(),
        ClusterId::parse("provider").unwrap(),
    );
    let judge = Judge {
        tenant: &tenant,
        provider: &provider,
        policy: &policy,
        networks: &networks,
        reserved: &ReservedNames::default(),
    };
    if let Ok(judged) = judge.judge(kind, object) {
        let again = judge.judge(kind, judged.clone());
        assert!(
            again.is_ok(),
            "{kind:?} passed once, then refused: {again:?}\n{judged}"
        );
        assert_eq!(
            again.unwrap(),
            judged,
            "{kind:?}: judging twice changed the object"
        );
    }
}

/// The envelope an object of `kind` travels in, named as the object names itself.
fn envelope_of(kind: Allowed, object: &Value) -> ObjectRef {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    ObjectRef {
        api_version: text(&object["apiVersion"]),
        kind: text(&object["kind"]),
        namespace: if kind == Allowed::Namespace {
            String::new()
        } else {
            "apps-origin".into()
        },
        name: text(&object["metadata"]["name"]),
    }
}

fn valid_envelope() -> Vec<u8> {
    let (_, object) = &valid_objects()[1];
    LocalMessage {
        kind: Some(local_message::Kind::Upsert(Upsert {
            object: Some(ObjectRef {
                api_version: "offloading.refract.io/v1alpha1".into(),
                kind: "ShadowPod".into(),
                namespace: "apps-origin".into(),
                name: "web".into(),
            }),
            revision: "7".into(),
            object_json: serde_json::to_vec(object).unwrap(),
            origin_uid: "u".into(),
            awaited: false,
            trace_parent: String::new(),
        })),
    }
    .encode_to_vec()
}

fn kinds() -> impl Strategy<Value = (Allowed, Value)> {
    prop::sample::select(valid_objects())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_envelope_decodes_or_refuses_anything(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        mutated(valid_envelope(), 12),
    ]) {
        if let Ok(LocalMessage { kind: Some(local_message::Kind::Upsert(u)) }) = LocalMessage::decode(bytes.as_slice()) {
            if let Some(object) = u.object {
                if let Some(kind) = Allowed::lookup(&object.api_version, &object.kind) {
                    if let Ok(value) = decode_desired(kind, &object, &u.object_json) {
                        check_twice(kind, value);
                    }
                }
            }
        }
    }

    #[test]
    fn mutated_objects_are_refused_or_pass_again_unchanged(
        (kind, bytes) in kinds().prop_flat_map(|(kind, v)| (Just(kind), mutated(serde_json::to_vec(&v).unwrap(), 10))),
    ) {
        let (_, valid) = valid_objects().into_iter().find(|(k, _)| *k == kind).unwrap();
        if let Ok(value) = decode_desired(kind, &envelope_of(kind, &valid), &bytes) {
            check_twice(kind, value);
        }
    }

    #[test]
    fn arbitrary_fields_grafted_onto_valid_objects(
        (kind, base) in kinds(),
        path in prop::sample::select(vec!["metadata", "spec", "spec/pod", "spec/pod/containers/0", "spec/ports/0", "endpoints/0", "data", "spec/rules/0"]),
        graft in json_value(),
    ) {
        let mut object = base;
        // Where the path does not exist in this kind, the fields go onto the object itself.
        let pointer = format!("/{path}");
        let at = if object.pointer(&pointer).is_some() {
            object.pointer_mut(&pointer)
        } else {
            Some(&mut object)
        };
        if let Some(at) = at {
            match (at.as_object_mut(), graft) {
                (Some(target), Value::Object(fields)) => target.extend(fields),
                (_, other) => *at = other,
            }
        }
        check_twice(kind, object);
    }

    #[test]
    fn arbitrary_json_as_any_kind(
        (kind, _) in kinds(),
        value in json_value(),
    ) {
        check_twice(kind, value);
    }
}
