//! Two local agent replicas of one peering, as `deploy/local-agent` runs them: one leads (the
//! stream, the virtual node and its kubelet API, origin status), elected on the Lease
//! `refract-local-agent-provider`; the other stands by and serves the pod webhook. The API
//! server reaches the webhook through a forwarder that, like a Service, sends each connection
//! to a replica that is up.
//!
//! The leader is killed with SIGKILL while 1,000 origin ConfigMaps change and pods are created
//! in the offloaded namespace. The standby must take over once the Lease lapses (15 s, the
//! default) and resume the stream at the cost of what changed: the provider is written exactly
//! once per changed object and never with what it held, its pod keeps running (0 restarts),
//! the virtual node stays Ready (the failover is shorter than its health threshold), every pod
//! created meanwhile is offloaded (placed by the standby's webhook, never run at the origin),
//! and the node's kubelet endpoint moves to the new leader, where `kubectl logs` and `exec`
//! work. The killed replica comes back as the standby (a restarted container keeps its pod's
//! name) and the next round kills the other. Then the leader is stopped gracefully: it releases
//! the Lease and the standby takes over within seconds.
//!
//! One round in the suite; `REFRACT_FAILOVER_ROUNDS=10` (`scripts/bench-failover.sh`) runs
//! ten and prints the median and worst of each figure.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use refract_e2e::churn::{self, ProviderWrites};
use refract_e2e::forward::Forwarder;
use refract_e2e::node_readiness::NodeReadiness;
use refract_e2e::resume_series::CONNECTED;
use refract_e2e::{
    busybox, kubectl, kubectl_get, kubectl_stdin, logs_and_exec_work, median_and_worst, metric,
    origin_get, Agent, Peering, ReplicaPorts,
};

const OBJECTS: usize = 1000;
const NS: &str = "ha";
const TWIN: &str = "ha-origin";
const WAIT: Duration = Duration::from_secs(120);
const LEASE: &str = "refract-local-agent-provider";
/// deploy/'s defaults for the virtual node's health: NotReady after 3 failed checks 10 s apart.
const HEALTH: [&str; 2] = [
    "--health-check-interval=10s",
    "--health-failure-threshold=3",
];
const TOLERATION: &str = "virtual-node.liqo.io/not-allowed";
/// Pods created in the offloaded namespace while each failover is under way.
const PODS_DURING: usize = 3;

