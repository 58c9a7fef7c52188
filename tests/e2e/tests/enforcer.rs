//! The remote agent as the enforcer: a tenant holding a valid certificate (a compromised
//! origin, or anyone with its key) forges requests on the wire, and the provider refuses or
//! sanitizes each one, writing nothing it refused. The real remote agent runs against a real
//! API server; the tenant is the in-process [`Wire`] client with its own certificate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::wire::{delete_message, object_ref, upsert_message, Answer, Wire};
use refract_e2e::{kubectl_get, kubectl_stdin, rss_kib, Peering};
use refract_wire::proto::Outcome;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The forging tenant's cluster id, and its twin namespace on the provider.
const TENANT: &str = "mallory";
const NS: &str = "shop-mallory";
/// The provider's own pod range in these tests (`--provider-cidr`).
const PROVIDER_CIDR: &str = "10.200.0.0/16";

/// A peering (its own local agent is the tenant `origin`), a policy file for the remote agent,
/// and the forging tenant connected with a namespace of its own.
async fn forger(policy: &str) -> (Peering, Wire, tempfile::NamedTempFile) {
    forger_with(policy, &[]).await
}

/// Like [`forger`], with extra remote agent flags.
async fn forger_with(policy: &str, extra: &[&str]) -> (Peering, Wire, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(file.path(), policy).expect("policy file");
    let flags = [
        format!("--policy={}", file.path().display()),
        format!("--provider-cidr={PROVIDER_CIDR}"),
        "--max-object-bytes=1048576".to_string(),
    ];
    let flags: Vec<&str> = flags
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    let (p, wire) = forger_on(&flags).await;
    (p, wire, file)
}

/// The forging tenant against a remote agent run with `flags` on top of those `deploy/`
/// ships, connected with a namespace of its own.
async fn forger_on(flags: &[&str]) -> (Peering, Wire) {
    let p = Peering::start_with_flags(false, &[], flags)
        .await
        .expect("peering");
    let certs = p.certs.issue("mallory", TENANT, "client", &[]);
    // The remote agent may still be starting.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut wire = loop {
        match Wire::open(&p.remote_addr, "provider", TENANT, &certs).await {
            Ok(wire) => break wire,
            Err(e) if std::time::Instant::now() > deadline => {
                panic!(
                    "the forging tenant cannot connect: {e:#}\n{}",
                    p.remote_log()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS,
        "annotations": {"refract.io/original-name": "shop"}}});
    applied(wire.upsert(&ns).await.unwrap(), "the tenant's namespace");
    (p, wire)
}

fn applied(answer: Answer, what: &str) {
    assert!(
        matches!(answer.outcome, Outcome::Applied | Outcome::Unchanged),
        "{what}: {answer:?}"
    );
}

/// Asserts the request was refused with `outcome` and a message naming `reason`.
fn refused(answer: Answer, outcome: Outcome, reason: &str) {
    assert_eq!(answer.outcome, outcome, "{reason}: {answer:?}");
    assert!(
        answer.message.contains(reason),
        "message {:?} does not say {reason:?}",
        answer.message
    );
}

fn provider_has(p: &Peering, what: &str) -> bool {
    kubectl_get(&p.provider, &["-n", NS, what, "-o", "name"]).is_some()
}

fn shadow(name: &str, pod: Value) -> Value {
    json!({"apiVersion": "offloading.refract.io/v1alpha1", "kind": "ShadowPod",
        "metadata": {"name": name, "namespace": NS}, "spec": {"pod": pod}})
}

fn container() -> Value {
    json!({"name": "app", "image": "refract.local/busybox:1.35.0"})
}

