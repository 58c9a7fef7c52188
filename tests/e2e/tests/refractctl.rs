//! `refractctl` as an operator runs it: `peer` joins two real clusters (both agents in-cluster
//! from their images, on real nodes; the tenant's certificate through a CertificateSigningRequest
//! the remote agent signs), `status` shows the link connected and the virtual node Ready, `tap`
//! shows the stream, `rotate` replaces the tenant's key and certificate without a restart,
//! `unpeer` leaves nothing labelled for the tenant on either side, two admins peer again with
//! their own kubeconfigs only (`install provider`, `join request`, `kubectl certificate
//! approve`, `tenant export`, `join complete`), and a forced unpeer handles a dead provider
//! (the origin at once, the provider once it is back). Both clusters run
//! on this machine without kube-proxy, hence `--single-host`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::process::Output;

use serde::Deserialize;
use std::time::{Duration, Instant};

use refract_e2e::{bin, busybox, eventually, free_port, kubectl, kubectl_get, kubectl_stdin, run};
use refract_testkit::{ControlPlane, Options};

const WAIT: Duration = Duration::from_secs(120);

fn refractctl(args: &[&str]) -> Output {
    let out = run(bin("refractctl"), args);
    println!(
        "$ refractctl {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "refractctl failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `install provider` of provider `provider` into the cluster of `provider_kubeconfig`, its
/// images from `registry`.
fn install_provider_args<'a>(provider_kubeconfig: &'a str, registry: &'a str) -> [&'a str; 8] {
    [
        "install",
        "provider",
        "--provider-kubeconfig",
        provider_kubeconfig,
        "--provider-id",
        "provider",
        "--registry",
        registry,
    ]
}

/// The objects a run reports it created or changed (`<Kind> <name> created|configured`): none
/// when a command is re-run with nothing to do.
fn written(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.ends_with(" created") || l.ends_with(" configured"))
        .collect()
}

