//! Namespace extension and reflection end to end: two real control planes, both agent
//! binaries, checked with kubectl on both sides (and grpcurl speaking the stream as a
//! misbehaving tenant would).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use base64::Engine;
use refract_e2e::{json_of, kubectl_get, kubectl_stdin, metric, Peering};

const WAIT: Duration = Duration::from_secs(30);

/// Creates namespace `ns` with a NamespaceOffloading of `spec` (YAML flow map).
/// Extends `ns` with the default mapping and returns its twin's name once it exists.
async fn extended(p: &Peering, ns: &str) -> String {
    p.extend(ns, "{}");
    let twin = format!("{ns}-origin");
    until_provider(
        p,
        "",
        &format!("namespace/{twin}"),
        "{.metadata.name}",
        &twin,
    )
    .await;
    twin
}

fn apply_origin(p: &Peering, yaml: &str) {
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], yaml);
}

/// A Service `name` on port 80 in the origin namespace `shop`.
fn apply_origin_service(p: &Peering, name: &str) {
    apply_origin(
        p,
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{port: 80}}]}}\n"
        ),
    );
}

/// jsonpath of a provider object, or None while it does not exist.
fn provider(p: &Peering, ns: &str, what: &str, jsonpath: &str) -> Option<String> {
    kubectl_get(
        &p.provider,
        &["-n", ns, what, "-o", &format!("jsonpath={jsonpath}")],
    )
}

async fn until_provider(p: &Peering, ns: &str, what: &str, jsonpath: &str, expect: &str) {
    p.eventually(
        WAIT,
        &format!("{what} in {ns} on the provider to show {jsonpath}={expect:?}"),
        || (provider(p, ns, what, jsonpath).as_deref() == Some(expect)).then_some(()),
    )
    .await
}

async fn until_gone(p: &Peering, ns: &str, what: &str) {
    p.eventually(
        WAIT,
        &format!("{what} in {ns} to disappear from the provider"),
        || {
            provider(p, ns, what, "{.metadata.name}")
                .is_none()
                .then_some(())
        },
    )
    .await
}

/// Waits for the Warning event that tells the origin namespace `shop` an object (`selector`, a
/// field selector on the involved object) exists on the provider and is not the tenant's.
async fn until_conflict_warning(p: &Peering, selector: &str) {
    p.eventually(
        WAIT,
        &format!("a conflict Warning event on {selector}"),
        || {
            let events = kubectl_get(
                &p.origin,
                &[
                    "-n",
                    "shop",
                    "events",
                    "--field-selector",
                    &format!("{selector},type=Warning"),
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
            )?;
            events
                .contains("remote object already exists")
                .then_some(())
        },
    )
    .await
}

#[tokio::test]
async fn every_kind_follows_the_origin_and_leaves_with_the_namespace() {
    // Chosen node ports (liqo.io/force-remote-node-port) only where the provider's policy
    // allows them, as it does for this tenant.
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(
        policy.path(),
        "tenants:\n  origin:\n    services: {allowNodePorts: true}\n",
    )
    .expect("policy file");
    let policy_flag = format!("--policy={}", policy.path().display());
    let p = Peering::start_with_flags(false, &[], &[&policy_flag])
        .await
        .expect("peering");
    p.extend("shop", "{}");
    let twin = "shop-origin";
    until_provider(
        &p,
        "",
        &format!("namespace/{twin}"),
        "{.metadata.labels.refract\\.io/tenant}",
        "origin",
    )
    .await;
    let psa = provider(
        &p,
        "",
        &format!("namespace/{twin}"),
        "{.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
    );
    assert_eq!(psa.as_deref(), Some("baseline"));
    // As users wait for it: the standard Ready condition, and the table kubectl prints.
    p.origin_kubectl(&[
        "-n",
        "shop",
        "wait",
        "--for=condition=Ready",
        "nso/offloading",
        "--timeout=60s",
    ]);
    let table = p.origin_kubectl(&["-n", "shop", "get", "nso"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "READY", "REMOTE", "NAMESPACE", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..4],
        ["offloading", "Ready", "True", "shop-origin"],
        "{table}"
    );

    apply_origin(
        &p,
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: shop, labels: {app: web}}
data: {mode: prod, debug: "1"}
---
apiVersion: v1
kind: Secret
metadata: {name: db, namespace: shop}
stringData: {password: s3cr3t}
---
apiVersion: v1
kind: Secret
metadata: {name: legacy-token, namespace: shop, annotations: {kubernetes.io/service-account.name: default}}
type: kubernetes.io/service-account-token
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.200.200
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: pinned, namespace: shop, annotations: {liqo.io/force-remote-node-port: "true"}}
spec:
  type: NodePort
  selector: {app: pinned}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.3.7], conditions: {ready: true, serving: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop}