#[tokio::test]
async fn forged_pods_are_refused_or_sanitized() {
    let (p, mut wire, _policy) = forger("defaults: {podSecurity: baseline}\n").await;
    let c = container();
    let forged = [
        (
            "node-name",
            json!({"nodeName": "localhost", "containers": [c]}),
            "spec.pod.nodeName",
        ),
        (
            "critical",
            json!({"priorityClassName": "system-node-critical", "containers": [c]}),
            "spec.pod.priorityClassName",
        ),
        (
            "every-taint",
            json!({"tolerations": [{"operator": "Exists"}], "containers": [c]}),
            "toleration of every taint",
        ),
        (
            "control-plane",
            json!({"tolerations": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}], "containers": [c]}),
            "control plane",
        ),
        (
            "provider-sa",
            json!({"serviceAccountName": "remote-agent", "containers": [c]}),
            "spec.pod.serviceAccountName",
        ),
        (
            "projected-token",
            json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}], "containers": [c]}),
            "serviceAccountToken",
        ),
        (
            "privileged",
            json!({"containers": [{"name": "app", "image": "x", "securityContext": {"privileged": true}}]}),
            "privileged",
        ),
        (
            "host-path",
            json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}], "containers": [c]}),
            "hostPath",
        ),
        (
            "host-net",
            json!({"hostNetwork": true, "containers": [c]}),
            "spec.pod.hostNetwork",
        ),
    ];
    for (name, pod, reason) in forged {
        let answer = wire.upsert(&shadow(name, pod)).await.unwrap();
        refused(answer, Outcome::Denied, reason);
        assert!(
            !provider_has(&p, &format!("shadowpod/{name}")),
            "{name} was written"
        );
    }

    // A Secret of the provider's in the tenant's namespace (as the legacy token controller
    // makes for `default`) is never mounted into a tenant's pod.
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: provider-creds, namespace: {NS}}}\nstringData: {{token: provider}}\n"),
    );
    let reads = json!({"volumes": [{"name": "s", "secret": {"secretName": "provider-creds"}}], "containers": [c]});
    refused(
        wire.upsert(&shadow("steal", reads)).await.unwrap(),
        Outcome::Denied,
        "is the provider's",
    );
    let token_type = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "mint", "namespace": NS, "annotations": {"kubernetes.io/service-account.name": "default"}}});
    refused(
        wire.upsert(&token_type).await.unwrap(),
        Outcome::Denied,
        "service-account-token",
    );
    assert!(!provider_has(&p, "secret/mint"));

    // A pod within the policy is written, never with the provider's token mounted.
    let fine = json!({"automountServiceAccountToken": true, "containers": [c]});
    applied(
        wire.upsert(&shadow("fine", fine)).await.unwrap(),
        "a baseline pod",
    );
    let automount = kubectl_get(
        &p.provider,
        &[
            "-n",
            NS,
            "shadowpod/fine",
            "-o",
            "jsonpath={.spec.pod.automountServiceAccountToken}",
        ],
    );
    assert_eq!(automount.as_deref(), Some("false"));
}

#[tokio::test]
async fn the_restricted_level_is_enforced_per_tenant() {
    let policy = "tenants:\n  mallory: {podSecurity: restricted, priorityClasses: [tenant-high]}\n";
    let (p, mut wire, _policy) = forger(policy).await;
    let plain = json!({"containers": [container()]});
    refused(
        wire.upsert(&shadow("plain", plain)).await.unwrap(),
        Outcome::Denied,
        "allowPrivilegeEscalation",
    );
    let hardened = json!({
        "priorityClassName": "tenant-high",
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "app", "image": "refract.local/busybox:1.35.0",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
    });
    applied(
        wire.upsert(&shadow("hardened", hardened)).await.unwrap(),
        "a restricted pod",
    );
    assert!(provider_has(&p, "shadowpod/hardened"));
    assert!(!provider_has(&p, "shadowpod/plain"));
    let label = kubectl_get(
        &p.provider,
        &[
            "namespace",
            NS,
            "-o",
            "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
        ],
    );
    assert_eq!(label.as_deref(), Some("restricted"));
}

