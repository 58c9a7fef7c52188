//! ServiceAccount tokens end to end: an offloaded pod's projected tokens are requested from the
//! origin's real TokenRequest API, stored in a Secret on the provider and mounted there, work
//! against the origin API server as the pod's service account, are renewed, and go with the
//! pod; with API server support off, none of it happens; without the home API server's address,
//! each pod is warned once; a pod annotated `liqo.io/api-server-support: remote` runs as a
//! provider ServiceAccount the provider's policy allows, with that ServiceAccount's token; and
//! whatever lifetime a pod asks, the provider holds origin tokens of an hour at most.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use base64::Engine;
use refract_e2e::{busybox, kubectl_get, kubectl_stdin, run, Peering};

const WAIT: Duration = Duration::from_secs(60);

/// The offloaded pod: two projected tokens of 600 s, the local busybox image (nothing is
/// pulled).
fn pod_yaml() -> String {
    pod_yaml_asking(600, 600)
}

/// The offloaded pod, its tokens asking `api_seconds` and `vault_seconds`.
fn pod_yaml_asking(api_seconds: u32, vault_seconds: u32) -> String {
    let image = busybox();
    format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: reader, namespace: apps}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: read-pods, namespace: apps}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [get, list]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: reader-reads-pods, namespace: apps}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-pods}}
subjects: [{{kind: ServiceAccount, name: reader, namespace: apps}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: api-client, namespace: apps}}
spec:
  serviceAccountName: reader
  automountServiceAccountToken: false
  containers:
    - name: c
      image: "{image}"
      command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
      volumeMounts:
        - {{name: api-token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}}
        - {{name: vault-token, mountPath: /var/run/secrets/vault}}
  volumes:
    - name: api-token
      projected: {{sources: [{{serviceAccountToken: {{path: token, expirationSeconds: {api_seconds}}}}}]}}
    - name: vault-token
      projected: {{sources: [{{serviceAccountToken: {{path: token, audience: vault, expirationSeconds: {vault_seconds}}}}}]}}
"#
    )
}

fn extend(p: &Peering) {
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {name: offloading, namespace: apps}\nspec: {podOffloadingStrategy: Remote}\n",
    );
}

async fn remote_pod_running(p: &Peering) {
    p.eventually(WAIT, "api-client Running on the provider", || {
        let phase = kubectl_get(
            &p.provider,
            &[
                "-n",
                "apps-origin",
                "pod",
                "api-client",
                "-o",
                "jsonpath={.status.phase}",
            ],
        )?;
        (phase == "Running").then_some(())
    })
    .await;
}

/// The provider pod of api-client.
fn remote_pod(p: &Peering) -> serde_json::Value {
    let json = kubectl_get(
        &p.provider,
        &["-n", "apps-origin", "pod", "api-client", "-o", "json"],
    )
    .expect("the provider pod");
    serde_json::from_str(&json).unwrap()
}

/// The token Secret's data (key → token), or None while it does not exist.
fn token_secret(p: &Peering) -> Option<(serde_json::Value, Vec<(String, String)>)> {
    let json = kubectl_get(
        &p.provider,
        &[
            "-n",
            "apps-origin",
            "secret",
            "api-client-token",
            "-o",
            "json",
        ],
    )?;
    let secret: serde_json::Value = serde_json::from_str(&json).ok()?;
    let data = secret["data"]
        .as_object()?
        .iter()
        .map(|(k, v)| {
            let token = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .unwrap_or_default();
            (k.clone(), String::from_utf8_lossy(&token).into_owned())
        })
        .collect();
    Some((secret, data))
}

fn token_for(data: &[(String, String)], volume: &str) -> String {
    data.iter()
        .find(|(k, _)| k.starts_with(&format!("{volume}-")))
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| panic!("no token of volume {volume} in {data:?}"))
}

