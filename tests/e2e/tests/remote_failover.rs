//! Two remote agent replicas serving one provider: any replica accepts a tenant's connection,
//! one at a time serves the tenant (the holder of Lease `refract-tenant-<tenant>`), and one
//! runs the work that spans tenants (the holder of Lease `refract-remote-agent`: the ShadowPod
//! controller among it). The local agent reaches them through a forwarder that, like a
//! Service, sends each connection to a replica that accepts it.
//!
//! Three moves, each while 300 origin ConfigMaps change: the serving replica is killed with
//! SIGKILL (the other takes the tenant once its Lease lapses, and re-creates a provider pod
//! deleted meanwhile); the serving replica is stopped (it hands the tenant back at once); the
//! tenant's connection reaches the replica not serving it (that one asks, and the holder hands
//! the tenant over and stops restoring its objects). After each, the provider holds exactly the
//! origin's state, written once per change and never with what it held.

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
use refract_e2e::resume_series::CONNECTED;
use refract_e2e::{
    busybox, free_port, kubectl, kubectl_get, kubectl_stdin, metric, Agent, Peering,
};

const OBJECTS: usize = 300;
const NS: &str = "spread";
const TWIN: &str = "spread-origin";
const WAIT: Duration = Duration::from_secs(120);
const TENANT_LEASE: &str = "refract-tenant-origin";
const CONTROLLER_LEASE: &str = "refract-remote-agent";
/// deploy/'s defaults for the virtual node's health: NotReady after 3 failed checks 10 s apart.
const HEALTH: [&str; 2] = [
    "--health-check-interval=10s",
    "--health-failure-threshold=3",
];

/// One remote agent replica: its name in the Leases, its addresses, its process while it runs.
struct Replica {
    identity: &'static str,
    listen: String,
    admin: String,
    agent: Option<Agent>,
}

impl Replica {
    fn new(identity: &'static str) -> Self {
        Self {
            identity,
            listen: format!("127.0.0.1:{}", free_port()),
            admin: format!("127.0.0.1:{}", free_port()),
            agent: None,
        }
    }

    fn start(&mut self, p: &Peering) {
        self.agent = Some(p.start_remote_replica(self.identity, &self.listen, &self.admin));
    }

    fn log(&self) -> String {
        self.agent.as_ref().map(Agent::log_text).unwrap_or_default()
    }
}