spec:
  ingressClassName: nginx
  rules: [{host: shop.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]
"#,
    );
    until_provider(&p, twin, "configmap/app-config", "{.data.mode}", "prod").await;
    until_provider(
        &p,
        twin,
        "configmap/app-config",
        "{.metadata.labels.offloading\\.refract\\.io/origin}",
        "origin",
    )
    .await;
    until_provider(&p, twin, "secret/db", "{.data.password}", "czNjcjN0").await;
    until_provider(
        &p,
        twin,
        "service/pinned",
        "{.spec.ports[0].nodePort}",
        "30081",
    )
    .await;
    let cluster_ip = provider(&p, twin, "service/web", "{.spec.clusterIP}").unwrap();
    assert!(
        !cluster_ip.is_empty() && cluster_ip != "10.96.200.200",
        "clusterIP {cluster_ip} was not left to the provider"
    );
    let node_port = provider(&p, twin, "service/web", "{.spec.ports[0].nodePort}").unwrap();
    assert_ne!(
        node_port, "30080",
        "node port was copied without liqo.io/force-remote-node-port"
    );
    until_provider(
        &p,
        twin,
        "endpointslice/web-1",
        "{.endpoints[0].addresses[0]}",
        "10.0.3.7",
    )
    .await;
    assert_eq!(
        provider(
            &p,
            twin,
            "endpointslice/web-1",
            "{.endpoints[0].conditions}"
        )
        .as_deref(),
        Some(r#"{"ready":true}"#)
    );
    until_provider(
        &p,
        twin,
        "ingress/web",
        "{.spec.rules[0].host}",
        "shop.example.com",
    )
    .await;
    assert_eq!(
        provider(&p, twin, "ingress/web", "{.spec.ingressClassName}").as_deref(),
        Some("")
    );
    assert!(
        provider(&p, twin, "secret/legacy-token", "{.metadata.name}").is_none(),
        "service-account token Secret was reflected"
    );

    // Updates follow: keys removed at the origin go, keys added on the provider by someone
    // else stay (server-side apply's rules, which the remote agent keeps for ConfigMaps and
    // Secrets without using it). A skip annotation removes the copy; deletes follow.
    p.provider_kubectl(&[
        "-n",
        twin,
        "annotate",
        "configmap",
        "app-config",
        "team.example/keep=yes",
    ]);
    p.origin_kubectl(&[
        "-n",
        "shop",
        "patch",
        "configmap",
        "app-config",
        "-p",
        r#"{"metadata":{"labels":{"app":null}},"data":{"mode":"canary","debug":null}}"#,
    ]);
    until_provider(&p, twin, "configmap/app-config", "{.data.mode}", "canary").await;
    let copy = |path: &str| provider(&p, twin, "configmap/app-config", path);
    // jsonpath prints nothing for an absent key.
    assert_eq!(
        copy("{.data.debug}").as_deref(),
        Some(""),
        "a removed key stayed"
    );
    assert_eq!(
        copy("{.metadata.labels.app}").as_deref(),
        Some(""),
        "a removed label stayed"
    );
    assert_eq!(
        copy("{.metadata.annotations.team\\.example/keep}").as_deref(),
        Some("yes"),
        "the provider's own annotation was lost"
    );
    // The same for a Service, whose node port stays the one the provider allocated.
    let node_port = provider(&p, twin, "service/web", "{.spec.ports[0].nodePort}").unwrap();
    p.provider_kubectl(&[
        "-n",
        twin,
        "annotate",
        "service",
        "web",
        "team.example/keep=yes",
    ]);
    p.origin_kubectl(&[
        "-n",
        "shop",
        "patch",
        "service",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"selector":{"app":null,"tier":"front"},"ports":[{"name":"http","port":80,"targetPort":9090,"nodePort":30080}]}}"#,
    ]);
    until_provider(&p, twin, "service/web", "{.spec.selector.tier}", "front").await;
    let service = |path: &str| provider(&p, twin, "service/web", path);
    assert_eq!(service("{.spec.selector.app}").as_deref(), Some(""));
    assert_eq!(
        service("{.spec.ports[0].targetPort}").as_deref(),
        Some("9090")
    );
    assert_eq!(
        service("{.spec.ports[0].nodePort}"),
        Some(node_port),
        "the provider's node port changed"
    );
    assert_eq!(
        service("{.metadata.annotations.team\\.example/keep}").as_deref(),
        Some("yes"),
        "the provider's own annotation was lost"
    );
    p.origin_kubectl(&[
        "-n",
        "shop",
        "annotate",
        "secret",
        "db",
        "liqo.io/skip-reflection=true",
    ]);
    until_gone(&p, twin, "secret/db").await;
    // An EndpointSlice follows its Service's policy: skipping the Service takes its slice
    // off the provider too, though the slice itself did not change.
    p.origin_kubectl(&[
        "-n",
        "shop",
        "annotate",
        "service",
        "web",
        "liqo.io/skip-reflection=true",
    ]);
    until_gone(&p, twin, "endpointslice/web-1").await;
    until_gone(&p, twin, "service/web").await;
    for what in [
        "configmap/app-config",
        "service/web",
        "endpointslice/web-1",
        "ingress/web",
    ] {
        p.origin_kubectl(&["-n", "shop", "delete", what]);
        until_gone(&p, twin, what).await;
    }

    // Removing the NamespaceOffloading removes the twin namespace.
    p.origin_kubectl(&["-n", "shop", "delete", "namespaceoffloading", "offloading"]);
    p.eventually(WAIT, "twin namespace deleted", || {
        match provider(&p, "", &format!("namespace/{twin}"), "{.status.phase}") {
            None => Some(()),
            Some(phase) if phase == "Terminating" => Some(()),
            Some(_) => None,
        }
    })
    .await;
}