/// TokenReview on the origin: the user the token authenticates as, if any.
fn review(p: &Peering, token: &str, audience: Option<&str>) -> Option<String> {
    let audiences = audience
        .map(|a| format!(", audiences: [{a}]"))
        .unwrap_or_default();
    let out = kubectl_stdin(
        &p.origin,
        &["create", "-o", "json", "-f", "-"],
        &format!(
            "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {{token: \"{token}\"{audiences}}}\n"
        ),
    );
    let review: serde_json::Value = serde_json::from_str(&out).unwrap();
    (review["status"]["authenticated"] == true).then(|| {
        review["status"]["user"]["username"]
            .as_str()
            .unwrap()
            .to_string()
    })
}

#[tokio::test]
async fn offloaded_pods_get_origin_tokens_that_work_renew_and_go_with_them() {
    let origin_port_flag;
    let p = {
        // The origin API server's port is only known once it runs: start, then restart the
        // local agent with the address pods should use.
        let mut p = Peering::start_offloading_with(&["--token-refresh-percentage=3"])
            .await
            .expect("peering");
        let port = p.origin.server.rsplit(':').next().unwrap().to_string();
        origin_port_flag = format!("--home-api-server-port={port}");
        p.local.take().unwrap().stop().await;
        p.local_flags
            .push("--home-api-server-host=127.0.0.1".into());
        p.local_flags.push(origin_port_flag.clone());
        p.start_local();
        p
    };
    extend(&p);
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod_yaml());
    remote_pod_running(&p).await;

    let (secret, data) = p
        .eventually(WAIT, "the pod's token Secret on the provider", || {
            token_secret(&p)
        })
        .await;
    assert_eq!(data.len(), 2, "one key per projected token: {data:?}");
    assert_eq!(
        secret["metadata"]["labels"]["offloading.refract.io/service-account-name"],
        "reader"
    );
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["kind"],
        "ShadowPod"
    );

    // The remote pod mounts the Secret where the tokens were, and talks to the origin.
    let remote = remote_pod(&p);
    let source = &remote["spec"]["volumes"][0]["projected"]["sources"][0];
    assert_eq!(source["secret"]["name"], "api-client-token", "{source}");
    assert_eq!(source["secret"]["items"][0]["path"], "token");
    assert!(source["serviceAccountToken"].is_null());
    let env = remote["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains(r#"{"name":"KUBERNETES_SERVICE_HOST","value":"127.0.0.1"}"#)
            && env.contains(&origin_port_flag["--home-api-server-port=".len()..]),
        "{env}"
    );

    // The tokens authenticate at the origin as the pod's service account.
    let api_token = token_for(&data, "api-token");
    assert_eq!(
        review(&p, &api_token, None).as_deref(),
        Some("system:serviceaccount:apps:reader")
    );
    let vault_token = token_for(&data, "vault-token");
    assert_eq!(
        review(&p, &vault_token, Some("vault")).as_deref(),
        Some("system:serviceaccount:apps:reader")
    );
    assert!(
        review(&p, &vault_token, None).is_none(),
        "the vault token must not be valid for the API server's audience"
    );
    // A real request with the token, as the offloaded pod would make it.
    let kc = p.origin.kubeconfig.display().to_string();
    let out = run(
        "kubectl",
        &[
            "--kubeconfig",
            &kc,
            "--token",
            &api_token,
            "-n",
            "apps",
            "get",
            "pod",
            "api-client",
            "-o",
            "name",
        ],
    );
    assert!(
        out.status.success(),
        "request with the reflected token failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pod/api-client"
    );

    // Renewed before expiry: 3% of 600 s is 18 s.
    let expiration = secret["metadata"]["annotations"]
        ["offloading.refract.io/service-account-expiration"]
        .clone();
    p.eventually(WAIT, "the tokens renewed", || {
        let (secret, data) = token_secret(&p)?;
        (token_for(&data, "api-token") != api_token
            && secret["metadata"]["annotations"]
                ["offloading.refract.io/service-account-expiration"]
                != expiration)
            .then_some(())
    })
    .await;

    // Gone with the pod, and no longer valid at the origin.
    p.origin_kubectl(&["-n", "apps", "delete", "pod", "api-client", "--wait=false"]);
    p.eventually(WAIT, "the token Secret removed from the provider", || {
        token_secret(&p).is_none().then_some(())
    })
    .await;
    p.eventually(WAIT, "the pod's tokens rejected by the origin", || {
        review(&p, &api_token, None).is_none().then_some(())
    })
    .await;
    assert!(
        !pod_event_reasons(&p).contains("HomeAPIServerUnset"),
        "a pod was warned although the home API server is set"
    );
}