#[tokio::test]
async fn forged_exposition_is_refused_or_sanitized() {
    let policy = "tenants:\n  mallory:\n    ingress: {classes: [public]}\n";
    let (p, mut wire, _policy) = forger(policy).await;
    let svc = |name: &str, spec: Value| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": spec})
    };
    let port = json!([{"port": 80, "protocol": "TCP"}]);
    let forged = [
        svc(
            "external",
            json!({"externalIPs": ["10.96.0.1"], "ports": port}),
        ),
        svc(
            "cluster-ip",
            json!({"clusterIP": "10.0.0.10", "ports": port}),
        ),
        svc(
            "lb-ip",
            json!({"type": "LoadBalancer", "loadBalancerIP": "192.0.2.10", "ports": port}),
        ),
        svc(
            "node-port",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30999}]}),
        ),
    ];
    for (object, field) in forged.iter().zip([
        "spec.externalIPs",
        "spec.clusterIP",
        "spec.loadBalancerIP",
        "nodePort",
    ]) {
        refused(wire.upsert(object).await.unwrap(), Outcome::Denied, field);
        let name = object["metadata"]["name"].as_str().unwrap();
        assert!(
            !provider_has(&p, &format!("service/{name}")),
            "{name} was written"
        );
    }
    applied(
        wire.upsert(&svc("web", json!({"ports": port})))
            .await
            .unwrap(),
        "a plain Service",
    );

    let slice = |name: &str, address: &str| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"addresses": [address], "targetRef": {"kind": "Pod", "namespace": "kube-system", "name": "etcd"}}],
            "ports": [{"port": 80}]})
    };
    for (name, address, reason) in [
        ("loopback", "127.0.0.1", "loopback"),
        ("metadata", "169.254.169.254", "link-local"),
        ("provider-pod", "10.200.0.7", "provider's own range"),
    ] {
        refused(
            wire.upsert(&slice(name, address)).await.unwrap(),
            Outcome::Denied,
            reason,
        );
        assert!(!provider_has(&p, &format!("endpointslice/{name}")));
    }
    applied(
        wire.upsert(&slice("origin-pods", "10.0.3.7"))
            .await
            .unwrap(),
        "an origin address",
    );
    let target = kubectl_get(
        &p.provider,
        &[
            "-n",
            NS,
            "endpointslice/origin-pods",
            "-o",
            "jsonpath={.endpoints[0].targetRef}",
        ],
    );
    assert_eq!(target.as_deref(), Some(""), "targetRef was kept");

    let ingress = |name: &str, annotations: Value, class: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"ingressClassName": class, "defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}})
    };
    let snippet = json!({"nginx.ingress.kubernetes.io/server-snippet": "location / { proxy_pass http://10.0.0.1; }"});
    refused(
        wire.upsert(&ingress("snippet", snippet, "public"))
            .await
            .unwrap(),
        Outcome::Denied,
        "snippet",
    );
    refused(
        wire.upsert(&ingress("internal", json!({}), "internal"))
            .await
            .unwrap(),
        Outcome::Denied,
        "ingress class",
    );
    applied(
        wire.upsert(&ingress("web", json!({}), "public"))
            .await
            .unwrap(),
        "an allowed Ingress",
    );
    assert!(!provider_has(&p, "ingress/snippet") && !provider_has(&p, "ingress/internal"));
}

#[tokio::test]
async fn forged_claims_are_refused_or_sanitized() {
    let policy = "tenants:\n  mallory: {storageClasses: [standard]}\n";
    let (p, mut wire, _policy) = forger(policy).await;
    let claim = |name: &str, extra: Value| {
        let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "standard"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS}, "spec": spec})
    };
    for (name, extra, reason) in [
        (
            "steal-volume",
            json!({"volumeName": "pv-of-another-tenant"}),
            "spec.volumeName",
        ),
        (
            "gold",
            json!({"storageClassName": "gold"}),
            "StorageClass \"gold\"",
        ),
        (
            "copy",
            json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "data", "namespace": "other"}}),
            "another namespace",
        ),
    ] {
        refused(
            wire.upsert(&claim(name, extra)).await.unwrap(),
            Outcome::Denied,
            reason,
        );
        assert!(!provider_has(&p, &format!("pvc/{name}")));
    }
    applied(
        wire.upsert(&claim("data", json!({}))).await.unwrap(),
        "a claim of an allowed class",
    );
}