/// Every value of every Secret in refract-system of `cp`, decoded.
fn secret_values(cp: &ControlPlane) -> Vec<(String, String)> {
    let json = kubectl(
        cp,
        &["-n", "refract-system", "get", "secrets", "-o", "json"],
    );
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut values = Vec::new();
    for s in list["items"].as_array().unwrap() {
        let name = s["metadata"]["name"].as_str().unwrap().to_string();
        for (key, v) in s["data"].as_object().into_iter().flatten() {
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap();
            values.push((
                format!("{name}/{key}"),
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
    }
    values
}

/// Objects of `kinds` in every namespace of `cp` carrying `selector`, as `kind ns/name` lines.
fn labelled(cp: &ControlPlane, kinds: &str, selector: &str) -> Vec<String> {
    kubectl(
        cp,
        &[
            "get",
            kinds,
            "-A",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.kind} {.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
        ],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Fails if the provider holds anything labelled for tenant `origin`.
fn nothing_left_on_provider(provider: &ControlPlane, when: &str) {
    let kinds = "namespaces,configmaps,secrets,pods,services,shadowpods.offloading.refract.io,certificatesigningrequests";
    for selector in [
        "refract.io/tenant=origin",
        "offloading.refract.io/origin=origin",
    ] {
        let left = labelled(provider, kinds, selector);
        assert!(
            left.is_empty(),
            "left on the provider {when} ({selector}): {left:?}"
        );
    }
}

/// Fails if the origin holds anything labelled for the peering with `provider`.
fn nothing_left_on_origin(origin: &ControlPlane, when: &str) {
    for selector in [
        "refract.io/peering=provider",
        "liqo.io/remote-cluster-id=provider",
    ] {
        let left = labelled(origin, "nodes,deployments,secrets,pods,leases", selector);
        assert!(
            left.is_empty(),
            "left on the origin {when} ({selector}): {left:?}"
        );
    }
}

/// The messages of events with `reason` on the NamespaceOffloading of `ns`.
fn nso_event_messages(origin: &ControlPlane, ns: &str, reason: &str) -> Option<String> {
    let selector = format!("involvedObject.kind=NamespaceOffloading,reason={reason}");
    kubectl_get(
        origin,
        &[
            "-n",
            ns,
            "events",
            "--field-selector",
            &selector,
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
}

/// The local agent's log, for a failure's context.
fn agent_log(origin: &ControlPlane) -> String {
    kubectl(
        origin,
        &[
            "-n",
            "refract-system",
            "logs",
            "deployment/refract-local-agent-provider",
            "--tail=80",
        ],
    )
}

#[tokio::test]
async fn refractctl_peers_shows_rotates_taps_and_unpeers_two_clusters() {
    let origin_options = Options::named("origin")
        .with_node("10.100.0.0/16", &["local-agent"])
        .expect("origin node images");
    let provider_options = Options::named("provider")
        .with_node("10.200.0.0/16", &["remote-agent"])
        .expect("provider node images");
    let (origin, provider) = tokio::try_join!(
        ControlPlane::start(origin_options),
        ControlPlane::start(provider_options)
    )
    .expect("control planes with real nodes");
    let okc = origin.kubeconfig.display().to_string();
    let pkc = provider.kubeconfig.display().to_string();
    let ports: Vec<String> = (0..5).map(|_| free_port().to_string()).collect();
    // The agents' images, as a user names them: the registry they were pushed to (testkit's,
    // on loopback), from which each node pulls.
    let registry = format!(
        "{}/refract",
        refract_testkit::registry::Registry::shared()
            .expect("the image registry")
            .address
    );

    // --dry-run=client prints what would be applied and writes nothing.
    let install_provider = install_provider_args(&pkc, &registry);
    let printed = ok(&refractctl(
        &[
            &install_provider[..],
            &[
                "--single-host",
                "--grpc-port",
                &ports[0],
                "--dry-run=client",
                "-o",
                "yaml",
            ],
        ]
        .concat(),
    ));
    let kinds: Vec<String> = serde_yaml_ng::Deserializer::from_str(&printed)
        .map(|doc| {
            let object = serde_json::Value::deserialize(doc).expect("a YAML document");
            format!(
                "{} {}",
                object["kind"].as_str().unwrap(),
                object["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        kinds.contains(&"Deployment refract-remote-agent".to_string()),
        "{kinds:?}"
    );
    assert!(
        kubectl_get(&provider, &["namespace", "refract-system", "-o", "name"]).is_none(),
        "a dry run wrote to the provider"
    );

    // peer: everything installed, certificates minted, both agents in-cluster, node Ready.
    let peer_but_ports: Vec<&str> = vec![
        "peer",
        "--origin-kubeconfig",
        &okc,
        "--provider-kubeconfig",
        &pkc,
        "--origin-id",
        "origin",
        "--provider-id",
        "provider",
        "--registry",
        &registry,
    ];
    let peer: Vec<&str> = [peer_but_ports.clone(), single_host_args(&ports)].concat();
    // peer --dry-run=client: each cluster's objects, one line each, nothing written to either.
    let dry = ok(&refractctl(
        &[peer.as_slice(), &["--dry-run=client"]].concat(),
    ));
    for line in [
        "Deployment refract-system/refract-remote-agent (dry run)",
        "CustomResourceDefinition shadowpods.offloading.refract.io (dry run)",
        "Deployment refract-system/refract-local-agent-provider (dry run)",
        "MutatingWebhookConfiguration refract-local-agent (dry run)",
    ] {
        assert!(
            dry.contains(line),
            "peer --dry-run did not print {line:?}: {dry}"
        );
    }
    for (cp, which) in [(&origin, "origin"), (&provider, "provider")] {
        assert!(
            kubectl_get(cp, &["namespace", "refract-system", "-o", "name"]).is_none(),
            "peer --dry-run wrote to the {which}"
        );
    }

    let started = Instant::now();
    let peered = ok(&refractctl(
        &[peer.as_slice(), &["--timeout", "4m"]].concat(),
    ));
    println!("peer took {:.1?}", started.elapsed());
    for step in [
        "Deployment refract-system/refract-remote-agent created",
        "Deployment refract-system/refract-local-agent-provider created",
        "CustomResourceDefinition namespaceoffloadings.offloading.refract.io created",
        "CertificateSigningRequest refract-tenant-origin approved",
        "tenant origin: certificate signed by the remote agent",
        "tenant origin connected to provider provider",
        "virtual node refract-provider Ready",
        "peered: origin origin offloads to provider provider",
    ] {
        assert!(peered.contains(step), "peer did not say {step:?}");
    }
    let node = kubectl(
        &origin,
        &[
            "get",
            "node",
            "refract-provider",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
    );
    assert_eq!(node, "True");

    // The provider's CA key exists on the provider only; the origin holds no provider secret.
    let provider_secrets = secret_values(&provider);
    let ca_key = provider_secrets
        .iter()
        .find(|(k, _)| k == "refract-peering-ca/tls.key")
        .map(|(_, v)| v.clone())
        .expect("the provider's peering CA");
    let origin_secrets = secret_values(&origin);
    assert!(
        origin_secrets
            .iter()
            .all(|(_, v)| !v.contains(ca_key.trim())),
        "the provider's CA key is in the origin"
    );
    assert!(origin_secrets.iter().all(
        |(k, _)| !k.starts_with("refract-peering-ca") && !k.starts_with("refract-remote-agent")
    ));

    // An admin gives the remote agent a policy by hand (a ConfigMap, a volume, `--policy`);
    // peering again (another tenant would do the same) must leave the shared agent's flags
    // and image as they are, and `install provider` later keeps them too.
    kubectl_stdin(
        &provider,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: refract-provider-policy, namespace: refract-system}\ndata:\n  policy.yaml: \"defaults: {}\\n\"\n",
    );
    kubectl(
        &provider,
        &[
            "-n",
            "refract-system",
            "patch",
            "deployment",
            "refract-remote-agent",
            "--type=json",
            "-p",
            r#"[{"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "policy", "configMap": {"name": "refract-provider-policy"}}},
                {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": {"name": "policy", "mountPath": "/etc/refract/policy", "readOnly": true}},
                {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--policy=/etc/refract/policy/policy.yaml"}]"#,
        ],
    );
    kubectl(
        &provider,
        &[
            "-n",
            "refract-system",
            "rollout",
            "status",
            "deployment/refract-remote-agent",
            "--timeout=120s",
        ],
    );
    let remote_agent = || {
        kubectl(
            &provider,
            &[
                "-n",
                "refract-system",
                "get",
                "deployment",
                "refract-remote-agent",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].args}",
            ],
        )
    };
    let before = remote_agent();
    assert!(
        before.contains("--policy=/etc/refract/policy/policy.yaml"),
        "{before}"
    );

    // A dry run shows what a real run would do to the running remote agent: peer leaves it
    // out, install provider keeps the hand-added flag.
    let dry = ok(&refractctl(
        &[peer.as_slice(), &["--dry-run=client"]].concat(),
    ));
    assert!(
        !dry.contains("Deployment refract-system/refract-remote-agent"),
        "peer --dry-run would apply the running remote agent: {dry}"
    );
    let dry = ok(&refractctl(
        &[
            &install_provider[..],
            &["--dry-run=client", "-o", "json"],
            &single_host_args(&ports),
        ]
        .concat(),
    ));
    let list: serde_json::Value = serde_json::from_str(&dry).expect("a JSON List");
    let deployment = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the remote agent's Deployment");
    assert!(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(
                "--policy=/etc/refract/policy/policy.yaml"
            )),
        "install provider --dry-run drops the hand-added --policy: {deployment}"
    );

    // peer again: nothing is issued again, nothing restarts.
    let again = ok(&refractctl(&peer));
    assert!(again.contains("Deployment refract-system/refract-remote-agent exists: left as it is"));
    assert_eq!(
        remote_agent(),
        before,
        "peer changed the shared remote agent"
    );
    assert!(again.contains("a peering with provider exists"));
    assert!(again.contains(
        "client certificate in Secret refract-system/refract-local-agent-provider-tls kept"
    ));
    assert!(again.contains("Deployment refract-system/refract-local-agent-provider unchanged"));
    assert_eq!(written(&again), Vec::<&str>::new(), "a second peer wrote");
    assert!(
        !again.contains(" issued "),
        "a second peer issued a certificate again"
    );

    // A namespace offloaded with a ConfigMap and a pod, so status and tap have something.
    kubectl_stdin(
        &origin,
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: apps}
spec: {podOffloadingStrategy: Remote}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: apps}
data: {greeting: hello}
"#,
    );
    eventually(
        WAIT,
        "ConfigMap settings on the provider",
        || {
            let v = kubectl_get(
                &provider,
                &[
                    "-n",
                    "apps-origin",
                    "configmap",
                    "settings",
                    "-o",
                    "jsonpath={.data.greeting}",
                ],
            )?;
            (v == "hello").then_some(())
        },
        String::new,
    )
    .await;
    kubectl(
        &origin,
        &[
            "wait",
            "--for=condition=Ready",
            "nso/offloading",
            "-n",
            "apps",
            "--timeout=60s",
        ],
    );

    // The NamespaceOffloading tells in an event that its namespace was extended.
    let extended = eventually(
        WAIT,
        "a NamespaceExtended event on nso/offloading in apps",
        || {
            let v = nso_event_messages(&origin, "apps", "NamespaceExtended")?;
            v.contains("apps-origin").then_some(v)
        },
        || agent_log(&origin),
    )
    .await;
    println!("event on apps/offloading: {extended}");

    // The webhook is called for offloaded namespaces only: `apps` carries the gate label, and
    // a pod created there is placed on the virtual node and runs on the provider.
    eventually(
        WAIT,
        "namespace apps labelled liqo.io/scheduling-enabled=true",
        || {
            let ns = kubectl_get(&origin, &["namespace", "apps", "-o", "json"])?;
            let ns: serde_json::Value = serde_json::from_str(&ns).ok()?;
            (ns["metadata"]["labels"]["liqo.io/scheduling-enabled"] == "true").then_some(())
        },
        || agent_log(&origin),
    )
    .await;
    let selector = kubectl(
        &origin,
        &[
            "get",
            "mutatingwebhookconfiguration",
            "refract-local-agent",
            "-o",
            "jsonpath={.webhooks[0].namespaceSelector.matchLabels}",
        ],
    );
    assert!(
        selector.contains("liqo.io/scheduling-enabled"),
        "{selector}"
    );
    let pod = |ns: &str, name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: \"{}\", command: [sleep, \"3600\"], resources: {{requests: {{cpu: 10m, memory: 8Mi}}}}}}\n",
            busybox()
        )
    };
    kubectl_stdin(&origin, &["apply", "-f", "-"], &pod("apps", "probe"));
    eventually(
        WAIT,
        "pod apps/probe Running on the virtual node",
        || {
            let v = kubectl_get(
                &origin,
                &[
                    "-n",
                    "apps",
                    "pod",
                    "probe",
                    "-o",
                    "jsonpath={.spec.nodeName} {.status.phase}",
                ],
            )?;
            (v == "refract-provider Running").then_some(())
        },
        String::new,
    )
    .await;
    // The wait a user sees, measured by the local agent.
    let running = refract_e2e::metric(
        &format!("127.0.0.1:{}", ports[3]),
        "refract_local_pod_running_seconds_count",
    )
    .await;
    assert!(running >= 1.0, "pod_running_seconds observed nothing");
    let statuses = refract_e2e::metric(
        &format!("127.0.0.1:{}", ports[3]),
        "refract_local_pod_status_seconds_count",
    )
    .await;
    assert!(statuses >= 1.0, "pod_status_seconds observed nothing");

    // A pod created before its namespace is offloaded never saw the webhook: the
    // NamespaceOffloading gets a Warning event naming it.
    kubectl(&origin, &["create", "namespace", "late"]);
    kubectl_stdin(&origin, &["apply", "-f", "-"], &pod("late", "early"));
    kubectl_stdin(
        &origin,
        &["apply", "-f", "-"],
        "apiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {name: offloading, namespace: late}\nspec: {podOffloadingStrategy: Remote}\n",
    );
    let warning = eventually(
        WAIT,
        "a Warning event on nso/offloading in late",
        || {
            let v = nso_event_messages(&origin, "late", "PodsCreatedBeforeOffloading")?;
            v.contains("early").then_some(v)
        },
        String::new,
    )
    .await;
    println!("event on late/offloading: {warning}");
    kubectl(
        &origin,
        &[
            "wait",
            "--for=condition=Ready",
            "nso/offloading",
            "-n",
            "late",
            "--timeout=60s",
        ],
    );

    // status: connected, Ready, the namespace, the queue.
    let status = ok(&refractctl(&["status", "--origin-kubeconfig", &okc]));
    for part in [
        "PEERING origin -> provider",
        "local agent:   refract-system/refract-local-agent-provider 1/1 available",
        "link:          connected since",
        "last errors:   none",
        "namespaces 2/100",
        "virtual node:  refract-provider Ready=True",
        "apps -> apps-origin Ready Ready=True",
        "late -> late-origin Ready Ready=True",
    ] {
        assert!(status.contains(part), "status lacks {part:?}");
    }
    // An object may be on its way at the instant of the sample (the remote agent holds acks up
    // to 20 ms to send several together): what matters is that nothing waits long.
    let oldest = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("queue:"))
        .and_then(|q| q.split("oldest ").nth(1))
        .and_then(|age| age.split('s').next())
        .and_then(|secs| secs.parse::<f64>().ok());
    assert!(
        oldest.is_some_and(|secs| secs < 5.0),
        "status shows no queue, or a stuck one: {oldest:?}"
    );

    // The same for scripts: -o json and -o yaml, exit code 0 while healthy, and the context
    // of the kubeconfig picked by name.
    let context = kubectl(&origin, &["config", "current-context"]);
    let json = ok(&refractctl(&[
        "status",
        "--origin-kubeconfig",
        &okc,
        "--origin-context",
        context.trim(),
        "-o",
        "json",
    ]));
    let json: serde_json::Value = serde_json::from_str(&json).expect("status -o json");
    assert_eq!(json["peerings"][0]["link"]["state"], "connected", "{json}");
    assert_eq!(
        json["peerings"][0]["virtualNode"]["ready"], "True",
        "{json}"
    );
    assert_eq!(
        json["peerings"][0]["link"]["tenant"]["refused"]["count"], 0,
        "{json}"
    );
    let yaml = ok(&refractctl(&[
        "status",
        "--origin-kubeconfig",
        &okc,
        "-o",
        "yaml",
    ]));
    assert!(yaml.contains("state: connected"), "{yaml}");
    let wrong = refractctl(&[
        "status",
        "--origin-kubeconfig",
        &okc,
        "--origin-context",
        "nope",
    ]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("(context nope)"));

    // version: this client, and both agents through the provider's Inspect service.
    let version = ok(&refractctl(&["version", "--origin-kubeconfig", &okc]));
    let v = env!("CARGO_PKG_VERSION");
    assert!(
        version.contains(&format!("client: refractctl {v}")),
        "{version}"
    );
    assert!(
        version.contains(&format!("peering with provider: local agent {v} (image {registry}/local-agent:{v}), remote agent {v}")),
        "{version}"
    );
    let completion = ok(&refractctl(&["completion", "bash"]));
    assert!(
        completion.contains("_refractctl()"),
        "no bash completion function"
    );

    // tap: a change made while tapping shows up, as a line, without its data.
    let tap = tokio::task::spawn_blocking({
        let okc = okc.clone();
        move || {
            refractctl(&[
                "tap",
                "--origin-kubeconfig",
                &okc,
                "--provider-id",
                "provider",
                "--for",
                "8s",
            ])
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubectl(
        &origin,
        &[
            "-n",
            "apps",
            "create",
            "secret",
            "generic",
            "db",
            "--from-literal=password=s3cr3t-value",
        ],
    );
    let tapped = ok(&tap.await.unwrap());
    // The stream names the provider's twin namespace.
    assert!(
        tapped.contains("→ Upsert Secret apps-origin/db"),
        "the tap did not show the Secret"
    );
    assert!(
        tapped.contains("← Ack Secret apps-origin/db"),
        "the tap did not show its answer"
    );
    assert!(!tapped.contains("s3cr3t"), "the tap shows Secret data");

    // rotate: a new serial in the Secret; the agent's pod is not restarted and loads it.
    let pod_before = kubectl(&origin, &["-n", "refract-system", "get", "pods", "-l", "refract.io/peering=provider", "-o", "jsonpath={.items[0].metadata.uid} {.items[0].status.containerStatuses[0].restartCount}"]);
    let rotate = [
        "rotate",
        "--origin-kubeconfig",
        &okc,
        "--provider-kubeconfig",
        &pkc,
        "--provider-id",
        "provider",
    ];
    let tls_version = || {
        kubectl(
            &origin,
            &[
                "-n",
                "refract-system",
                "get",
                "secret",
                "refract-local-agent-provider-tls",
                "-o",
                "jsonpath={.metadata.resourceVersion}",
            ],
        )
    };
    // As a dry run first: what would be replaced is named, nothing is.
    let secret_before = tls_version();
    let dry = ok(&refractctl(&[&rotate[..], &["--dry-run=client"]].concat()));
    for line in [
        "Secret refract-system/refract-local-agent-provider-tls (dry run)",
        "CertificateSigningRequest refract-tenant-origin (dry run)",
    ] {
        assert!(
            dry.contains(line),
            "rotate --dry-run did not print {line:?}: {dry}"
        );
    }
    assert_eq!(
        tls_version(),
        secret_before,
        "rotate --dry-run replaced the certificate"
    );
    let rotated = ok(&refractctl(&rotate));
    assert!(rotated.contains("replaced by serial"));
    eventually(
        Duration::from_secs(150),
        "the local agent to load the rotated certificate",
        || {
            let log = kubectl(
                &origin,
                &[
                    "-n",
                    "refract-system",
                    "logs",
                    "deployment/refract-local-agent-provider",
                ],
            );
            log.contains("reloaded TLS certificate").then_some(())
        },
        String::new,
    )
    .await;
    let pod_after = kubectl(&origin, &["-n", "refract-system", "get", "pods", "-l", "refract.io/peering=provider", "-o", "jsonpath={.items[0].metadata.uid} {.items[0].status.containerStatuses[0].restartCount}"]);
    assert_eq!(pod_before, pod_after, "the local agent was restarted");

    // The local agent leads its peering on its Lease, under its pod's name (deploy/'s RBAC
    // and downward API, as refractctl applied them).
    let holder = kubectl_get(
        &origin,
        &[
            "-n",
            "refract-system",
            "lease",
            "refract-local-agent-provider",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
    .unwrap_or_default();
    assert!(
        holder.starts_with("refract-local-agent-provider-"),
        "the Lease is held by {holder:?}"
    );

    // unpeer: graceful; nothing labelled for the tenant is left on either side.
    let started = Instant::now();
    let unpeer = [
        "unpeer",
        "--origin-kubeconfig",
        &okc,
        "--provider-id",
        "provider",
    ];
    let with_provider = ["--provider-kubeconfig", &pkc];
    // First as a dry run: what exists and would go, on both sides, and nothing goes.
    let dry = ok(&refractctl(
        &[&unpeer[..], &with_provider, &["--dry-run=client"]].concat(),
    ));
    println!("$ refractctl unpeer ... --dry-run=client\n{dry}");
    for line in [
        "Deployment refract-system/refract-local-agent-provider deleted (dry run)",
        "Secret refract-system/refract-local-agent-provider-tls deleted (dry run)",
        "Lease refract-system/refract-local-agent-provider deleted (dry run)",
        "Node refract-provider deleted (dry run)",
        "CertificateSigningRequest refract-tenant-origin deleted (dry run)",
        "Namespace apps-origin deleted (dry run)",
    ] {
        assert!(
            dry.contains(line),
            "unpeer --dry-run did not print {line:?}"
        );
    }
    let dry = ok(&refractctl(
        &[
            &unpeer[..],
            &with_provider,
            &["--dry-run=client", "-o", "yaml"],
        ]
        .concat(),
    ));
    for document in serde_yaml_ng::Deserializer::from_str(&dry) {
        let object = serde_json::Value::deserialize(document).expect("a YAML document");
        assert!(
            object.get("data").is_none() && object.get("stringData").is_none(),
            "unpeer --dry-run printed an object's data: {object}"
        );
    }
    assert!(
        kubectl_get(&origin, &["node", "refract-provider", "-o", "name"]).is_some()
            && kubectl_get(&provider, &["namespace", "apps-origin", "-o", "name"]).is_some(),
        "unpeer --dry-run deleted something"
    );
    let unpeered = ok(&refractctl(
        &[&unpeer[..], &with_provider, &["--timeout", "3m"]].concat(),
    ));
    println!("unpeer took {:.1?}", started.elapsed());
    assert!(unpeered.contains("unpeered: virtual node refract-provider removed"));
    assert!(unpeered.contains("provider: no namespace of tenant origin is left"));
    assert!(unpeered.contains("the local agent's pods ended"));
    assert!(
        unpeered.contains("nothing labelled for the peering with provider is left on the origin")
    );
    nothing_left_on_provider(&provider, "after unpeer");
    nothing_left_on_origin(&origin, "after unpeer");
    for kind in ["lease", "poddisruptionbudget"] {
        let left = kubectl_get(
            &origin,
            &[
                "-n",
                "refract-system",
                kind,
                "refract-local-agent-provider",
                "-o",
                "name",
            ],
        )
        .unwrap_or_default();
        assert!(left.is_empty(), "unpeer left {left}");
    }
    // No peering: nothing is offloaded, which a script must see in the exit code.
    let status = refractctl(&["status", "--origin-kubeconfig", &okc]);
    assert_eq!(status.status.code(), Some(3), "status without peerings");
    assert!(String::from_utf8_lossy(&status.stdout).contains("no peerings"));

    // Peered again by two admins, each with their own kubeconfig only, each step printing the
    // next: no key, CA key or kubeconfig crosses, only a request and a bundle of certificates.
    peer_by_two_admins(&origin, &provider, &registry, &ports, &before);

    // A dead provider: a pod offloaded, then the remote agent stops. A forced unpeer cleans
    // the origin at once and deletes nothing on the provider; once the provider is reachable
    // again, a forced unpeer with its kubeconfig removes the tenant there.
    eventually(
        WAIT,
        "apps extended to the provider again, and its gate label set",
        || {
            let cm = kubectl_get(
                &provider,
                &["-n", "apps-origin", "configmap", "settings", "-o", "name"],
            )?;
            let ns = kubectl_get(&origin, &["namespace", "apps", "-o", "json"])?;
            let ns: serde_json::Value = serde_json::from_str(&ns).ok()?;
            (!cm.is_empty() && ns["metadata"]["labels"]["liqo.io/scheduling-enabled"] == "true")
                .then_some(())
        },
        || agent_log(&origin),
    )
    .await;
    kubectl_stdin(&origin, &["apply", "-f", "-"], &pod("apps", "survivor"));
    eventually(
        WAIT,
        "pod apps/survivor Running on the provider",
        || {
            let v = kubectl_get(
                &provider,
                &[
                    "-n",
                    "apps-origin",
                    "pod",
                    "survivor",
                    "-o",
                    "jsonpath={.status.phase}",
                ],
            )?;
            (v == "Running").then_some(())
        },
        || agent_log(&origin),
    )
    .await;
    kubectl(
        &provider,
        &[
            "-n",
            "refract-system",
            "scale",
            "deployment/refract-remote-agent",
            "--replicas=0",
        ],
    );
    eventually(
        WAIT,
        "the remote agent's pods gone",
        || {
            let v = kubectl_get(
                &provider,
                &[
                    "-n",
                    "refract-system",
                    "pods",
                    "-l",
                    "app.kubernetes.io/name=refract-remote-agent",
                    "-o",
                    "name",
                ],
            )?;
            v.trim().is_empty().then_some(())
        },
        String::new,
    )
    .await;
    // The link is down: status says so and exits 3.
    let down = refractctl(&["status", "--origin-kubeconfig", &okc, "-o", "json"]);
    assert_eq!(
        down.status.code(),
        Some(3),
        "status with the remote agent gone"
    );
    let json: serde_json::Value = serde_json::from_slice(&down.stdout).expect("status -o json");
    assert_eq!(json["peerings"][0]["link"]["state"], "unknown", "{json}");
    assert!(String::from_utf8_lossy(&down.stderr).contains("link to provider is unknown"));
    let started = Instant::now();
    let forced = ok(&refractctl(
        &[&unpeer[..], &["--force", "--timeout", "2m"]].concat(),
    ));
    println!("forced unpeer took {:.1?}", started.elapsed());
    assert!(forced.contains("the provider was not touched"), "{forced}");
    assert!(
        forced.contains("nothing labelled for the peering with provider is left on the origin"),
        "{forced}"
    );
    nothing_left_on_origin(&origin, "after the forced unpeer");
    let phase = kubectl(
        &provider,
        &[
            "-n",
            "apps-origin",
            "get",
            "pod",
            "survivor",
            "-o",
            "jsonpath={.status.phase}",
        ],
    );
    assert_eq!(
        phase, "Running",
        "the provider's pod must outlive a forced unpeer of the origin"
    );

    let cleaned = ok(&refractctl(
        &[
            &unpeer[..],
            &with_provider,
            &["--origin-id", "origin", "--force", "--timeout", "2m"],
        ]
        .concat(),
    ));
    assert!(
        cleaned.contains("provider: no namespace of tenant origin is left"),
        "{cleaned}"
    );
    nothing_left_on_provider(&provider, "after the forced unpeer with its kubeconfig");

    // -n: a peering whose agents live in another namespace on both sides (the remote agent of
    // refract-system is scaled to zero above, so this one serves alone), found, reported and
    // ended there only.
    let alt_ports: Vec<String> = (0..5).map(|_| free_port().to_string()).collect();
    let alt_peer: Vec<&str> = [
        vec!["-n", "platform-refract"],
        peer_but_ports,
        single_host_args(&alt_ports),
    ]
    .concat();
    let peered = ok(&refractctl(
        &[alt_peer.as_slice(), &["--timeout", "4m"]].concat(),
    ));
    assert!(
        peered.contains("Deployment platform-refract/refract-remote-agent created")
            && peered.contains("Deployment platform-refract/refract-local-agent-provider created"),
        "{peered}"
    );
    assert!(
        peered.contains("virtual node refract-provider Ready"),
        "{peered}"
    );
    let binding_subject = kubectl(
        &provider,
        &[
            "get",
            "clusterrolebinding",
            "refract-remote-agent",
            "-o",
            "jsonpath={.subjects[0].namespace}",
        ],
    );
    assert_eq!(binding_subject, "platform-refract");
    let alt_status = refractctl(&[
        "-n",
        "platform-refract",
        "status",
        "--origin-kubeconfig",
        &okc,
    ]);
    assert_eq!(
        alt_status.status.code(),
        Some(0),
        "status -n platform-refract: {}",
        String::from_utf8_lossy(&alt_status.stdout)
    );
    assert!(String::from_utf8_lossy(&alt_status.stdout)
        .contains("local agent:   platform-refract/refract-local-agent-provider 1/1 available"));
    let default_status = refractctl(&["status", "--origin-kubeconfig", &okc]);
    assert_eq!(
        default_status.status.code(),
        Some(3),
        "status without -n sees no peering in refract-system"
    );
    let unpeered = ok(&refractctl(
        &[
            &["-n", "platform-refract"][..],
            &unpeer[..],
            &with_provider,
            &["--timeout", "3m"],
        ]
        .concat(),
    ));
    assert!(
        unpeered.contains("Deployment platform-refract/refract-local-agent-provider deleted"),
        "{unpeered}"
    );
    nothing_left_on_origin(&origin, "after unpeer -n platform-refract");
    nothing_left_on_provider(&provider, "after unpeer -n platform-refract");
}

/// `--single-host` with the five ports the test chose, as `peer`, `install provider` and
/// `join complete` take it.
fn single_host_args(ports: &[String]) -> Vec<&str> {
    vec![
        "--single-host",
        "--grpc-port",
        &ports[0],
        "--remote-admin-port",
        &ports[1],
        "--webhook-port",
        &ports[2],
        "--local-admin-port",
        &ports[3],
        "--kubelet-port",
        &ports[4],
    ]
}

/// The peering made by two admins: `install provider` (which leaves the shared remote agent,
/// `remote_agent_before`, as it is), `join request`, the provider's `kubectl apply` and
/// `kubectl certificate approve`, `tenant export`, then `join complete`.
fn peer_by_two_admins(
    origin: &ControlPlane,
    provider: &ControlPlane,
    registry: &str,
    ports: &[String],
    remote_agent_before: &str,
) {
    let okc = origin.kubeconfig.display().to_string();
    let pkc = provider.kubeconfig.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let csr_file = dir.path().join("origin.csr.yaml").display().to_string();
    let bundle_file = dir.path().join("origin.bundle.yaml").display().to_string();
    let endpoint = format!("127.0.0.1:{}", ports[0]);
    let single_host = single_host_args(ports);

    // The provider's admin, once per provider (here: again, as for an upgrade).
    let generation = || {
        kubectl(
            provider,
            &[
                "-n",
                "refract-system",
                "get",
                "deployment",
                "refract-remote-agent",
                "-o",
                "jsonpath={.metadata.generation}",
            ],
        )
    };
    let generation_before = generation();
    let install = [&install_provider_args(&pkc, registry)[..], &single_host].concat();
    let installed = ok(&refractctl(&install));
    assert_eq!(
        generation(),
        generation_before,
        "install provider changed the remote agent's spec without a change asked"
    );
    assert!(
        installed.contains("refractctl tenant export --origin-id <origin id>"),
        "install provider does not print the next step"
    );
    // Its first run after the hand edit takes the kept flag under refractctl's management (a
    // metadata write, spec unchanged as checked above); a run after that writes nothing.
    let installed_again = ok(&refractctl(&install));
    assert_eq!(
        written(&installed_again),
        Vec::<&str>::new(),
        "install provider, run a second time, wrote"
    );
    let remote_agent = kubectl(
        provider,
        &[
            "-n",
            "refract-system",
            "get",
            "deployment",
            "refract-remote-agent",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].args}",
        ],
    );
    assert_eq!(
        remote_agent, remote_agent_before,
        "install provider changed the running remote agent"
    );

    // Another provider id would change the identity every tenant checks: refused.
    let renamed = refractctl(&[
        "install",
        "provider",
        "--provider-kubeconfig",
        &pkc,
        "--provider-id",
        "elsewhere",
        "--registry",
        registry,
        "--single-host",
        "--grpc-port",
        &ports[0],
    ]);
    assert!(
        !renamed.status.success(),
        "install provider renamed the provider"
    );
    assert!(
        String::from_utf8_lossy(&renamed.stderr)
            .contains("the remote agent here serves as provider provider, not elsewhere"),
        "install provider did not say why it refused"
    );

    // The origin's admin: a key kept in the origin, a request for the provider's admin.
    let join_request = [
        "join",
        "request",
        "--origin-kubeconfig",
        &okc,
        "--origin-id",
        "origin",
        "--provider-id",
        "provider",
        "--out",
        &csr_file,
    ];
    // As a dry run first: the Secret that would keep the key, no key made, no file written.
    let dry = ok(&refractctl(
        &[&join_request[..], &["--dry-run=client"]].concat(),
    ));
    assert!(
        dry.contains("Secret refract-system/refract-local-agent-provider-request (dry run)"),
        "{dry}"
    );
    assert!(
        kubectl_get(
            origin,
            &[
                "-n",
                "refract-system",
                "secret",
                "refract-local-agent-provider-request",
                "-o",
                "name"
            ]
        )
        .is_none()
            && !std::path::Path::new(&csr_file).exists(),
        "join request --dry-run made a key or wrote the request"
    );
    let requested = refractctl(&join_request);
    assert!(requested.status.success(), "join request failed");
    let said = String::from_utf8_lossy(&requested.stderr).into_owned();
    assert!(
        said.contains("kubectl certificate approve refract-tenant-origin"),
        "join request does not print the next step"
    );
    let request = std::fs::read_to_string(&csr_file).unwrap();
    assert!(
        request.contains("signerName: refract.io/tenant-client"),
        "{request}"
    );
    assert!(!request.contains("PRIVATE KEY"), "the request holds a key");
    // Asked twice, the same request: one key, one certificate.
    assert!(refractctl(&join_request).status.success());
    assert_eq!(
        std::fs::read_to_string(&csr_file).unwrap(),
        request,
        "a second join request made a new key"
    );

    // The provider's admin applies and approves it with kubectl, then exports the bundle.
    kubectl(provider, &["apply", "-f", &csr_file]);
    kubectl(
        provider,
        &["certificate", "approve", "refract-tenant-origin"],
    );
    let export = [
        "tenant",
        "export",
        "--provider-kubeconfig",
        &pkc,
        "--origin-id",
        "origin",
        "--provider-id",
        "provider",
        "--provider-endpoint",
        &endpoint,
        "--out",
        &bundle_file,
    ];
    // As a dry run first: the request checked, nothing waited for or written.
    let dry = refractctl(&[&export[..], &["--dry-run=client"]].concat());
    assert!(dry.status.success(), "tenant export --dry-run failed");
    assert!(
        String::from_utf8_lossy(&dry.stderr).contains("refract.io/tenant-client and is approved"),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        !std::path::Path::new(&bundle_file).exists(),
        "tenant export --dry-run wrote the bundle"
    );
    let exported = refractctl(&export);
    assert!(exported.status.success(), "tenant export failed");
    assert!(
        String::from_utf8_lossy(&exported.stderr).contains("refractctl join complete --bundle"),
        "tenant export does not print the next step"
    );
    let bundle = std::fs::read_to_string(&bundle_file).unwrap();
    assert!(bundle.contains("kind: PeeringBundle"), "{bundle}");
    assert!(!bundle.contains("PRIVATE KEY"), "the bundle holds a key");

    // The origin's admin looks at what it would install, then completes it.
    let dry = ok(&refractctl(&[
        "join",
        "complete",
        "--origin-kubeconfig",
        &okc,
        "--bundle",
        &bundle_file,
        "--registry",
        registry,
        "--dry-run=client",
    ]));
    assert!(
        dry.contains("Deployment refract-system/refract-local-agent-provider (dry run)"),
        "{dry}"
    );
    assert!(
        kubectl_get(
            origin,
            &[
                "-n",
                "refract-system",
                "deployment",
                "refract-local-agent-provider",
                "-o",
                "name"
            ]
        )
        .is_none(),
        "a dry run wrote to the origin"
    );
    let join_complete = [
        &[
            "join",
            "complete",
            "--origin-kubeconfig",
            &okc,
            "--bundle",
            &bundle_file,
            "--registry",
            registry,
            "--timeout",
            "4m",
        ][..],
        &single_host,
    ]
    .concat();
    let completed = ok(&refractctl(&join_complete));
    for step in [
        "next to the key made in the origin",
        "tenant origin connected to provider provider",
        "virtual node refract-provider Ready",
        "peered: origin origin offloads to provider provider",
    ] {
        assert!(
            completed.contains(step),
            "join complete did not say {step:?}"
        );
    }
    // The request's key is now the client certificate's; the request Secret is gone.
    let left = kubectl_get(
        origin,
        &[
            "-n",
            "refract-system",
            "secret",
            "refract-local-agent-provider-request",
            "-o",
            "name",
        ],
    );
    assert!(
        left.unwrap_or_default().is_empty(),
        "the request Secret is left"
    );
    // Completing again changes nothing.
    let again = ok(&refractctl(&join_complete));
    assert!(again.contains("is this one already: kept"), "{again}");
    assert!(again.contains("Deployment refract-system/refract-local-agent-provider unchanged"));
    assert_eq!(
        written(&again),
        Vec::<&str>::new(),
        "a second join complete wrote"
    );
}