/// A JWT's lifetime: its `exp` less its `iat`, in seconds.
fn lifetime(token: &str) -> i64 {
    let payload = token.split('.').nth(1).expect("a JWT");
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .expect("a base64url payload");
    let claims: serde_json::Value = serde_json::from_slice(&claims).unwrap();
    claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap()
}

#[tokio::test]
async fn origin_tokens_given_to_the_provider_live_an_hour_at_most() {
    let p = Peering::start_offloading().await.expect("peering");
    extend(&p);
    // 3607 s is what the default kube-api-access volume asks, and what the origin API server
    // (at its defaults, as here) extends to a year.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &pod_yaml_asking(3607, 86_400),
    );
    remote_pod_running(&p).await;
    let (_, data) = p
        .eventually(WAIT, "the pod's token Secret on the provider", || {
            token_secret(&p)
        })
        .await;
    let api = lifetime(&token_for(&data, "api-token"));
    let vault = lifetime(&token_for(&data, "vault-token"));
    println!(
        "token lifetimes on the provider: asked 3607 s, got {api} s; asked 86400 s, got {vault} s"
    );
    assert_eq!((api, vault), (3600, 3600));
    // Still the pod's working tokens.
    assert_eq!(
        review(&p, &token_for(&data, "api-token"), None).as_deref(),
        Some("system:serviceaccount:apps:reader")
    );
}

#[tokio::test]
async fn with_api_server_support_disabled_no_token_leaves_the_origin() {
    let p = Peering::start_offloading_with(&["--enable-apiserver-support=false"])
        .await
        .expect("peering");
    extend(&p);
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod_yaml());
    remote_pod_running(&p).await;
    let remote = remote_pod(&p);
    let sources = &remote["spec"]["volumes"][0]["projected"]["sources"];
    assert!(
        sources.as_array().is_none_or(|s| s.is_empty()),
        "projected tokens must be removed: {sources}"
    );
    assert!(remote["spec"]["containers"][0]["env"].is_null());
    // Give a token reflector every chance to act, then check none did.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(token_secret(&p).is_none());
    let secrets = kubectl_get(&p.provider, &["-n", "apps-origin", "secrets", "-o", "name"])
        .unwrap_or_default();
    assert!(!secrets.contains("api-client-token"), "{secrets}");
}

/// The reasons of the origin's events about pod api-client.
fn pod_event_reasons(p: &Peering) -> String {
    kubectl_get(
        &p.origin,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            "involvedObject.name=api-client",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
    )
    .unwrap_or_default()
}

#[tokio::test]
async fn without_a_home_api_server_address_each_pod_is_warned() {
    let p = Peering::start_offloading().await.expect("peering");
    extend(&p);
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &pod_yaml());
    remote_pod_running(&p).await;
    p.eventually(WAIT, "a HomeAPIServerUnset warning on the pod", || {
        pod_event_reasons(&p)
            .split_whitespace()
            .any(|r| r == refract_local_agent::tokens::HOME_API_SERVER_UNSET_REASON)
            .then_some(())
    })
    .await;
    // Once per pod, not at every token renewal.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let warned = kubectl_get(
        &p.origin,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            "reason=HomeAPIServerUnset",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    )
    .unwrap_or_default();
    assert!(
        warned.split_whitespace().count() == 1,
        "expected one HomeAPIServerUnset event, found {warned:?}"
    );
}

