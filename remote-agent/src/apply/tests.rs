//! The write path against a mocked provider API: ownership and refusals decided before any
//! write, and nothing written for a refused request. The mock answers from a table of
//! `(method, path)` and records every request it gets.

use http::Method;
use refract_shared::tls::ClusterId;
use refract_wire::proto::{Delete, Upsert};
use serde_json::{json, Value};

use super::{answer, Applied, ApplyError};
use crate::mock_api::{applier, conflict, provider, writes};

fn tenant() -> ClusterId {
    ClusterId::parse("tenant-a").unwrap()
}

/// A namespace labelled as `owner`'s.
fn namespace(name: &str, owner: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"refract.io/tenant": owner}}})
}

fn upsert(object: &Value) -> Upsert {
    Upsert {
        object: Some(object_ref(object)),
        revision: "1".into(),
        object_json: serde_json::to_vec(object).unwrap(),
        origin_uid: String::new(),
        awaited: false,
        trace_parent: String::new(),
    }
}

fn object_ref(object: &Value) -> refract_wire::proto::ObjectRef {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    refract_wire::proto::ObjectRef {
        api_version: s(&object["apiVersion"]),
        kind: s(&object["kind"]),
        namespace: s(&object["metadata"]["namespace"]),
        name: s(&object["metadata"]["name"]),
    }
}

fn config_map(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"a": "b"}})
}

#[tokio::test]
async fn another_tenants_namespace_is_never_written() {
    let (client, log) = provider(vec![(
        Method::GET,
        "/api/v1/namespaces/shop",
        200,
        namespace("shop", "tenant-b"),
    )]);
    let result = applier(client)
        .apply(&tenant(), &upsert(&config_map("shop", "x")))
        .await;
    assert!(
        matches!(result, Err(ApplyError::NotTenantNamespace { .. })),
        "{result:?}"
    );
    assert_eq!(answer(&result).0, refract_wire::proto::Outcome::Denied);
    assert!(writes(&log).is_empty(), "{:?}", writes(&log));
}

#[tokio::test]
async fn a_foreign_object_of_the_same_name_is_a_conflict_and_left_alone() {
    let foreign = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop", "labels": {"team": "provider"}}});
    let (client, log) = provider(vec![
        (
            Method::GET,
            "/api/v1/namespaces/shop",
            200,
            namespace("shop", "tenant-a"),
        ),
        // The guarded create finds the name taken; the object read is someone else's.
        (
            Method::POST,
            "/api/v1/namespaces/shop/configmaps",
            409,
            conflict(),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/shop/configmaps/x",
            200,
            foreign,
        ),
    ]);
    let a = applier(client);
    let result = a.apply(&tenant(), &upsert(&config_map("shop", "x"))).await;
    assert!(matches!(result, Err(ApplyError::Conflict(_))), "{result:?}");
    let written = writes(&log);
    assert_eq!(
        written,
        vec![(
            Method::POST,
            "/api/v1/namespaces/shop/configmaps".to_string()
        )],
        "only the create that cannot take over"
    );

    // Nor is it deleted.
    let delete = Delete {
        object: Some(object_ref(&config_map("shop", "x"))),
        ..Default::default()
    };
    let result = a.delete(&tenant(), &delete).await;
    assert!(matches!(result, Err(ApplyError::Conflict(_))), "{result:?}");
    assert!(!writes(&log).iter().any(|(m, _)| *m == Method::DELETE));
}

#[tokio::test]
async fn refused_objects_cost_no_write_and_say_why() {
    let (client, log) = provider(vec![(
        Method::GET,
        "/api/v1/namespaces/shop",
        200,
        namespace("shop", "tenant-a"),
    )]);
    let a = applier(client);
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "shop"}, "spec": {"externalIPs": ["1.2.3.4"], "ports": [{"port": 80}]}});
    let result = a.apply(&tenant(), &upsert(&svc)).await;
    let (outcome, message) = answer(&result);
    assert_eq!(outcome, refract_wire::proto::Outcome::Denied);
    assert!(message.contains("spec.externalIPs"), "{message}");

    let mut big = config_map("shop", "big");
    big["data"]["a"] = "x".repeat(70 * 1024).into();
    let result = a.apply(&tenant(), &upsert(&big)).await;
    assert!(
        matches!(result, Err(ApplyError::TooLarge { .. })),
        "{result:?}"
    );

    let mut mismatched = upsert(&config_map("shop", "a"));
    mismatched.object.as_mut().unwrap().name = "b".into();
    let result = a.apply(&tenant(), &mismatched).await;
    assert!(
        matches!(result, Err(ApplyError::Malformed(_))),
        "{result:?}"
    );

    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}});
    let result = a.apply(&tenant(), &upsert(&role)).await;
    assert!(
        matches!(result, Err(ApplyError::KindNotAllowed { .. })),
        "{result:?}"
    );
    assert!(writes(&log).is_empty(), "{:?}", writes(&log));
}