#[tokio::test]
async fn forged_namespaces_are_refused_or_sanitized() {
    let (p, mut wire, _policy) = forger("{}\n").await;
    // Namespace labels and annotations are the provider's, whatever the tenant sends.
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "admin-mallory",
        "labels": {"pod-security.kubernetes.io/enforce": "privileged", "refract.io/tenant": "origin"},
        "annotations": {"refract.io/original-name": "admin", "scheduler.alpha.kubernetes.io/node-selector": "role=control-plane"}}});
    applied(wire.upsert(&ns).await.unwrap(), "a namespace");
    let labels = kubectl_get(
        &p.provider,
        &[
            "namespace",
            "admin-mallory",
            "-o",
            "jsonpath={.metadata.labels}",
        ],
    )
    .unwrap();
    let labels: Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(
        labels["pod-security.kubernetes.io/enforce"], "baseline",
        "{labels}"
    );
    assert_eq!(labels["refract.io/tenant"], TENANT, "{labels}");
    let selector = kubectl_get(
        &p.provider,
        &[
            "namespace",
            "admin-mallory",
            "-o",
            "jsonpath={.metadata.annotations.scheduler\\.alpha\\.kubernetes\\.io/node-selector}",
        ],
    );
    assert_eq!(selector.as_deref(), Some(""));

    // Two origin namespaces never share a twin.
    let other = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS,
        "annotations": {"refract.io/original-name": "another"}}});
    refused(
        wire.upsert(&other).await.unwrap(),
        Outcome::Conflict,
        "already mirrors origin namespace \"shop\"",
    );

    // Another tenant's namespace is not this tenant's, to write into or to take over: its name
    // does not even carry this tenant's identity.
    let origin_ns =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop-origin"}});
    kubectl_stdin(&p.provider, &["apply", "-f", "-"], "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop-origin, labels: {refract.io/tenant: origin, offloading.refract.io/origin: origin, offloading.refract.io/destination: provider}}\n");
    refused(
        wire.upsert(&origin_ns).await.unwrap(),
        Outcome::Denied,
        "does not carry tenant mallory's identity",
    );
    // One whose name carries it but that is someone else's is left alone.
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: ops-mallory}\n",
    );
    let foreign =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops-mallory"}});
    refused(
        wire.upsert(&foreign).await.unwrap(),
        Outcome::Conflict,
        "was not reflected by mallory",
    );
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop-origin"}});
    refused(
        wire.upsert(&cm).await.unwrap(),
        Outcome::Denied,
        "is not a namespace of tenant mallory",
    );
    let deleted = wire.delete(object_ref(&origin_ns)).await.unwrap();
    assert_eq!(deleted.outcome, Outcome::Conflict, "{deleted:?}");
    assert!(kubectl_get(&p.provider, &["namespace", "shop-origin", "-o", "name"]).is_some());
}

/// No policy file and no `--provider-cidr`: the remote agent as `deploy/` runs it. The bypasses
/// its defaults close are tried over the wire and refused, and nothing of them is written.
#[tokio::test]
async fn at_the_shipped_defaults_the_known_bypasses_are_refused() {
    let (p, mut wire) = forger_on(&[]).await;
    let namespace =
        |name: &str| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    for (name, reason) in [
        ("monitoring", "does not carry tenant mallory's identity"),
        ("cert-manager", "does not carry tenant mallory's identity"),
        ("kube-mallory", "is one of the provider's own"),
        ("default", "is one of the provider's own"),
        ("refract-system", "is one of the provider's own"),
    ] {
        refused(
            wire.upsert(&namespace(name)).await.unwrap(),
            Outcome::Denied,
            reason,
        );
    }
    let external = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": NS},
        "spec": {"type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local"}});
    refused(
        wire.upsert(&external).await.unwrap(),
        Outcome::Denied,
        "ExternalName are not allowed",
    );
    let ingress = |name: &str, key: &str, value: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS, "annotations": {key: value}},
            "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}})
    };
    for (name, key, value) in [
        (
            "auth",
            "nginx.ingress.kubernetes.io/auth-url",
            "http://10.96.0.1/",
        ),
        (
            "auth-tls",
            "nginx.ingress.kubernetes.io/auth-tls-match-cn",
            "CN=x",
        ),
        (
            "mirror",
            "nginx.ingress.kubernetes.io/mirror-target",
            "http://10.96.0.1/",
        ),
    ] {
        refused(
            wire.upsert(&ingress(name, key, value)).await.unwrap(),
            Outcome::Denied,
            "not in the provider's allowlist for Ingresses",
        );
    }
    applied(
        wire.upsert(&ingress(
            "web",
            "nginx.ingress.kubernetes.io/rewrite-target",
            "/",
        ))
        .await
        .unwrap(),
        "an Ingress with a safe annotation",
    );
    // Pods placed by labels of the provider's own node roles, by another scheduler, or next to
    // another tenant's pods.
    let placed = |name: &str, placement: Value| {
        let mut pod = json!({"containers": [container()]});
        for (k, v) in placement.as_object().unwrap() {
            pod[k] = v.clone();
        }
        shadow(name, pod)
    };
    for (name, placement, reason) in [
        (
            "on-control-plane",
            json!({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}),
            "node label \"node-role.kubernetes.io/control-plane\" is not one this tenant may select",
        ),
        (
            "own-scheduler",
            json!({"schedulerName": "tenant-scheduler"}),
            "only the provider's default-scheduler places tenant pods",
        ),
        (
            "next-to-others",
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "namespaces": ["shop-origin"], "labelSelector": {}}]}}}),
            "pod affinity may only look at the pod's own namespace",
        ),
    ] {
        refused(
            wire.upsert(&placed(name, placement)).await.unwrap(),
            Outcome::Denied,
            reason,
        );
        assert!(!provider_has(&p, &format!("shadowpod/{name}")), "{name}");
    }
    // The provider's API server behind its Service address, found without --provider-cidr.
    let api = kubectl_get(
        &p.provider,
        &[
            "-n",
            "default",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
    )
    .unwrap();
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "api-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4", "endpoints": [{"addresses": [api]}], "ports": [{"port": 443}]});
    refused(
        wire.upsert(&slice).await.unwrap(),
        Outcome::Denied,
        &format!("{api} is in the provider's own range {api}/32"),
    );
    assert!(p
        .remote_log()
        .contains("no tenant EndpointSlice may point into the provider's own networks"));
    for name in ["monitoring", "cert-manager", "kube-mallory"] {
        assert!(
            kubectl_get(&p.provider, &["namespace", name, "-o", "name"]).is_none(),
            "{name}"
        );
    }
    assert!(!provider_has(&p, "service/api"));
    assert!(!provider_has(&p, "endpointslice/api-1"));
    for name in ["auth", "auth-tls", "mirror"] {
        assert!(!provider_has(&p, &format!("ingress/{name}")), "{name}");
    }
    assert!(provider_has(&p, "ingress/web"));
}