/// An origin pod annotated `liqo.io/api-server-support: remote`, run as `account` on the
/// provider when `provider_account` names one.
fn remote_access_pod(name: &str, provider_account: Option<&str>) -> String {
    let image = busybox();
    let named = provider_account
        .map(|a| format!(", liqo.io/remote-service-account-name: {a}"))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: apps
  annotations: {{liqo.io/api-server-support: remote{named}}}
spec:
  serviceAccountName: reader
  containers:
    - name: c
      image: "{image}"
      command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
    )
}

#[tokio::test]
async fn remote_api_server_support_runs_pods_as_a_provider_service_account_the_policy_allows() {
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(
        policy.path(),
        "tenants:\n  origin: {serviceAccounts: [reader]}\n",
    )
    .expect("policy file");
    let mut p = Peering::start_offloading().await.expect("peering");
    p.restart_remote_with(format!("--policy={}", policy.path().display()))
        .await;
    extend(&p);
    // The origin's own ServiceAccount (its legacy token Secret is mounted by the origin's
    // admission on Kubernetes up to 1.20, and must not follow the pod).
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: reader, namespace: apps}\n",
    );
    // The provider's operator creates the ServiceAccount in the tenant's namespace.
    p.eventually(WAIT, "the twin namespace on the provider", || {
        kubectl_get(&p.provider, &["namespace", "apps-origin", "-o", "name"])
    })
    .await;
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: reader, namespace: apps-origin}\n",
    );
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &remote_access_pod("api-client", None),
    );
    remote_pod_running(&p).await;

    let remote = remote_pod(&p);
    assert_eq!(remote["spec"]["serviceAccountName"], "reader");
    let volumes = remote["spec"]["volumes"].to_string();
    assert!(
        !volumes.contains("api-client-token"),
        "no origin token for a remote-access pod: {volumes}"
    );

    // Read through the origin, as the pod's owner would: the token in the pod is the
    // provider's, for the provider ServiceAccount in the tenant's namespace.
    let read = |file: &str| {
        let path = format!("/var/run/secrets/kubernetes.io/serviceaccount/{file}");
        p.origin_kubectl(&["-n", "apps", "exec", "api-client", "--", "cat", &path])
    };
    let token = read("token");
    let namespace = read("namespace");
    assert_eq!(namespace.trim(), "apps-origin");
    let review = kubectl_stdin(
        &p.provider,
        &["create", "-o", "json", "-f", "-"],
        &format!(
            "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {{token: \"{}\"}}\n",
            token.trim()
        ),
    );
    let review: serde_json::Value = serde_json::from_str(&review).unwrap();
    assert_eq!(
        review["status"]["user"]["username"], "system:serviceaccount:apps-origin:reader",
        "{review}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(token_secret(&p).is_none(), "no origin token Secret");
    assert!(
        !pod_event_reasons(&p).contains("HomeAPIServerUnset"),
        "a remote-access pod needs no home API server"
    );

    // A ServiceAccount the policy does not list is refused, with the reason, on the pod.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &remote_access_pod("admin-client", Some("admin")),
    );
    let message = p
        .eventually(WAIT, "admin-client refused", || {
            let status = kubectl_get(
                &p.origin,
                &[
                    "-n",
                    "apps",
                    "pod",
                    "admin-client",
                    "-o",
                    "jsonpath={.status.reason} {.status.message}",
                ],
            )?;
            status
                .starts_with(refract_local_agent::pods::DENIED_REASON)
                .then_some(status)
        })
        .await;
    assert!(
        message.contains(r#"ServiceAccount \"admin\" is not allowed"#)
            || message.contains(r#"ServiceAccount "admin" is not allowed"#),
        "{message}"
    );
    assert!(
        kubectl_get(&p.provider, &["-n", "apps-origin", "pod", "admin-client"]).is_none(),
        "a refused pod never reaches the provider"
    );
}
