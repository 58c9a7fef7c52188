//! Failover of either agent, in-cluster from `deploy/` on real nodes (two replicas each behind
//! their Services; see `refract_e2e::in_cluster`), while 1,000 origin ConfigMaps change:
//!
//! - the local agent replica leading the peering (Lease `refract-local-agent-provider`), its
//!   pod deleted or its container SIGKILLed, while pods are created in the offloaded namespace;
//! - the remote agent replica serving the tenant (Lease `refract-tenant-origin`), the same
//!   two ways, while a provider pod of the tenant is deleted.
//!
//! Each round checks what issue 51 asks: the stream back (the remote agent's Inspect shows a
//! connection opened after the fault), the provider written exactly once per changed object
//! and never with what it held, the provider's pods not restarted (the deleted one re-created),
//! the virtual node Ready throughout, every pod created meanwhile offloaded (placed by the
//! webhook, Running on the provider, none at the origin; a creation the API server refused
//! while no webhook answered is counted and retried, as a controller would), and `kubectl logs`
//! and `exec` working again. It prints each round and the median and worst time.
//!
//! One round of each in the suite; `REFRACT_FAILOVER_ROUNDS=10` (`scripts/bench-failover.sh
//! --in-cluster`) runs ten of each.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use refract_e2e::churn::{self, ProviderWrites};
use refract_e2e::in_cluster::{self, agent_state, InCluster, Inspector, WAIT};
use refract_e2e::node_readiness::NodeReadiness;
use refract_e2e::{
    busybox, eventually, kubectl, kubectl_get, kubectl_stdin, kubectl_stdin_output,
    logs_and_exec_work, median_and_worst, run, until_extended,
};
use refract_testkit::ControlPlane;

const OBJECTS: usize = 1000;
const NS: &str = "ha";
const TWIN: &str = "ha-origin";
const TOLERATION: &str = "virtual-node.liqo.io/not-allowed";
/// Pods created in the offloaded namespace while each local agent failover is under way.
const PODS_DURING: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Agent {
    Local,
    Remote,
}

impl Agent {
    fn name(self) -> &'static str {
        match self {
            Agent::Local => "local-agent",
            Agent::Remote => "remote-agent",
        }
    }

    /// The Lease naming the replica that matters: the peering's leader, or the tenant's server.
    fn lease(self) -> &'static str {
        match self {
            Agent::Local => "refract-local-agent-provider",
            Agent::Remote => "refract-tenant-origin",
        }
    }

    fn cluster(self, pair: &InCluster) -> &ControlPlane {
        match self {
            Agent::Local => &pair.origin,
            Agent::Remote => &pair.provider,
        }
    }
}

#[derive(Clone, Copy)]
enum Fault {
    /// `kubectl delete pod`: the replica stops gracefully and a new pod replaces it.
    PodDeleted,
    /// SIGKILL of the agent's container on its node: the kubelet restarts it in the same pod.
    Killed,
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::PodDeleted => "pod deleted",
            Fault::Killed => "container SIGKILLed",
        })
    }
}

fn sleeper(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'echo hello from {name}; trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
        busybox()
    )
}

/// The pod named by `agent`'s Lease.
fn holder(pair: &InCluster, agent: Agent) -> String {
    kubectl_get(
        agent.cluster(pair),
        &[
            "-n",
            "refract-system",
            "lease",
            agent.lease(),
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
    .unwrap_or_default()
}

/// Deletes the pod, or SIGKILLs its container through the node's containerd.
fn inflict(pair: &InCluster, agent: Agent, fault: Fault, pod: &str) {
    let cp = agent.cluster(pair);
    match fault {
        Fault::PodDeleted => {
            kubectl(
                cp,
                &["-n", "refract-system", "delete", "pod", pod, "--wait=false"],
            );
        }
        Fault::Killed => {
            let id = kubectl(
                cp,
                &[
                    "-n",
                    "refract-system",
                    "get",
                    "pod",
                    pod,
                    "-o",
                    "jsonpath={.status.containerStatuses[0].containerID}",
                ],
            );
            let id = id.trim().trim_start_matches("containerd://");
            cp.node
                .as_ref()
                .unwrap()
                .ctr(&["tasks", "kill", "--signal", "SIGKILL", id])
                .unwrap();
        }
    }
}

/// Watches, from `fault_at` on and on a thread of its own (the test blocks its runtime on
/// `kubectl`), until the remote agent shows tenant `origin` connected on a stream opened after
/// `since`: how long after the fault that was, or the last answer after [`WAIT`].
fn watch_stream_back(
    inspector: Inspector,
    since: Timestamp,
    fault_at: Instant,
) -> tokio::task::JoinHandle<Result<Duration, String>> {
    tokio::task::spawn_blocking(move || loop {
        let text = inspector.list_tenants();
        let back = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v["tenants"].as_array()?.iter().find_map(|t| {
                    let opened: Timestamp = t["connectedSince"].as_str()?.parse().ok()?;
                    (t["clusterId"] == "origin" && t["connected"] == true && opened > since)
                        .then_some(())
                })
            });
        if back.is_some() {
            return Ok(fault_at.elapsed());
        }
        if fault_at.elapsed() > WAIT {
            return Err(text);
        }
        std::thread::sleep(Duration::from_millis(100));
    })
}