#[tokio::test]
async fn policies_and_skip_lists_decide_what_is_reflected() {
    // A twin namespace of the same name as the origin's needs the provider's consent.
    let policy = tempfile::NamedTempFile::new().expect("policy file");
    std::fs::write(
        policy.path(),
        "tenants:\n  origin:\n    namespaces: [lab]\n",
    )
    .expect("policy file");
    let policy_flag = format!("--policy={}", policy.path().display());
    let mut p = Peering::start_with_flags(
        false,
        &[
            "--configmap-reflection-type=AllowList",
            "--skip-label=team",
            "--skip-annotation=internal/audit",
            "--ingress-reflection-workers=0",
        ],
        &[&policy_flag],
    )
    .await
    .expect("peering");
    p.extend("lab", "{namespaceMappingStrategy: EnforceSameName}");
    apply_origin(
        &p,
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: chosen, namespace: lab, labels: {team: a, app: x}, annotations: {liqo.io/allow-reflection: "true", internal/audit: "yes", keep: "me"}}
data: {a: b}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: not-chosen, namespace: lab}
data: {a: b}
---
apiVersion: v1
kind: Secret
metadata: {name: denied, namespace: lab, annotations: {liqo.io/skip-reflection: ""}}
stringData: {a: b}
---
apiVersion: v1
kind: Secret
metadata: {name: plain, namespace: lab}
stringData: {a: b}
---
apiVersion: v1
kind: Service
metadata: {name: hidden, namespace: lab, annotations: {liqo.io/skip-reflection: "true"}}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hidden-1, namespace: lab, labels: {kubernetes.io/service-name: hidden}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hidden-forced, namespace: lab, labels: {kubernetes.io/service-name: hidden}, annotations: {liqo.io/allow-reflection: "true"}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.2]}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: disabled, namespace: lab}
spec: {defaultBackend: {service: {name: x, port: {number: 80}}}}
"#,
    );
    // EnforceSameName: the twin has the same name.
    until_provider(&p, "lab", "secret/plain", "{.data.a}", "Yg==").await;
    until_provider(&p, "lab", "configmap/chosen", "{.metadata.labels.app}", "x").await;
    until_provider(
        &p,
        "lab",
        "endpointslice/hidden-forced",
        "{.endpoints[0].addresses[0]}",
        "10.0.0.2",
    )
    .await;
    let labels = provider(&p, "lab", "configmap/chosen", "{.metadata.labels}").unwrap();
    assert!(
        !labels.contains("team"),
        "skipped label reflected: {labels}"
    );
    let annotations = provider(&p, "lab", "configmap/chosen", "{.metadata.annotations}").unwrap();
    assert!(
        annotations.contains("keep") && !annotations.contains("internal/audit"),
        "{annotations}"
    );
    // What must not be there, after everything that must be there has arrived.
    for what in [
        "configmap/not-chosen",
        "secret/denied",
        "service/hidden",
        "endpointslice/hidden-1",
        "ingress/disabled",
    ] {
        assert!(
            provider(&p, "lab", what, "{.metadata.name}").is_none(),
            "{what} was reflected"
        );
    }

    // Provider events under the default event policy (DenyList), read on the provider event's
    // own annotations: the plain one is recorded on the origin ConfigMap, the skipped one not.
    kubectl_stdin(
        &p.provider,
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Event
metadata: {name: chosen.skipped, namespace: lab, annotations: {liqo.io/skip-reflection: "true"}}
involvedObject: {apiVersion: v1, kind: ConfigMap, name: chosen, namespace: lab}
reason: ProviderAudit
message: kept on the provider
type: Normal
---
apiVersion: v1
kind: Event
metadata: {name: chosen.plain, namespace: lab}
involvedObject: {apiVersion: v1, kind: ConfigMap, name: chosen, namespace: lab}
reason: ProviderCheck
message: seen on the provider
type: Normal
"#,
    );
    let origin_events = || {
        kubectl_get(
            &p.origin,
            &[
                "-n",
                "lab",
                "events",
                "--field-selector",
                "involvedObject.name=chosen",
                "-o",
                "jsonpath={.items[*].message}",
            ],
        )
        .unwrap_or_default()
    };
    p.eventually(WAIT, "the plain provider event at the origin", || {
        origin_events()
            .contains("seen on the provider")
            .then_some(())
    })
    .await;
    // Counted as skipped by the policy, so the check below is not merely early.
    let skipped = "refract_local_provider_events_skipped_total";
    let deadline = std::time::Instant::now() + WAIT;
    while metric(&p.local_admin, skipped).await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{skipped} still 0 after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = origin_events();
    assert!(
        !events.contains("kept on the provider"),
        "a provider event annotated liqo.io/skip-reflection reached the origin: {events}"
    );

    // Secret reflection turned off afterwards, in a values file of the older spelling: the
    // copies it left go, everything else stays.
    let values = p.dir.path().join("reflection.yaml");
    std::fs::write(&values, "reflection:\n  secret: {workers: 0}\n").unwrap();
    p.local.take().unwrap().stop().await;
    p.local_flags
        .push(format!("--reflection-config={}", values.display()));
    p.start_local();
    until_gone(&p, "lab", "secret/plain").await;
    assert_eq!(
        provider(&p, "lab", "configmap/chosen", "{.metadata.name}").as_deref(),
        Some("chosen"),
        "turning Secrets off removed a ConfigMap"
    );
    assert!(
        p.local_log().contains("reflection disabled (0 workers)"),
        "{}",
        p.local_log()
    );

    // A values file with keys the agent does not know: it refuses to start, naming them.
    std::fs::write(
        &values,
        "offloading:\n  reflection:\n    secrets: {workers: 0}\n    pod: {workers: 2}\n",
    )
    .unwrap();
    p.local.take().unwrap().stop().await;
    p.start_local();
    p.eventually(
        Duration::from_secs(30),
        "the local agent refusing its values file",
        || {
            let log = p.local_log();
            (log.contains("unknown key offloading.reflection.secrets")
                && log.contains("offloading.reflection.pod is set with --pod-reflection-workers"))
            .then_some(())
        },
    )
    .await;
    let status = p.local.take().unwrap().stop().await;
    assert!(!status.success(), "exited 0 with unknown keys");
}