#[tokio::test]
async fn oversize_objects_are_refused_and_the_stream_goes_on() {
    let (p, mut wire, _policy) = forger("{}\n").await;
    let big = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big", "namespace": NS},
        "data": {"blob": "x".repeat(2 * 1024 * 1024)}});
    refused(
        wire.upsert(&big).await.unwrap(),
        Outcome::Invalid,
        "over the provider's limit of 1048576 bytes",
    );
    // The stream goes on.
    let small = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "small", "namespace": NS}, "data": {"a": "b"}});
    applied(
        wire.upsert(&small).await.unwrap(),
        "a small object after a big one",
    );
    assert!(!provider_has(&p, "configmap/big"));

    // A message over the gRPC limit (4 MiB) breaks the protocol, not the agent: that stream
    // ends with an error, and the tenant's next stream works.
    let huge = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "huge", "namespace": NS},
        "data": {"blob": "x".repeat(5 * 1024 * 1024)}});
    let ended = wire.upsert(&huge).await;
    assert!(ended.is_err(), "a 5 MiB message was answered: {ended:?}");
    let certs = p.certs.dir.join("mallory");
    let mut again = Wire::open(&p.remote_addr, "provider", TENANT, &certs)
        .await
        .unwrap();
    applied(again.upsert(&small).await.unwrap(), "the next stream");
    assert!(!provider_has(&p, "configmap/huge"));
}

#[tokio::test]
async fn a_newer_stream_of_a_tenant_replaces_the_old_at_once() {
    let (p, mut wire, _policy) = forger("{}\n").await;
    let small = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "small", "namespace": NS}, "data": {"a": "b"}});
    applied(wire.upsert(&small).await.unwrap(), "the first stream");
    // One stream per tenant: a new one replaces the old at once.
    let certs = p.certs.dir.join("mallory");
    let mut newer = Wire::open(&p.remote_addr, "provider", TENANT, &certs)
        .await
        .unwrap();
    let stale = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stale", "namespace": NS}, "data": {"a": "b"}});
    let old = tokio::time::timeout(Duration::from_secs(10), wire.upsert(&stale))
        .await
        .expect("the old stream answers or ends");
    assert!(
        old.is_err(),
        "the replaced stream still applied a request: {old:?}"
    );
    assert!(!provider_has(&p, "configmap/stale"));
    applied(newer.upsert(&small).await.unwrap(), "the newer stream");
}

/// The slowest of `n` ConfigMap upserts of bob's, 100 ms apart.
async fn slowest_ack(bob: &mut Wire, n: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{}", i % 5), "namespace": "shop-bob"}, "data": {"i": format!("{n}-{i}")}});
        let started = std::time::Instant::now();
        applied(bob.upsert(&cm).await.unwrap(), "bob's ConfigMap");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    slowest
}