fn holder(p: &Peering) -> String {
    kubectl_get(
        &p.origin,
        &[
            "-n",
            "default",
            "lease",
            LEASE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
    .unwrap_or_default()
}

fn kubelet_port(p: &Peering) -> String {
    origin_get(
        p,
        &[
            "node",
            "refract-provider",
            "-o",
            "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
        ],
    )
    .unwrap_or_default()
}

fn sleeper(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'echo hello from {name}; trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
        busybox()
    )
}

/// One local agent replica: its name in the Lease, its ports, its process while it runs.
struct Replica {
    identity: &'static str,
    ports: ReplicaPorts,
    agent: Option<Agent>,
}

impl Replica {
    fn admin(&self) -> String {
        format!("127.0.0.1:{}", self.ports.admin)
    }

    fn log(&self) -> String {
        self.agent.as_ref().map(Agent::log_text).unwrap_or_default()
    }
}

/// Waits until `check` holds, looking every 200 ms; panics with `what` and the replicas' logs
/// after [`WAIT`].
async fn until<F: std::future::Future<Output = bool>>(
    replicas: &[Replica],
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + WAIT;
    while !check().await {
        if Instant::now() > deadline {
            let logs: String = replicas
                .iter()
                .map(|r| format!("--- {} ---\n{}\n", r.identity, r.log()))
                .collect();
            panic!("timed out after {WAIT:?} waiting for {what}\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `replica` has its stream open; how long that took from `since`.
async fn until_connected(replicas: &[Replica], replica: usize, since: Instant) -> Duration {
    let admin = replicas[replica].admin();
    until(replicas, "the new leader's stream open", || async {
        metric(&admin, CONNECTED).await == 1.0
    })
    .await;
    since.elapsed()
}

/// Waits until `replica` says it stands by.
async fn until_standing_by(replicas: &[Replica], replica: usize) {
    until(replicas, "the replica standing by", || async {
        replicas[replica].log().contains("standing by")
    })
    .await;
}

#[tokio::test]
async fn a_standby_local_agent_takes_over_without_rewrites_lost_pods_or_local_pods() {
    let rounds: u32 = std::env::var("REFRACT_FAILOVER_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut p = Peering::start_offloading_with(&HEALTH)
        .await
        .expect("peering");
    p.until_node_ready(WAIT).await;
    p.eventually(WAIT, "the first replica leads", || {
        (holder(&p) == "local-agent-0").then_some(())
    })
    .await;
    let first = ReplicaPorts {
        admin: p.local_admin.rsplit(':').next().unwrap().parse().unwrap(),
        kubelet: p.kubelet_port,
        webhook: p.webhook_port.unwrap(),
    };
    let second = ReplicaPorts::free();
    let mut replicas = [
        Replica {
            identity: "local-agent-0",
            ports: first,
            agent: p.local.take(),
        },
        Replica {
            identity: "local-agent-1",
            ports: second,
            agent: Some(p.start_local_replica("local-agent-1", &second)),
        },
    ];

    // The webhook behind one address, as a Service puts it.
    let service = Forwarder::spawn(vec![
        format!("127.0.0.1:{}", first.webhook),
        format!("127.0.0.1:{}", second.webhook),
    ]);
    let configuration = kubectl(
        &p.origin,
        &["get", "mutatingwebhookconfiguration", "-o", "json"],
    )
    .replace(
        &format!("127.0.0.1:{}/", first.webhook),
        &format!("127.0.0.1:{}/", service.port),
    );
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &configuration);

    let standby_admin = replicas[1].admin();
    until(
        &replicas,
        "the standby ready (serving its webhook)",
        || async {
            refract_e2e::http_get(&standby_admin, "/readyz", None)
                .await
                .0
                == 200
        },
    )
    .await;
    until_standing_by(&replicas, 1).await;
    assert_eq!(
        metric(&standby_admin, "refract_local_leader").await,
        0.0,
        "the standby does not lead"
    );
    assert_eq!(
        metric(&replicas[0].admin(), "refract_local_leader").await,
        1.0
    );

    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{podOffloadingStrategy: Remote}}\n---\n{}", sleeper("web")),
    );
    p.until_extended(NS, WAIT).await;
    let provider_client = p.provider.client().await.unwrap();
    let origin_client = p.origin.client().await.unwrap();
    let writes = ProviderWrites::watch(provider_client.clone(), TWIN);
    let origin: Api<ConfigMap> = Api::namespaced(origin_client.clone(), NS);
    let provider: Api<ConfigMap> = Api::namespaced(provider_client, TWIN);
    churn::create(&origin, OBJECTS).await;
    churn::converged(&provider, OBJECTS, 0, WAIT).await;
    let web = p
        .eventually(WAIT, "web Running on the provider", || {
            let pods = churn::provider_pods(&p.provider, TWIN);
            pods.lines()
                .find(|l| l.starts_with("web ") && l.ends_with(" 0 Running"))
                .map(str::to_string)
        })
        .await;
    p.eventually(WAIT, "web Running at the origin", || {
        (origin_get(
            &p,
            &["-n", NS, "pod", "web", "-o", "jsonpath={.status.phase}"],
        )? == "Running")
            .then_some(())
    })
    .await;
    logs_and_exec_work(&p.origin, NS, "web");
    let readiness = NodeReadiness::watch(Api::all(origin_client));

    let mut leader = 0;
    let mut takeovers = Vec::new();
    for round in 1..=rounds {
        let next = 1 - leader;
        // The leader dies mid-churn; pods are created while nobody leads.
        let writes_before = writes.count();
        let churning = {
            let origin = origin.clone();
            tokio::spawn(async move { churn::churn(&origin, OBJECTS, round).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let dying = replicas[leader].agent.take().unwrap();
        refract_e2e::run_ok("kill", &["-KILL", &dying.pid().unwrap().to_string()]);
        drop(dying);
        let killed = Instant::now();
        let mut during = Vec::new();
        for i in 0..PODS_DURING {
            let name = format!("during-{round}-{i}");
            kubectl_stdin(&p.origin, &["apply", "-f", "-"], &sleeper(&name));
            during.push(name);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        churning.await.unwrap();
        let took = until_connected(&replicas, next, killed).await;
        assert_eq!(holder(&p), replicas[next].identity);
        churn::converged(&provider, OBJECTS, round, WAIT).await;
        let (rewritten, duplicates) = writes.settled(writes_before).await;
        assert!(
            duplicates.is_empty(),
            "round {round}: writes that changed nothing: {duplicates:?}"
        );
        assert_eq!(
            rewritten, OBJECTS as u64,
            "round {round}: one write per changed object"
        );
        assert!(
            took < Duration::from_secs(30),
            "round {round}: the standby took {took:?} to take over"
        );

        // Every pod created while nobody led went through the standby's webhook and is
        // offloaded.
        for pod in &during {
            let tolerations = origin_get(
                &p,
                &["-n", NS, "pod", pod, "-o", "jsonpath={.spec.tolerations}"],
            )
            .unwrap();
            assert!(
                tolerations.contains(TOLERATION),
                "{pod} was not mutated: {tolerations}"
            );
            p.eventually(WAIT, "the pods created during the failover Running", || {
                let out = origin_get(
                    &p,
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
            })
            .await;
        }
        let web_after = churn::provider_pods(&p.provider, TWIN)
            .lines()
            .find(|l| l.starts_with("web "))
            .map(str::to_string)
            .unwrap_or_default();
        assert_eq!(
            web_after, web,
            "round {round}: the provider pod changed or restarted"
        );
        let not_ready = readiness.not_ready();
        assert!(
            not_ready.is_empty(),
            "round {round}: the virtual node left Ready during the failover: {not_ready:?}"
        );
        // The node's kubelet API is the new leader's.
        let port = replicas[next].ports.kubelet.to_string();
        p.eventually(WAIT, "the kubelet endpoint at the new leader", || {
            (kubelet_port(&p) == port).then_some(())
        })
        .await;
        logs_and_exec_work(&p.origin, NS, "web");
        logs_and_exec_work(&p.origin, NS, &during[0]);
        println!(
            "round {round}: SIGKILL of {}: {}'s stream open {took:.1?} after the kill (Lease 15 s); provider writes {rewritten} for {OBJECTS} changed objects, 0 duplicate; provider pod restarts 0; node Ready throughout; {PODS_DURING} of {PODS_DURING} pods created meanwhile placed by the standby's webhook and Running on the provider, none at the origin; logs and exec through the new leader",
            replicas[leader].identity, replicas[next].identity
        );
        takeovers.push(took);

        // The killed replica comes back (same pod name: a restarted container) and stands by.
        let restarted = p.start_local_replica(replicas[leader].identity, &replicas[leader].ports);
        replicas[leader].agent = Some(restarted);
        until_standing_by(&replicas, leader).await;
        leader = next;
    }
    let (median, worst) = median_and_worst(&takeovers);
    println!(
        "SIGKILL of the leader, {rounds} round(s): stream back after median {median:.1?}, worst {worst:.1?}"
    );

    // The leader is stopped gracefully: it releases the Lease and the standby takes it at once.
    let next = 1 - leader;
    let stopping = Instant::now();
    replicas[leader].agent.take().unwrap().stop().await;
    let took = until_connected(&replicas, next, stopping).await;
    println!(
        "graceful handover: {}'s stream open {took:.1?} after the leader was asked to stop",
        replicas[next].identity
    );
    assert!(
        took < Duration::from_secs(10),
        "a released Lease took {took:?} to be taken"
    );
    assert_eq!(holder(&p), replicas[next].identity);
    let port = replicas[next].ports.kubelet.to_string();
    p.eventually(WAIT, "the kubelet endpoint at the new leader", || {
        (kubelet_port(&p) == port).then_some(())
    })
    .await;
    logs_and_exec_work(&p.origin, NS, "web");
    let not_ready = readiness.not_ready();
    assert!(
        not_ready.is_empty(),
        "the virtual node left Ready during the handover: {not_ready:?}"
    );
}