/// Deletes the reflected Secret `creds` and edits the ConfigMap `mine` on the provider, as its
/// administrator might.
fn tamper_on_provider(p: &Peering, twin: &str, value: &str) {
    p.provider_kubectl(&["-n", twin, "delete", "secret", "creds"]);
    let patch = format!(r#"{{"data":{{"v":"{value}"}}}}"#);
    p.provider_kubectl(&["-n", twin, "patch", "configmap", "mine", "-p", &patch]);
}

#[tokio::test]
async fn foreign_objects_are_left_alone_copies_restored_and_restarts_write_nothing() {
    let mut p = Peering::start(false).await.expect("peering");
    // A provider object of the same name that Refract did not create.
    p.provider_kubectl(&["create", "namespace", "team-shop-origin"]);
    p.extend(
        "team",
        "{namespaceMappingStrategy: SelectedName, remoteNamespaceName: team-shop-origin}",
    );
    // The twin namespace exists and is not the tenant's: refused, shown in the status.
    p.eventually(WAIT, "NamespaceOffloading AllFailed", || {
        let phase = kubectl_get(
            &p.origin,
            &[
                "-n",
                "team",
                "nso/offloading",
                "-o",
                "jsonpath={.status.offloadingPhase}",
            ],
        )?;
        (phase == "AllFailed").then_some(())
    })
    .await;
    let ready = kubectl_get(
        &p.origin,
        &[
            "-n",
            "team",
            "nso/offloading",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}"#,
        ],
    );
    assert_eq!(ready.as_deref(), Some("False AllFailed"));
    assert!(
        provider(&p, "", "namespace/team-shop-origin", "{.metadata.labels}")
            .unwrap_or_default()
            .is_empty()
    );

    let twin = extended(&p, "shop").await;
    let twin = twin.as_str();
    p.provider_kubectl(&[
        "-n",
        twin,
        "create",
        "configmap",
        "taken",
        "--from-literal=owner=provider",
    ]);
    let foreign_version = provider(&p, twin, "configmap/taken", "{.metadata.resourceVersion}");
    apply_origin(
        &p,
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: taken, namespace: shop}
data: {owner: origin}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: mine, namespace: shop}
data: {v: "1"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: replaced, namespace: shop}
data: {owner: origin}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: shop}
stringData: {v: "1"}
"#,
    );
    until_provider(&p, twin, "configmap/mine", "{.data.v}", "1").await;
    until_provider(&p, twin, "configmap/replaced", "{.data.owner}", "origin").await;
    until_provider(&p, twin, "secret/creds", "{.data.v}", "MQ==").await;
    until_conflict_warning(
        &p,
        "involvedObject.name=taken,involvedObject.kind=ConfigMap",
    )
    .await;
    assert_eq!(
        provider(&p, twin, "configmap/taken", "{.data.owner}").as_deref(),
        Some("provider")
    );
    // Not written at all, not even labelled: the create that found it there was refused.
    assert_eq!(
        provider(&p, twin, "configmap/taken", "{.metadata.resourceVersion}"),
        foreign_version
    );

    // Services are created with a POST, as ConfigMaps are: one that finds a foreign Service
    // there is refused without writing it.
    apply_origin_service(&p, "back");
    until_provider(&p, twin, "service/back", "{.spec.ports[0].port}", "80").await;
    p.provider_kubectl(&[
        "-n",
        twin,
        "create",
        "service",
        "clusterip",
        "front",
        "--tcp=81",
    ]);
    let foreign_service = provider(&p, twin, "service/front", "{.metadata.resourceVersion}");
    apply_origin_service(&p, "front");
    until_conflict_warning(&p, "involvedObject.name=front,involvedObject.kind=Service").await;
    assert_eq!(
        provider(&p, twin, "service/front", "{.metadata.resourceVersion}"),
        foreign_service
    );
    // A reflected Service whose labels are taken off on the provider is taken back.
    p.provider_kubectl(&[
        "-n",
        twin,
        "label",
        "service",
        "back",
        "offloading.refract.io/origin-",
        "offloading.refract.io/destination-",
    ]);
    until_provider(
        &p,
        twin,
        "service/back",
        "{.metadata.labels.offloading\\.refract\\.io/origin}",
        "origin",
    )
    .await;

    // A reflected copy deleted or edited on the provider comes back.
    tamper_on_provider(&p, twin, "tampered");
    until_provider(&p, twin, "secret/creds", "{.data.v}", "MQ==").await;
    until_provider(&p, twin, "configmap/mine", "{.data.v}", "1").await;

    // Restarting the local agent with nothing changed writes nothing on the provider: every
    // object keeps its resourceVersion.
    let versions = |p: &Peering| {
        let ns = provider(
            p,
            "",
            &format!("namespace/{twin}"),
            "{.metadata.resourceVersion}",
        )
        .unwrap();
        let objs = provider(
            p,
            twin,
            "configmaps,secrets",
            "{range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
        )
        .unwrap();
        format!("ns={ns} {objs}")
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = versions(&p);
    let status = p.local.take().unwrap().stop().await;
    assert!(status.success(), "local agent exited with {status}");
    p.start_local();
    // The restarted agent resumes: the provider described what it holds, and the agent compared
    // every kind and namespace, sending only what the provider lacks (the conflicting `taken`,
    // refused again) and answering the rest itself.
    let started = std::time::Instant::now();
    loop {
        let admin = &p.local_admin;
        let settled = metric(admin, "refract_local_connected").await == 1.0
            && metric(admin, "refract_local_resume_pending_buckets").await == 0.0
            && metric(admin, "refract_local_resume_skipped_objects_total").await >= 2.0;
        if settled {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the restarted local agent did not resume:\n{}",
            p.local_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        versions(&p),
        before,
        "a restart with nothing changed wrote to the provider"
    );
    // Nothing on the provider went away while the agent was down either.
    assert_eq!(
        provider(&p, twin, "configmap/taken", "{.data.owner}").as_deref(),
        Some("provider")
    );

    // Copies changed or deleted while the origin is away come back with it: the provider keeps
    // only a hash of reflected objects, and leaves those copies out of what it says it holds,
    // so the returning agent sends them again.
    let status = p.local.take().unwrap().stop().await;
    assert!(status.success(), "local agent exited with {status}");
    tamper_on_provider(&p, twin, "offline");
    // A copy deleted and replaced by the provider's own object is not restored over it.
    p.provider_kubectl(&["-n", twin, "delete", "configmap", "replaced"]);
    p.provider_kubectl(&[
        "-n",
        twin,
        "create",
        "configmap",
        "replaced",
        "--from-literal=owner=provider",
    ]);
    p.eventually(
        WAIT,
        "the remote agent noting the edit while the tenant is away",
        || {
            p.remote_log()
                .contains("restoring it from the origin (asked now if connected, else on its next session)")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        provider(&p, twin, "configmap/mine", "{.data.v}").as_deref(),
        Some("offline"),
        "restored without the origin: the provider does not keep reflected objects whole"
    );
    let replaced = provider(
        &p,
        twin,
        "configmap/replaced",
        "{.metadata.resourceVersion}",
    );
    p.start_local();
    until_provider(&p, twin, "secret/creds", "{.data.v}", "MQ==").await;
    until_provider(&p, twin, "configmap/mine", "{.data.v}", "1").await;
    until_conflict_warning(
        &p,
        "involvedObject.name=replaced,involvedObject.kind=ConfigMap",
    )
    .await;
    assert_eq!(
        provider(
            &p,
            twin,
            "configmap/replaced",
            "{.metadata.resourceVersion}"
        ),
        replaced,
        "the provider's own object was written"
    );
}

/// Speaks the stream directly with grpcurl, as a confused or hostile tenant would.
#[tokio::test]
async fn requests_outside_the_tenant_are_denied_and_written_nowhere() {
    let mut p = Peering::start(false).await.expect("peering");
    p.eventually(WAIT, "tenant connected", || {
        let v = json_of(&p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"])).ok()?;
        (v["tenants"][0]["connected"] == true).then_some(())
    })
    .await;
    // grpcurl speaks as the tenant: its stream would replace the local agent's, and the other.
    p.local.take().expect("local agent").stop().await;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cm = |ns: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"evil","namespace":"{ns}"}},"data":{{"x":"y"}}}}"#
        )
    };
    let messages = [
        r#"{"hello":{"clusterId":"origin","agentVersion":"grpcurl","protocolVersion":1}}"#
            .to_string(),
        format!(
            r#"{{"upsert":{{"object":{{"apiVersion":"v1","kind":"ConfigMap","namespace":"kube-system","name":"evil"}},"revision":"1","objectJson":"{}"}}}}"#,
            b64(&cm("kube-system"))
        ),
        format!(
            r#"{{"upsert":{{"object":{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","namespace":"","name":"evil"}},"revision":"1","objectJson":"{}"}}}}"#,
            b64("{}")
        ),
        format!(
            r#"{{"upsert":{{"object":{{"apiVersion":"v1","kind":"Namespace","namespace":"","name":"kube-system"}},"revision":"1","objectJson":"{}"}}}}"#,
            b64(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"kube-system"}}"#)
        ),
        format!(
            r#"{{"upsert":{{"object":{{"apiVersion":"v1","kind":"Namespace","namespace":"","name":"evil-ns"}},"revision":"1","objectJson":"{}"}}}}"#,
            b64("not json")
        ),
        // Squatting a name the provider may install later.
        format!(
            r#"{{"upsert":{{"object":{{"apiVersion":"v1","kind":"Namespace","namespace":"","name":"monitoring"}},"revision":"1","objectJson":"{}"}}}}"#,
            b64(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"monitoring"}}"#)
        ),
    ];
    let out = p.grpcurl_with(
        Some("client"),
        Some(&messages.join("\n")),
        &["-max-time", "5", "refract.v1.Reflection/Sync"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "OUTCOME_DENIED",
        "is not a namespace of tenant origin",
        "is not a kind tenants may write",
        "namespace kube-system is one of the provider's own",
        "twin namespace monitoring does not carry tenant origin's identity",
        "OUTCOME_INVALID",
    ] {
        assert!(
            text.contains(expected),
            "no {expected:?} in:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(provider(&p, "kube-system", "configmap/evil", "{.metadata.name}").is_none());
    assert!(kubectl_get(&p.provider, &["clusterrole", "evil"]).is_none());
    assert!(provider(
        &p,
        "",
        "namespace/kube-system",
        "{.metadata.labels.refract\\.io/tenant}"
    )
    .unwrap_or_default()
    .is_empty());
    assert!(kubectl_get(&p.provider, &["namespace", "monitoring"]).is_none());
}

/// The orphan collection after a SnapshotComplete runs while the tenant's stream goes on: an
/// object upserted after the SnapshotComplete stays on the provider, even when it was listed
/// for collection (as after a reconnect, when the origin recreates an object at once).
#[tokio::test]
async fn an_upsert_after_a_snapshot_survives_the_orphan_collection() {
    // All of the tenant's ConfigMaps there are orphans: a share the remote agent would hold
    // back for the grace period (tests/enforcer.rs); here the collection must run at once.
    let mut p = Peering::start_with_flags(false, &[], &["--max-orphan-share=100"])
        .await
        .expect("peering");
    let twin = extended(&p, "late").await;
    let twin = twin.as_str();
    // grpcurl speaks as the tenant: its stream would replace the local agent's, and the other.
    p.local.take().expect("local agent").stop().await;
    // The tenant's objects on the provider that its origin no longer has. They are collected
    // one by one, in name order: `z-late` comes last, long after its Upsert is applied.
    let names = (0..200)
        .map(|i| format!("a-{i:03}"))
        .chain(["z-late".to_string()]);
    let orphans: String = names
        .map(|name| {
            format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {twin}, labels: {{offloading.refract.io/origin: origin, offloading.refract.io/destination: provider}}}}\ndata: {{v: old}}\n"
            )
        })
        .collect();
    kubectl_stdin(&p.provider, &["apply", "-f", "-"], &orphans);

    // The tenant has no ConfigMap there any more, then creates `z-late` again.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let late = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"z-late","namespace":"{twin}"}},"data":{{"v":"new"}}}}"#
    );
    let snapshot = [
        r#"{"hello":{"clusterId":"origin","agentVersion":"grpcurl","protocolVersion":1}}"#
            .to_string(),
        format!(
            r#"{{"snapshotComplete":{{"apiVersion":"v1","kind":"ConfigMap","namespace":"{twin}"}}}}"#
        ),
    ];
    let upsert = [format!(
        r#"{{"upsert":{{"object":{{"apiVersion":"v1","kind":"ConfigMap","namespace":"{twin}","name":"z-late"}},"revision":"2","objectJson":"{}"}}}}"#,
        b64(&late)
    )];
    // The Upsert comes once the remote agent has answered (Welcome), while the collection is
    // under way: sent together, the agent reads it before the collection starts.
    let out = p.grpcurl_stream(
        Some("client"),
        &snapshot,
        "sessionId",
        &upsert,
        &["-max-time", "5", "refract.v1.Reflection/Sync"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("OUTCOME_APPLIED"),
        "z-late not applied:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    p.eventually(WAIT, "the orphans collected", || {
        provider(&p, twin, "configmap/a-199", "{.metadata.name}")
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        provider(&p, twin, "configmap/z-late", "{.data.v}").as_deref(),
        Some("new"),
        "the object upserted after the SnapshotComplete was collected as an orphan"
    );
    assert!(provider(&p, twin, "configmap/a-000", "{.metadata.name}").is_none());
}