#[tokio::test]
async fn a_tenant_that_floods_and_stops_reading_delays_no_other() {
    let (p, flooder, _policy) = forger("{}\n").await;
    let mut bob = p.bystander("bob").await;
    let pid = p.remote_pid();
    let rss_before = rss_kib(pid);

    let alone = slowest_ack(&mut bob, 20).await;

    // Mallory floods one object with alternating Upserts and Deletes and never reads an Ack,
    // for as long as bob is measured.
    let tx = flooder.sender();
    let stop = CancellationToken::new();
    let flooding = stop.clone();
    let flood = tokio::spawn(async move {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "flood", "namespace": NS}, "data": {"x": "y".repeat(64)}});
        let mut sent = 0u64;
        while !flooding.is_cancelled() {
            let m = if sent.is_multiple_of(2) {
                upsert_message(&cm, sent)
            } else {
                delete_message(&cm, sent)
            };
            tokio::select! {
                // The remote agent stopped reading this tenant (its answers are not read): the
                // flood is stuck, as a real stalled tenant would be, until bob is done.
                _ = flooding.cancelled() => break,
                result = tx.send(m) => match result {
                    Ok(()) => sent += 1,
                    Err(_) => break,
                },
            }
        }
        sent
    });

    // Meanwhile bob's requests are answered as fast as ever.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = slowest_ack(&mut bob, 40).await;
    stop.cancel();
    let sent = flood.await.unwrap();
    let rss_after = rss_kib(pid);
    println!(
        "fairness: flooder sent {sent} messages without reading; bob's slowest ack {alone:?} alone, {during:?} during the flood; remote agent RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(
        during < alone + Duration::from_secs(1),
        "bob's acks took up to {during:?} during the flood, {alone:?} without"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the remote agent grew from {rss_before} to {rss_after} KiB"
    );
    drop(flooder);
}

#[tokio::test]
async fn a_tap_that_is_not_read_is_cut_off_not_held() {
    let (p, mut flooder, _policy) = forger("{}\n").await;
    let mut bob = p.bystander("bob").await;
    let pid = p.remote_pid();
    let alone = slowest_ack(&mut bob, 20).await;

    // Mallory taps its own stream and never reads the tap.
    let stop = CancellationToken::new();
    let certs = p.certs.issue("mallory-tap", TENANT, "client", &[]);
    let channel = refract_e2e::wire::connect(&p.remote_addr, "provider", &certs, &stop)
        .await
        .unwrap();
    let mut inspect = refract_wire::proto::inspect_client::InspectClient::new(channel);
    let mut tap = inspect
        .tap(refract_wire::proto::TapRequest {
            cluster_id: TENANT.into(),
        })
        .await
        .expect("a tenant taps its own stream")
        .into_inner();
    let rss_before = rss_kib(pid);

    // Then sends 300 objects of 900 KiB (refused: the namespace is not its own, so nothing is
    // written, but each is copied to the tap), reading its answers; bob is measured meanwhile.
    let flood = tokio::spawn(async move {
        let data = "y".repeat(900 * 1024);
        for i in 0..300 {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("big-{i}"), "namespace": "not-mallorys"},
                "data": {"x": data}});
            let answer = flooder.upsert(&cm).await.unwrap();
            assert_eq!(answer.outcome, Outcome::Denied, "{}", answer.message);
        }
        flooder
    });
    let during = slowest_ack(&mut bob, 40).await;
    let _flooder = flood.await.unwrap();
    let rss_after = rss_kib(pid);
    println!(
        "tap: 300 messages of 900 KiB to an unread tap; bob's slowest ack {alone:?} alone, {during:?} during; remote agent RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the remote agent grew from {rss_before} to {rss_after} KiB"
    );
    // Bob's ack is a write to the provider's API server, on two cores shared with the flood's
    // decoding and the test's other control planes: the slowest of 40 wanders by a hundred
    // milliseconds or so (156 ms against 62 ms alone, seen once). A tap that held the agent up
    // would hold bob for as long as the flood lasts, seconds.
    assert!(
        during <= alone * 2 + Duration::from_millis(250),
        "bob's acks took up to {during:?} during the flood, {alone:?} without"
    );
    // The tap, read at last: what fit, then the reason it was cut off.
    let mut events = 0;
    let status = loop {
        match tap.message().await {
            Ok(Some(_)) => events += 1,
            Ok(None) => panic!("the tap ended without saying why"),
            Err(status) => break status,
        }
    };
    println!("the tap gave {events} events, then: {status}");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("cut off"), "{status}");
    stop.cancel();
}