fn holder(p: &Peering, lease: &str) -> String {
    kubectl_get(
        &p.provider,
        &[
            "-n",
            "refract-system",
            "lease",
            lease,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
    .unwrap_or_default()
}

/// The provider pod `web`: its UID and phase.
fn provider_web(p: &Peering) -> Option<(String, String)> {
    let line = kubectl_get(
        &p.provider,
        &[
            "-n",
            TWIN,
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ],
    )?;
    let (uid, phase) = line.split_once(' ')?;
    Some((uid.to_string(), phase.to_string()))
}

/// Sets `data.round` of origin ConfigMap `name`.
fn origin_patch(p: &Peering, name: &str, round: &str) {
    kubectl(
        &p.origin,
        &[
            "-n",
            NS,
            "patch",
            "configmap",
            name,
            "--type=merge",
            "-p",
            &format!(r#"{{"data":{{"round":"{round}"}}}}"#),
        ],
    );
}

/// `data.round` of the provider's copy of `name`.
fn provider_round(p: &Peering, name: &str) -> Option<String> {
    kubectl_get(
        &p.provider,
        &[
            "-n",
            TWIN,
            "configmap",
            name,
            "-o",
            "jsonpath={.data.round}",
        ],
    )
}

/// What one move must leave: exactly the origin's state, one write per change, no write of
/// what the provider held.
struct Churn {
    origin: Api<ConfigMap>,
    provider: Api<ConfigMap>,
    writes: ProviderWrites,
    round: u32,
}

impl Churn {
    /// Starts changing every object; the fault follows, then [`Churn::end`].
    async fn begin(&mut self) -> Started {
        self.round += 1;
        let round = self.round;
        let before = self.writes.count();
        let churning = {
            let origin = self.origin.clone();
            tokio::spawn(async move { churn::churn(&origin, OBJECTS, round).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        Started { before, churning }
    }

    /// Waits for the churn, then checks the provider.
    async fn end(&self, name: &str, started: Started) {
        started.churning.await.unwrap();
        let took = churn::converged(&self.provider, OBJECTS, self.round, WAIT).await;
        let (written, duplicates) = self.writes.settled(started.before).await;
        println!(
            "{name}: {OBJECTS} objects changed; converged {took:.1?} after the churn; provider writes {written}, duplicate writes {}",
            duplicates.len()
        );
        assert!(
            duplicates.is_empty(),
            "{name}: writes that changed nothing: {duplicates:?}"
        );
        assert_eq!(
            written, OBJECTS as u64,
            "{name}: one write per changed object"
        );
    }
}

/// A churn under way.
struct Started {
    before: u64,
    churning: tokio::task::JoinHandle<std::collections::HashMap<String, Instant>>,
}

/// Waits until the local agent's stream is open; how long that took from `since`.
async fn until_connected(p: &Peering, since: Instant) -> Duration {
    let deadline = Instant::now() + WAIT;
    while metric(&p.local_admin, CONNECTED).await != 1.0 {
        assert!(
            Instant::now() < deadline,
            "the local agent never connected again:\n{}",
            p.local_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    since.elapsed()
}

/// Waits until the local agent's stream is down (it notices a dead replica at once: the
/// kernel resets the connection of a killed process).
async fn until_disconnected(p: &Peering) {
    let deadline = Instant::now() + WAIT;
    while metric(&p.local_admin, CONNECTED).await == 1.0 {
        assert!(Instant::now() < deadline, "the stream never went down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_tenant_moves_between_remote_agent_replicas_without_rewrites_or_lost_pods() {
    let mut p = Peering::start_offloading_with(&HEALTH)
        .await
        .expect("peering");
    // Two replicas instead of the one, behind one address as a Service puts them.
    p.remote.take().unwrap().stop().await;
    let mut replicas = [Replica::new("remote-a"), Replica::new("remote-b")];
    replicas[0].start(&p);
    tokio::time::sleep(Duration::from_secs(1)).await;
    replicas[1].start(&p);
    let service = Forwarder::spawn(replicas.iter().map(|r| r.listen.clone()).collect());
    p.local.take().unwrap().stop().await;
    p.local_dial = Some(format!("127.0.0.1:{}", service.port));
    p.start_local();
    p.until_node_ready(WAIT).await;

    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{podOffloadingStrategy: Remote}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: {NS}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'echo hello from web; trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n", busybox()),
    );
    p.until_extended(NS, WAIT).await;
    let provider_client = p.provider.client().await.unwrap();
    let origin: Api<ConfigMap> = Api::namespaced(p.origin.client().await.unwrap(), NS);
    let provider: Api<ConfigMap> = Api::namespaced(provider_client.clone(), TWIN);
    let writes = ProviderWrites::watch(provider_client, TWIN);
    churn::create(&origin, OBJECTS).await;
    churn::converged(&provider, OBJECTS, 0, WAIT).await;
    let (web_uid, _) = p
        .eventually(WAIT, "web Running on the provider", || {
            provider_web(&p).filter(|(_, phase)| phase == "Running")
        })
        .await;
    for lease in [TENANT_LEASE, CONTROLLER_LEASE] {
        p.eventually(WAIT, &format!("{lease} held by remote-a"), || {
            (holder(&p, lease) == "remote-a").then_some(())
        })
        .await;
    }
    let mut churn = Churn {
        origin,
        provider,
        writes,
        round: 0,
    };

    // 1. The serving replica dies; a provider pod is deleted while no replica keeps them.
    let started = churn.begin().await;
    let dying = replicas[0].agent.take().unwrap();
    refract_e2e::run_ok("kill", &["-KILL", &dying.pid().unwrap().to_string()]);
    drop(dying);
    let killed = Instant::now();
    kubectl(
        &p.provider,
        &["-n", TWIN, "delete", "pod", "web", "--wait=false"],
    );
    until_disconnected(&p).await;
    let takeover = until_connected(&p, killed).await;
    churn.end("remote-a SIGKILLed", started).await;
    println!("remote-a SIGKILLed: the tenant's stream open again on remote-b {takeover:.1?} after the kill (Lease duration 15 s)");
    assert_eq!(holder(&p, TENANT_LEASE), "remote-b");
    p.eventually(WAIT, "remote-b running the work that spans tenants", || {
        (holder(&p, CONTROLLER_LEASE) == "remote-b").then_some(())
    })
    .await;
    let (new_uid, _) = p
        .eventually(WAIT, "web re-created on the provider by remote-b", || {
            provider_web(&p).filter(|(uid, phase)| *uid != web_uid && phase == "Running")
        })
        .await;
    println!("remote-a SIGKILLed: the provider pod deleted meanwhile was re-created ({web_uid} -> {new_uid})");
    let logs = kubectl(&p.origin, &["-n", NS, "logs", "web"]);
    assert!(logs.contains("hello from web"), "{logs}");
    let exec = kubectl(
        &p.origin,
        &["-n", NS, "exec", "web", "--", "echo", "exec-ok"],
    );
    assert_eq!(exec.trim(), "exec-ok");

    // 2. remote-a is back (a restarted container keeps its pod's name); remote-b is stopped and
    // hands the tenant over at once.
    replicas[0].start(&p);
    let started = churn.begin().await;
    let stopping = replicas[1].agent.take().unwrap();
    let stopped = Instant::now();
    let log = stopping.log.clone();
    stopping.stop().await;
    let said = std::fs::read_to_string(log).unwrap_or_default();
    assert!(said.contains("stopping: released the tenant"), "{said}");
    let handback = until_connected(&p, stopped).await;
    churn.end("remote-b stopped (SIGTERM)", started).await;
    println!(
        "remote-b stopped: the tenant's stream open again on remote-a {handback:.1?} after SIGTERM"
    );
    assert_eq!(holder(&p, TENANT_LEASE), "remote-a");
    assert!(
        handback < Duration::from_secs(10),
        "a released tenant is taken at once, not after its Lease lapses: {handback:?}"
    );

    // 3. The tenant's connection reaches the replica not serving it: that one asks for the
    // tenant, and the holder hands it over and forgets what it kept of it.
    replicas[1].start(&p);
    let direct = replicas[1].listen.clone();
    let started = churn.begin().await;
    p.local.take().unwrap().stop().await;
    p.local_dial = Some(direct);
    let restarted = Instant::now();
    p.start_local();
    let moved = until_connected(&p, restarted).await;
    churn
        .end("the tenant reconnects to remote-b", started)
        .await;
    println!(
        "the tenant reconnects to remote-b: served there {moved:.1?} after the local agent started"
    );
    assert_eq!(holder(&p, TENANT_LEASE), "remote-b");
    assert!(
        replicas[0].log().contains("handed the tenant over"),
        "{}",
        replicas[0].log()
    );
    // A copy edited on the provider is restored by the replica serving the tenant (from what
    // the tenant sent it), and by no other from an older view.
    origin_patch(&p, "cm-0000", "sent-to-remote-b");
    p.eventually(WAIT, "cm-0000 written by remote-b", || {
        (provider_round(&p, "cm-0000")? == "sent-to-remote-b").then_some(())
    })
    .await;
    let edited = Instant::now();
    kubectl(
        &p.provider,
        &[
            "-n",
            TWIN,
            "patch",
            "configmap",
            "cm-0000",
            "--type=merge",
            "-p",
            r#"{"data":{"round":"edited"}}"#,
        ],
    );
    p.eventually(WAIT, "the edited copy restored", || {
        (provider_round(&p, "cm-0000")? == "sent-to-remote-b").then_some(())
    })
    .await;
    println!(
        "a copy edited on the provider: restored by remote-b {:.1?} later",
        edited.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        provider_round(&p, "cm-0000").as_deref(),
        Some("sent-to-remote-b"),
        "a replica that handed the tenant over wrote its older view back"
    );
    drop(service);
}