#[tokio::test]
async fn endpoints_follow_the_nodes_they_name() {
    // Services not reflected: the slices' Services come from a watch of all Services, whose
    // first listing they wait for (the other tests cover the Service reflector's).
    let p = Peering::start_with(false, &["--service-reflection-workers=0"])
        .await
        .expect("peering");
    let twin = extended(&p, "mesh").await;
    let twin = twin.as_str();
    // One endpoint names no node; the other a node the origin does not have (yet): left out.
    apply_origin(
        &p,
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: api-1, namespace: mesh, labels: {kubernetes.io/service-name: api}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.3.7]}, {addresses: [10.0.3.8], nodeName: worker-late}]\nports: [{port: 8080, protocol: TCP}]\n",
    );
    let addresses = "{.endpoints[*].addresses[0]}";
    until_provider(&p, twin, "endpointslice/api-1", addresses, "10.0.3.7").await;
    // The node joins the origin; the slice itself does not change. Its endpoint is reflected.
    apply_origin(
        &p,
        "apiVersion: v1\nkind: Node\nmetadata: {name: worker-late}\n",
    );
    until_provider(
        &p,
        twin,
        "endpointslice/api-1",
        addresses,
        "10.0.3.7 10.0.3.8",
    )
    .await;
    // The node leaves: its endpoint goes with it.
    refract_e2e::kubectl(&p.origin, &["delete", "node", "worker-late"]);
    until_provider(&p, twin, "endpointslice/api-1", addresses, "10.0.3.7").await;
}