#[tokio::test]
async fn mass_and_data_deletions_wait_for_the_grace_period() {
    let (p, mut wire, _policy) = forger_with("{}\n", &["--deletion-grace=8s"]).await;
    let cm = |i: usize| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("keep-{i}"), "namespace": NS}, "data": {"i": i.to_string()}});
    for i in 0..12 {
        applied(wire.upsert(&cm(i)).await.unwrap(), "a ConfigMap");
    }
    // A new stream that lists no ConfigMap at all: an empty (or wrong) snapshot.
    let certs = p.certs.dir.join("mallory");
    let empty = Wire::open(&p.remote_addr, "provider", TENANT, &certs)
        .await
        .unwrap();
    let done = refract_wire::proto::LocalMessage {
        kind: Some(refract_wire::proto::local_message::Kind::SnapshotComplete(
            refract_wire::proto::SnapshotComplete {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: NS.into(),
                resumed: false,
            },
        )),
    };
    empty.sender().send(done).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for i in 0..12 {
        assert!(
            provider_has(&p, &format!("configmap/keep-{i}")),
            "keep-{i} went at once"
        );
    }
    assert!(
        p.remote_log()
            .contains("would remove most of its objects at once"),
        "the remote agent did not say why it waits"
    );
    p.eventually(
        Duration::from_secs(30),
        "the orphans collected after the grace period",
        || (!provider_has(&p, "configmap/keep-11")).then_some(()),
    )
    .await;

    // A twin namespace that holds a claim is deleted only after the grace period, and not at
    // all when the tenant offloads it again meanwhile.
    let mut wire = empty;
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    applied(wire.upsert(&claim).await.unwrap(), "a claim");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "annotations": {"refract.io/original-name": "shop"}}});
    let terminating = || {
        kubectl_get(
            &p.provider,
            &[
                "namespace",
                NS,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
        )
        .is_none_or(|t| !t.is_empty())
    };
    let answer = wire.delete(object_ref(&ns)).await.unwrap();
    assert_eq!(answer.outcome, Outcome::Unchanged, "{answer:?}");
    assert!(
        answer.message.contains("deletion deferred")
            && answer.message.contains("PersistentVolumeClaims"),
        "{answer:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!terminating(), "the namespace went before the grace period");
    applied(
        wire.upsert(&ns).await.unwrap(),
        "the namespace offloaded again",
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !terminating(),
        "the namespace went though it was offloaded again"
    );
    let answer = wire.delete(object_ref(&ns)).await.unwrap();
    assert!(answer.message.contains("deletion deferred"), "{answer:?}");
    p.eventually(
        Duration::from_secs(30),
        "the namespace deleted after the grace period",
        || terminating().then_some(()),
    )
    .await;
}

#[tokio::test]
async fn one_connection_holds_no_more_streams_than_allowed() {
    let (p, _wire, _policy) = forger_with("{}\n", &["--max-concurrent-streams=4"]).await;
    let stop = CancellationToken::new();
    let certs = p.certs.dir.join("mallory");
    let channel = refract_e2e::wire::connect(&p.remote_addr, "provider", &certs, &stop)
        .await
        .unwrap();
    let tap = || {
        let mut client = refract_wire::proto::inspect_client::InspectClient::new(channel.clone());
        async move {
            client
                .tap(refract_wire::proto::TapRequest {
                    cluster_id: TENANT.into(),
                })
                .await
        }
    };
    // Four long-lived Tap streams take every stream the connection may have.
    let mut open = Vec::new();
    for _ in 0..4 {
        let stream = tokio::time::timeout(Duration::from_secs(10), tap())
            .await
            .expect("a Tap within the limit is answered")
            .expect("Tap");
        open.push(stream);
    }
    // A fifth waits for one of them to end.
    let fifth = tokio::spawn(tap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !fifth.is_finished(),
        "a fifth stream was opened on the connection"
    );
    drop(open.pop());
    let answered = tokio::time::timeout(Duration::from_secs(10), fifth)
        .await
        .expect("the fifth stream opens once one closes")
        .unwrap();
    assert!(answered.is_ok(), "{answered:?}");
    stop.cancel();
}