#[tokio::test]
async fn a_new_object_in_the_tenants_namespace_is_created_in_one_request() {
    let created = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop", "resourceVersion": "7"}});
    let (client, log) = provider(vec![
        (
            Method::GET,
            "/api/v1/namespaces/shop",
            200,
            namespace("shop", "tenant-a"),
        ),
        (
            Method::POST,
            "/api/v1/namespaces/shop/configmaps",
            201,
            created,
        ),
    ]);
    let a = applier(client);
    let result = a.apply(&tenant(), &upsert(&config_map("shop", "x"))).await;
    assert_eq!(result, Ok(Applied::Written));
    assert_eq!(writes(&log).len(), 1);
}

#[tokio::test]
async fn a_changed_policy_judges_again_what_is_kept_whole() {
    use super::desired::Keep;
    use super::ObjectKey;
    use crate::kinds::Allowed;
    use crate::policy::{Level, Policies, TenantPolicy};

    let (client, _log) = provider(vec![]);
    let a = applier(client);
    let key = ObjectKey {
        tenant: tenant(),
        kind: Allowed::ShadowPod,
        namespace: "shop-tenant-a".into(),
        name: "web".into(),
    };
    let shadow = json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": "web", "namespace": "shop-tenant-a"},
        "spec": {"pod": {"hostNetwork": true, "containers": [{"name": "c", "image": "busybox"}]}}});
    a.desired
        .remember(key.clone(), &shadow, Keep::Whole, Some("1".into()));
    let privileged = TenantPolicy {
        pod_security: Level::Privileged,
        ..TenantPolicy::default()
    };
    assert!(a.set_policies(Policies::uniform(privileged)).is_empty());
    let refused = a.set_policies(Policies::uniform(TenantPolicy::default()));
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0, key);
    assert!(
        refused[0].1.to_string().contains("hostNetwork"),
        "{}",
        refused[0].1
    );
}

/// An EndpointSlice as the tenant sends it, claiming the provider controller's managed-by.
fn endpoint_slice(ns: &str, name: &str, managed_by: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": managed_by}}, "addressType": "IPv4", "endpoints": [{"addresses": ["10.50.0.7"]}]})
}

#[tokio::test]
async fn a_slice_the_providers_controller_made_is_not_the_tenants_and_a_tenants_slice_is_refracts()
{
    // The provider's EndpointSlice controller copied the reflected Service's labels, the
    // tenant's origin label among them, onto a slice of its own.
    let mut controllers = endpoint_slice("shop", "web-x7k2p", "endpointslice-controller.k8s.io");
    controllers["metadata"]["labels"]["offloading.refract.io/origin"] = json!("tenant-a");
    controllers["metadata"]["labels"]["offloading.refract.io/destination"] = json!("provider");
    let (client, log) = provider(vec![
        (
            Method::GET,
            "/api/v1/namespaces/shop",
            200,
            namespace("shop", "tenant-a"),
        ),
        (
            Method::PATCH,
            "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-x7k2p",
            409,
            conflict(),
        ),
        (
            Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-x7k2p",
            200,
            controllers,
        ),
    ]);
    let a = applier(client);
    let sent = endpoint_slice("shop", "web-x7k2p", "endpointslice-controller.k8s.io");
    let result = a.apply(&tenant(), &upsert(&sent)).await;
    assert!(matches!(result, Err(ApplyError::Conflict(_))), "{result:?}");
    // What the tenant asked to create is labelled as Refract's, whatever it claimed.
    let created = crate::mock_api::bodies(
        &log,
        Method::PATCH,
        "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-x7k2p",
    );
    assert_eq!(
        created[0]["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        json!("endpointslice.reflection.refract.io")
    );
    assert_eq!(
        writes(&log).len(),
        1,
        "only the create that cannot take over"
    );
}
