//! Each tenant writes as its own Kubernetes identity, so the provider's API server, not only
//! the remote agent's code, keeps a tenant inside its namespaces. The remote agent writes the
//! tenant's ServiceAccount and a RoleBinding in its twin namespace; a reflected ConfigMap
//! reaches the provider written as that account; and a write deliberately aimed at another
//! tenant's namespace through the agent's write path (a test hook that skips the agent's own
//! checks) is refused with 403 by the real API server.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{can_i, kubectl, kubectl_get, kubectl_stdin, Peering};
use refract_remote_agent::apply::{write_unchecked, ApplyError};
use refract_remote_agent::identity::Identities;
use refract_remote_agent::kinds::Allowed;
use refract_shared::tls::ClusterId;

const WAIT: Duration = Duration::from_secs(30);
const ACCOUNT: &str = "system:serviceaccount:refract-system:tenant-origin";

#[tokio::test]
async fn the_api_server_keeps_each_tenant_in_its_own_namespaces() {
    let p = Peering::start(false).await.expect("peering");
    p.extend("shop", "{}");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: shop}\ndata: {color: blue}\n",
    );
    p.eventually(WAIT, "the reflected ConfigMap on the provider", || {
        kubectl_get(
            &p.provider,
            &[
                "-n",
                "shop-origin",
                "configmap",
                "settings",
                "-o",
                "jsonpath={.data.color}",
            ],
        )
        .filter(|c| c == "blue")
    })
    .await;

    // The tenant's account and its binding, written by the agent.
    let account = kubectl(
        &p.provider,
        &[
            "-n",
            "refract-system",
            "get",
            "serviceaccount",
            "tenant-origin",
            "-o",
            "jsonpath={.metadata.labels.refract\\.io/tenant} {.automountServiceAccountToken}",
        ],
    );
    assert_eq!(account, "origin false");
    let binding = kubectl(
        &p.provider,
        &[
            "-n",
            "shop-origin",
            "get",
            "rolebinding",
            "refract-tenant",
            "-o",
            "jsonpath={.roleRef.kind}/{.roleRef.name} {.subjects[0].namespace}/{.subjects[0].name}",
        ],
    );
    assert_eq!(
        binding,
        "ClusterRole/refract-tenant refract-system/tenant-origin"
    );

    // What the account may do, as the API server answers: its namespace only, and not its
    // fences.
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: rival-x, labels: {refract.io/tenant: rival}}\n",
    );
    assert_eq!(
        can_i(&p.provider, ACCOUNT, "create", "pods", "shop-origin"),
        "yes"
    );
    assert_eq!(
        can_i(&p.provider, ACCOUNT, "create", "pods", "rival-x"),
        "no"
    );
    assert_eq!(
        can_i(&p.provider, ACCOUNT, "create", "pods", "default"),
        "no"
    );
    assert_eq!(
        can_i(
            &p.provider,
            ACCOUNT,
            "patch",
            "resourcequotas",
            "shop-origin"
        ),
        "no"
    );
    assert_eq!(
        can_i(
            &p.provider,
            ACCOUNT,
            "create",
            "rolebindings",
            "shop-origin"
        ),
        "no"
    );

    // The write path, aimed by the hook at another tenant's namespace: refused by the API
    // server itself.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&p.provider.kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let own = kube::Client::try_from(config.clone()).unwrap();
    let identities = Identities::impersonating(own, config, "refract-system".into());
    let tenant = ClusterId::parse("origin").unwrap();
    let configmap = |ns: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "planted", "namespace": ns},
            "data": {"from": "origin"},
        })
    };
    let kind = Allowed::Reflected(refract_core::options::Kind::ConfigMap);
    let refused = write_unchecked(&identities, &tenant, kind, "rival-x", configmap("rival-x"))
        .await
        .expect_err("a write into another tenant's namespace must be refused");
    let ApplyError::Forbidden(message) = &refused else {
        panic!("expected the API server's 403, got {refused:?}");
    };
    println!("the provider's API server answered: 403 {message}");
    assert!(
        message.contains(ACCOUNT) && message.contains("\"rival-x\""),
        "{message}"
    );
    assert!(
        kubectl_get(&p.provider, &["-n", "rival-x", "configmap", "planted"]).is_none(),
        "nothing was written"
    );
    // The same hook in the tenant's own namespace writes: the refusal is the namespace's.
    write_unchecked(
        &identities,
        &tenant,
        kind,
        "shop-origin",
        configmap("shop-origin"),
    )
    .await
    .expect("a write in the tenant's own namespace");

    // A binding removed by hand: the tenant's next write is refused by the API server, and the
    // one after writes the binding again and goes through.
    kubectl(
        &p.provider,
        &[
            "-n",
            "shop-origin",
            "delete",
            "rolebinding",
            "refract-tenant",
        ],
    );
    let mut round = 0;
    p.eventually(WAIT, "the tenant's writes through again", || {
        round += 1;
        kubectl_stdin(
            &p.origin,
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: shop}}\ndata: {{color: green-{round}}}\n"),
        );
        kubectl_get(
            &p.provider,
            &["-n", "shop-origin", "configmap", "settings", "-o", "jsonpath={.data.color}"],
        )
        .filter(|c| c.starts_with("green"))
    })
    .await;
    assert!(
        kubectl_get(
            &p.provider,
            &["-n", "shop-origin", "rolebinding", "refract-tenant"]
        )
        .is_some(),
        "the binding is back"
    );
}