/// How long a replica may take to come back: a container SIGKILLed again and again is
/// restarted after the kubelet's back-off, which doubles from 10 s up to 5 minutes.
const BACK_OFF: Duration = Duration::from_secs(330);

/// Both Deployments back at two available replicas, each Lease held by a running pod.
async fn until_both_replicas(pair: &InCluster) {
    for agent in [Agent::Local, Agent::Remote] {
        let cp = agent.cluster(pair);
        eventually(
            BACK_OFF,
            &format!("refract-{} back at two available replicas", agent.name()),
            || {
                let pods = kubectl_get(
                    cp,
                    &[
                        "-n",
                        "refract-system",
                        "pods",
                        "-l",
                        &format!("app.kubernetes.io/name=refract-{}", agent.name()),
                        "-o",
                        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
                    ],
                )?;
                let ready = pods
                    .lines()
                    .filter(|l| l.split(' ').collect::<Vec<_>>()[1..] == ["Running", "true", ""])
                    .count();
                let lease = holder(pair, agent);
                (ready == 2 && pods.lines().count() == 2 && pods.contains(&format!("{lease} ")))
                    .then_some(())
            },
            || agent_state(cp, agent.name()),
        )
        .await;
    }
}

/// Creates `name` in the offloaded namespace, again after a refusal; how many refusals.
async fn create_during(origin: &ControlPlane, name: &str) -> usize {
    let mut refused = 0;
    loop {
        let out = kubectl_stdin_output(origin, &["apply", "-f", "-"], &sleeper(name));
        if out.status.success() {
            return refused;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("failed calling webhook"),
            "creating {name} failed otherwise: {err}"
        );
        println!("  {name} refused while no webhook answered: {}", err.trim());
        refused += 1;
        assert!(refused < 30, "{name} refused 30 times");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The lines of `churn::provider_pods` except pod `except`'s.
fn pods_but(pods: &str, except: &str) -> Vec<String> {
    pods.lines()
        .filter(|l| !l.starts_with(&format!("{except} ")))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn either_agent_fails_over_in_cluster_without_rewrites_lost_pods_or_local_pods() {
    let rounds: u32 = std::env::var("REFRACT_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pair = in_cluster::deploy().await;
    let (origin, provider) = (&pair.origin, &pair.provider);
    kubectl_stdin(
        origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{podOffloadingStrategy: Remote}}\n---\n{}", sleeper("web")),
    );
    until_extended(origin, NS, WAIT, || agent_state(origin, "local-agent")).await;
    let provider_client = provider.client().await.unwrap();
    let origin_client = origin.client().await.unwrap();
    let writes = ProviderWrites::watch(provider_client.clone(), TWIN);
    let origin_api: Api<ConfigMap> = Api::namespaced(origin_client.clone(), NS);
    let provider_api: Api<ConfigMap> = Api::namespaced(provider_client, TWIN);
    churn::create(&origin_api, OBJECTS).await;
    churn::converged(&provider_api, OBJECTS, 0, WAIT).await;
    eventually(
        WAIT,
        "web Running at the origin",
        || {
            (kubectl_get(
                origin,
                &["-n", NS, "pod", "web", "-o", "jsonpath={.status.phase}"],
            )? == "Running")
                .then_some(())
        },
        || agent_state(origin, "local-agent"),
    )
    .await;
    logs_and_exec_work(origin, NS, "web");
    let readiness = NodeReadiness::watch(Api::all(origin_client));

    let mut churn_round = 0;
    let mut summary = Vec::new();
    for agent in [Agent::Local, Agent::Remote] {
        for fault in [Fault::PodDeleted, Fault::Killed] {
            let mut took = Vec::new();
            for round in 1..=rounds {
                churn_round += 1;
                let victim = holder(&pair, agent);
                let pods_before = churn::provider_pods(provider, TWIN);
                let writes_before = writes.count();
                let churning = {
                    let origin_api = origin_api.clone();
                    tokio::spawn(
                        async move { churn::churn(&origin_api, OBJECTS, churn_round).await },
                    )
                };
                tokio::time::sleep(Duration::from_millis(300)).await;
                let since = Timestamp::now();
                let fault_at = Instant::now();
                let stream_back = watch_stream_back(pair.inspector(), since, fault_at);
                inflict(&pair, agent, fault, &victim);
                let mut during = Vec::new();
                let mut refusals = 0;
                match agent {
                    Agent::Local => {
                        for i in 0..PODS_DURING {
                            let name = format!("during-{churn_round}-{i}");
                            refusals += create_during(origin, &name).await;
                            during.push(name);
                            tokio::time::sleep(Duration::from_secs(2)).await;
                        }
                    }
                    Agent::Remote => {
                        kubectl(
                            provider,
                            &["-n", TWIN, "delete", "pod", "web", "--wait=false"],
                        );
                    }
                }
                churning.await.unwrap();
                let back = stream_back.await.unwrap().unwrap_or_else(|last| {
                    panic!(
                        "{agent:?} {fault:?} round {round}: no stream of tenant origin within {WAIT:?} of the fault; last answer: {last}\n{}{}",
                        agent_state(origin, "local-agent"),
                        agent_state(provider, "remote-agent")
                    )
                });
                churn::converged(&provider_api, OBJECTS, churn_round, WAIT).await;
                let (written, duplicates) = writes.settled(writes_before).await;
                assert!(
                    duplicates.is_empty(),
                    "{agent:?} {fault:?} round {round}: writes that changed nothing: {duplicates:?}"
                );
                assert_eq!(
                    written, OBJECTS as u64,
                    "{agent:?} {fault:?} round {round}: one write per changed object"
                );
                for pod in &during {
                    let tolerations = kubectl(
                        origin,
                        &[
                            "-n",
                            NS,
                            "get",
                            "pod",
                            pod,
                            "-o",
                            "jsonpath={.spec.tolerations}",
                        ],
                    );
                    assert!(
                        tolerations.contains(TOLERATION),
                        "{pod} was not mutated: {tolerations}"
                    );
                    eventually(
                        WAIT,
                        &format!("{pod} Running on the virtual node"),
                        || {
                            let out = kubectl_get(
                                origin,
                                &[
                                    "-n",
                                    NS,
                                    "pod",
                                    pod,
                                    "-o",
                                    "jsonpath={.spec.nodeName} {.status.phase}",
                                ],
                            )?;
                            (out == "refract-provider Running").then_some(())
                        },
                        || agent_state(origin, "local-agent"),
                    )
                    .await;
                }
                // The provider's pods: none restarted; the one deleted re-created and Running.
                let recreated = match agent {
                    Agent::Local => {
                        let after = churn::provider_pods(provider, TWIN);
                        let kept: Vec<String> = pods_before.lines().map(str::to_string).collect();
                        assert!(
                            kept.iter().all(|l| after.lines().any(|a| a == l)),
                            "{agent:?} {fault:?} round {round}: provider pods changed:\nbefore:\n{pods_before}\nafter:\n{after}"
                        );
                        ""
                    }
                    Agent::Remote => {
                        let old_web = pods_before
                            .lines()
                            .find(|l| l.starts_with("web "))
                            .unwrap()
                            .to_string();
                        eventually(
                            WAIT,
                            "the deleted provider pod re-created and Running",
                            || {
                                let after = churn::provider_pods(provider, TWIN);
                                let web = after.lines().find(|l| l.starts_with("web "))?;
                                (web != old_web && web.ends_with(" 0 Running")).then_some(())
                            },
                            || agent_state(provider, "remote-agent"),
                        )
                        .await;
                        let after = churn::provider_pods(provider, TWIN);
                        assert_eq!(
                            pods_but(&after, "web"),
                            pods_but(&pods_before, "web"),
                            "{agent:?} {fault:?} round {round}: other provider pods changed"
                        );
                        "; the provider pod deleted meanwhile re-created"
                    }
                };
                let not_ready = readiness.not_ready();
                assert!(
                    not_ready.is_empty(),
                    "{agent:?} {fault:?} round {round}: the virtual node left Ready: {not_ready:?}"
                );
                eventually(
                    WAIT,
                    "kubectl logs at the origin",
                    || {
                        run(
                            "kubectl",
                            &[
                                "--kubeconfig",
                                origin.kubeconfig.to_str()?,
                                "-n",
                                NS,
                                "logs",
                                "web",
                            ],
                        )
                        .status
                        .success()
                        .then_some(())
                    },
                    || agent_state(origin, "local-agent"),
                )
                .await;
                logs_and_exec_work(origin, NS, "web");
                if let Some(pod) = during.first() {
                    logs_and_exec_work(origin, NS, pod);
                }
                let placed = match agent {
                    Agent::Local => format!(
                        "; {n} of {n} pods created meanwhile offloaded by the webhook and Running on the provider, none at the origin ({refusals} creation(s) refused while no webhook answered, retried)",
                        n = during.len()
                    ),
                    Agent::Remote => String::new(),
                };
                println!(
                    "{} {fault:?} round {round} ({victim}): stream back {back:.1?} after the fault; provider writes {written} for {OBJECTS} changed objects, 0 duplicate; provider pods not restarted{recreated}; virtual node Ready throughout{placed}; logs and exec work",
                    agent.name()
                );
                took.push(back);
                let last =
                    matches!((agent, fault), (Agent::Remote, Fault::Killed)) && round == rounds;
                if !last {
                    until_both_replicas(&pair).await;
                }
            }
            let (median, worst) = median_and_worst(&took);
            summary.push(format!(
                "{} {fault:?}, {rounds} round(s): stream back after median {median:.1?}, worst {worst:.1?}",
                agent.name()
            ));
        }
    }
    for line in summary {
        println!("{line}");
    }
}
