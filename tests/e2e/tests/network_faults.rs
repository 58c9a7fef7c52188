//! Link faults with real network effects. The local agent runs in a network namespace this
//! test creates and reaches the remote agent over a veth pair; the faults are the kernel's:
//! iptables drops every packet (a cut without a reset, so both ends see a half-open
//! connection until keepalive notices) or a share of them, and a relay in the namespace adds
//! latency (this kernel lacks netem). Both agents are also killed with SIGKILL mid-burst.
//! The origin's API server keeps no watch cache and compacts etcd every second, so a local
//! agent cut off from it for 5 s resumes its watches at a revision that is gone: the API server
//! answers `410 Gone` and the agent must relist (objects deleted meanwhile included). Cut off
//! for 30 s, longer than deploy's leader election renew deadline, the agent must stop acting
//! and exit; started again, as its Deployment would, it must converge as well.
//!
//! During each fault 1,000 origin ConfigMaps change. Afterwards the provider must hold
//! exactly the origin's state (0 lost), no write on the provider may repeat what it already
//! held (0 duplicate writes), and the provider's pods must still be the same containers with
//! 0 restarts. The time to converge after each fault is printed.
//!
//! The 10-minute cut runs only with `REFRACT_LONG_FAULTS=1` (about 12 minutes more).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use refract_e2e::churn::{self, ProviderWrites};
use refract_e2e::{busybox, kubectl_get, kubectl_stdin, Agent, Peering, PROVIDER_POD_RANGE};
use refract_testkit::netns::{Delay, Gate, NetNs};
use refract_testkit::Options;

const OBJECTS: usize = 1000;
const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "churn";
const TWIN: &str = "churn-origin";
/// ConfigMaps deleted while the local agent cannot see the origin: half in the outage that
/// costs its leadership, half in the `410 Gone` scenario.
const DOOMED: usize = 10;
/// The local agent's HTTP/2 keepalive: a half-open link is found dead within their sum.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an object may take from the origin to the provider (p99) over a 200 ms RTT link
/// losing 5 % of its packets, 1,000 changed at once: the burst itself takes seconds to cross
/// such a link, and TCP's retransmissions add a few round trips to the unlucky ones.
const LOSSY_P99: Duration = Duration::from_secs(12);

/// How many times the local agent's log says its stream failed, and says it connected.
fn link_events(log: &str) -> (usize, usize) {
    let failed = log
        .lines()
        .filter(|l| l.contains("stream to the remote agent failed"))
        .count();
    let connected = log
        .lines()
        .filter(|l| l.contains("connected to remote agent"))
        .count();
    (failed, connected)
}

/// How many times the local agent's log says it relisted origin ConfigMaps.
fn configmap_relists(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("origin watch relisted") && l.contains("ConfigMap"))
        .count()
}

/// The last 60 lines of an agent's log above debug level: what a failure shows of it.
fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains("DEBUG")).collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// How many `doomed-*` ConfigMaps the provider holds.
fn doomed_on(p: &Peering) -> usize {
    kubectl_get(&p.provider, &["-n", TWIN, "configmaps", "-o", "name"])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("/doomed-"))
        .count()
}

struct Faults {
    p: Peering,
    netns: NetNs,
    delay: Delay,
    /// The local agent's way to the origin API server.
    origin_gate: Gate,
    origin: Api<ConfigMap>,
    provider: Api<ConfigMap>,
    writes: ProviderWrites,
    pods: String,
    round: u32,
    /// How many `doomed-*` ConfigMaps the origin still holds.
    doomed_left: usize,
}

impl Faults {
    async fn start() -> Self {
        let provider = Options::named("provider")
            .with_node(PROVIDER_POD_RANGE, &[])
            .unwrap();
        // No watch cache and a compaction every second: a watch resumed from a revision older
        // than the last compaction is answered 410 Gone. (The API server compacts to the
        // revision it saw one interval earlier, so a 5 s outage under churn is always past it,
        // and short of the leader election renew deadline.)
        let origin = Options::named("origin")
            .with_controllers()
            .with_apiserver_args(&["--watch-cache=false", "--etcd-compaction-interval=1s"]);
        let mut p = Peering::start_on(
            origin,
            provider,
            &[
                &format!("--keepalive-interval={}s", KEEPALIVE_INTERVAL.as_secs()),
                &format!("--keepalive-timeout={}s", KEEPALIVE_TIMEOUT.as_secs()),
            ],
            &[],
        )
        .await
        .unwrap();
        // Both agents move: the remote agent listens on the host end of the veth pair, the
        // local agent runs inside the namespace and dials it through the delay relay.
        let netns = NetNs::create("faults").unwrap();
        p.local.take().unwrap().stop().await;
        p.remote.take().unwrap().stop().await;
        let port = refract_e2e::free_port();
        p.remote_addr = format!("{}:{port}", netns.host_ip);
        p.start_remote();
        let origin_port: u16 = p.origin.server.rsplit(':').next().unwrap().parse().unwrap();
        let origin_gate = netns.bridge_loopback(origin_port).unwrap();
        let (relay, delay) = netns.delay_relay(p.remote_addr.parse().unwrap()).unwrap();
        p.local_netns = Some(netns.name.clone());
        p.local_dial = Some(format!("127.0.0.1:{relay}"));
        p.start_local();

        let origin_client = p.origin.client().await.unwrap();
        let provider_client = p.provider.client().await.unwrap();
        kubectl_stdin(
            &p.origin,
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{podOffloadingStrategy: Remote}}\n"),
        );
        p.until_extended(NS, WAIT).await;
        let writes = ProviderWrites::watch(provider_client.clone(), TWIN);
        let origin: Api<ConfigMap> = Api::namespaced(origin_client, NS);
        churn::create(&origin, OBJECTS).await;
        for i in 0..DOOMED {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("doomed-{i:02}")}, "data": {"doomed": "yes"}}))
            .unwrap();
            origin.create(&PostParams::default(), &cm).await.unwrap();
        }
        let image = busybox();
        for i in 0..3 {
            kubectl_stdin(&p.origin, &["apply", "-f", "-"], &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: sleeper-{i}, namespace: {NS}}}\nspec:\n  nodeName: refract-provider\n  tolerations: [{{key: virtual-node.liqo.io/not-allowed, operator: Exists}}, {{key: node.kubernetes.io/unreachable, operator: Exists}}, {{key: node.kubernetes.io/not-ready, operator: Exists}}]\n  containers: [{{name: c, image: \"{image}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n"));
        }
        let provider: Api<ConfigMap> = Api::namespaced(provider_client, TWIN);
        let took = churn::converged(&provider, OBJECTS, 0, WAIT).await;
        p.eventually(WAIT, "the doomed ConfigMaps on the provider", || {
            (doomed_on(&p) == DOOMED).then_some(())
        })
        .await;
        println!("setup: {OBJECTS} ConfigMaps reflected {took:.1?} after the last was created");
        let pods = p
            .eventually(WAIT, "three provider pods Running", || {
                let pods = churn::provider_pods(&p.provider, TWIN);
                (pods.lines().filter(|l| l.ends_with(" 0 Running")).count() == 3).then_some(pods)
            })
            .await;
        Self {
            p,
            netns,
            delay,
            origin_gate,
            origin,
            provider,
            writes,
            pods,
            round: 0,
            doomed_left: DOOMED,
        }
    }

    /// Runs one scenario: churn with `fault` applied while it runs for `hold`, then heal and
    /// converge (or, for a fault the link lives with, converge first and heal after).
    /// `REFRACT_FAULTS=cut,SIGKILL` runs only the scenarios whose names contain one of the words.
    async fn scenario(&mut self, s: Scenario<'_>) {
        if let Ok(only) = std::env::var("REFRACT_FAULTS") {
            if !only.split(',').any(|word| s.name.contains(word.trim())) {
                return;
            }
        }
        self.round += 1;
        let round = self.round;
        let writes_before = self.writes.count();
        let churn_started = Instant::now();
        let origin = self.origin.clone();
        let churning = tokio::spawn(async move { churn::churn(&origin, OBJECTS, round).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (failed_before, connected_before) = link_events(&self.p.local_log());
        let relists_before = configmap_relists(&self.p.local_log());
        self.begin(s.fault).await;
        let cut_at = Instant::now();
        // A cut held past the keepalive: the local agent must find the link dead by keepalive
        // (no reset ever comes), within its interval and timeout.
        let half_open = matches!(s.fault, Fault::Cut)
            && s.hold > KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT + Duration::from_secs(5);
        let detect = async {
            if !half_open {
                return None;
            }
            let within = KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT + Duration::from_secs(3);
            while cut_at.elapsed() < within {
                if link_events(&self.p.local_log()).0 > failed_before {
                    return Some(cut_at.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Some(within)
        };
        let (churned, (), detected) = tokio::join!(churning, tokio::time::sleep(s.hold), detect);
        let accepted = churned.unwrap();
        if let Some(detected) = detected {
            println!("{}: the local agent found the link dead {detected:.1?} after the cut (keepalive {KEEPALIVE_INTERVAL:?} + {KEEPALIVE_TIMEOUT:?})", s.name);
            assert!(
                detected < KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT + Duration::from_secs(3),
                "{}: keepalive did not find the half-open link dead",
                s.name
            );
        }
        let during = self.writes.count() - writes_before;
        let (took, since) = if s.converge_under_fault {
            let took = self.until_converged(s.name, round, false).await;
            self.heal().await;
            (took, "the churn ended, under the fault")
        } else {
            self.heal().await;
            if let Fault::OriginOutage = s.fault {
                self.start_again_after_stepping_down(s.name).await;
            }
            let paused_past_lease = matches!(s.fault, Fault::FreezeLocalAgent);
            (
                self.until_converged(s.name, round, paused_past_lease).await,
                "healing",
            )
        };
        let (writes, duplicates) = self.writes.settled(writes_before).await;
        let pods = churn::provider_pods(&self.p.provider, TWIN);
        println!(
            "{}: {OBJECTS} objects changed; {during} reached the provider during the fault; converged {took:.1?} after {since} ({:.1?} after the churn began); provider writes {}, duplicate writes {}, lost 0; pods unchanged: {}",
            s.name,
            churn_started.elapsed() - Duration::from_secs(2),
            writes,
            duplicates.len(),
            pods == self.pods,
        );
        assert!(
            duplicates.is_empty(),
            "{}: writes that changed nothing: {:?}",
            s.name,
            duplicates
        );
        assert_eq!(
            writes, OBJECTS as u64,
            "{}: one write per changed object",
            s.name
        );
        if s.cuts_writes {
            assert!(
                during < OBJECTS as u64,
                "{}: the fault let every write through",
                s.name
            );
        }
        assert_eq!(
            pods, self.pods,
            "{}: the provider pods changed or restarted",
            s.name
        );
        let p99 = self.writes.p99(&accepted, round);
        println!("{}: origin write to provider write, p99 {p99:.1?}", s.name);
        if let Fault::SlowAndLossy = s.fault {
            let (failed_after, _) = link_events(&self.p.local_log());
            println!(
                "{}: the link failed {} time(s) under the fault",
                s.name,
                failed_after - failed_before
            );
            assert!(
                p99 <= LOSSY_P99,
                "{}: p99 {p99:?} from origin write to provider write, above {LOSSY_P99:?}",
                s.name
            );
            assert_eq!(
                failed_after, failed_before,
                "{}: a slow, lossy link must not be given up for dead",
                s.name
            );
        }
        if half_open {
            let (_, connected_after) = link_events(&self.p.local_log());
            assert!(
                connected_after > connected_before,
                "{}: the link converged without a new session: the half-open one lived on",
                s.name
            );
        }
        match s.fault {
            Fault::OriginWatchGone => {
                self.relisted_without_losing_deletes(s.name, relists_before)
                    .await
            }
            Fault::OriginOutage => self.deleted_while_away(s.name).await,
            _ => {}
        }
    }

    /// Waits until every provider copy holds `round`; after `WAIT`, fails with the end of
    /// both agents' logs. `paused_past_lease`: the local agent was paused longer than its
    /// Lease lasts, so it either renews the Lease (nobody took it) and goes on, or, when its
    /// last look cannot tell in time, steps down and exits, as a paused leader must; then it is
    /// started again, as its Deployment's kubelet would.
    async fn until_converged(
        &mut self,
        name: &str,
        round: u32,
        paused_past_lease: bool,
    ) -> Duration {
        let started = Instant::now();
        let mut stepped_down = false;
        loop {
            let behind = churn::behind(&self.provider, OBJECTS, round).await;
            if behind == 0 {
                if paused_past_lease && !stepped_down {
                    println!(
                        "{name}: the local agent renewed its Lease after the pause and went on"
                    );
                }
                return started.elapsed();
            }
            let exited = self.p.local.as_mut().and_then(Agent::exited).is_some();
            if paused_past_lease && exited && !stepped_down {
                stepped_down = true;
                self.start_again_after_stepping_down(name).await;
            }
            assert!(
                started.elapsed() < WAIT,
                "{name}: {behind} provider copies still lack round {round} after {WAIT:?}\n--- remote agent ---\n{}\n--- local agent ---\n{}",
                log_tail(&self.p.remote_log()),
                log_tail(&self.p.local_log()),
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// After an origin outage past the renew deadline: the local agent stopped acting and
    /// exited non-zero on its own, saying why; it is started again, as its Deployment's
    /// kubelet would.
    async fn start_again_after_stepping_down(&mut self, name: &str) {
        let mut agent = self.p.local.take().expect("the local agent");
        let status = self
            .p
            .eventually(Duration::from_secs(30), "the local agent to exit", || {
                agent.exited()
            })
            .await;
        let log = agent.log_text();
        assert!(
            !status.success(),
            "{name}: the agent exited with {status}, not as a failure its Deployment restarts"
        );
        assert!(
            log.contains("lost the leadership Lease"),
            "{name}: the agent exited, but not for its Lease:\n{}",
            log.lines()
                .skip(log.lines().count().saturating_sub(40))
                .collect::<Vec<_>>()
                .join("\n")
        );
        println!("{name}: the local agent could not renew its Lease, stopped acting and exited ({status}); started again");
        self.p.start_local();
    }

    /// The ConfigMaps deleted while no local agent ran are gone from the provider too.
    async fn deleted_while_away(&self, name: &str) {
        let started = Instant::now();
        self.until_doomed_gone().await;
        println!(
            "{name}: the ConfigMaps deleted while no agent acted were gone from the provider {:.1?} later",
            started.elapsed()
        );
    }

    async fn until_doomed_gone(&self) {
        let left = self.doomed_left;
        self.p
            .eventually(
                WAIT,
                "the doomed ConfigMaps deleted on the provider",
                || (doomed_on(&self.p) == left).then_some(()),
            )
            .await;
    }

    /// Deletes `n` more `doomed-*` ConfigMaps on the origin.
    async fn delete_doomed(&mut self, n: usize) {
        for i in DOOMED - self.doomed_left..DOOMED - self.doomed_left + n {
            self.origin
                .delete(&format!("doomed-{i:02}"), &Default::default())
                .await
                .expect("origin delete");
        }
        self.doomed_left -= n;
    }

    /// After `410 Gone`: the agent said it relisted, and the ConfigMaps deleted while it was
    /// cut off are gone from the provider too.
    async fn relisted_without_losing_deletes(&self, name: &str, relists_before: usize) {
        let relists = configmap_relists(&self.p.local_log()) - relists_before;
        assert!(
            relists > 0,
            "{name}: the local agent never relisted ConfigMaps: the API server did not answer 410 Gone"
        );
        let started = Instant::now();
        self.until_doomed_gone().await;
        println!(
            "{name}: the local agent relisted ConfigMaps {relists} time(s); the ConfigMaps deleted while it was cut off were gone from the provider {:.1?} later",
            started.elapsed()
        );
    }

    async fn begin(&mut self, fault: Fault) {
        match fault {
            Fault::Cut => self.netns.cut().unwrap(),
            Fault::SlowAndLossy => {
                self.delay.set(Duration::from_millis(100));
                self.netns.lose(5).unwrap();
            }
            Fault::KillBothAgents => {
                for agent in [self.p.local.take(), self.p.remote.take()]
                    .into_iter()
                    .flatten()
                {
                    let pid = agent.pid().unwrap().to_string();
                    refract_e2e::run_ok("kill", &["-KILL", &pid]);
                    drop(agent);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.p.start_remote();
                self.p.start_local();
            }
            Fault::FreezeProviderApiServer => self.signal_provider_api_server("-STOP"),
            Fault::FreezeLocalAgent => self.signal_local_agent("-STOP"),
            Fault::OriginWatchGone | Fault::OriginOutage => {
                self.origin_gate.close();
                self.delete_doomed(DOOMED / 2).await;
            }
        }
    }

    fn signal_local_agent(&self, signal: &str) {
        if let Some(pid) = self.p.local.as_ref().and_then(|a| a.pid()) {
            refract_e2e::run_ok("kill", &[signal, &pid.to_string()]);
        }
    }

    async fn heal(&mut self) {
        self.origin_gate.open();
        self.netns.heal().unwrap();
        self.delay.set(Duration::ZERO);
        self.signal_provider_api_server("-CONT");
        self.signal_local_agent("-CONT");
    }

    fn signal_provider_api_server(&self, signal: &str) {
        for (name, pid) in self.p.provider.processes() {
            if name == "kube-apiserver" {
                refract_e2e::run_ok("kill", &[signal, &pid.to_string()]);
            }
        }
    }
}

/// What goes wrong.
#[derive(Clone, Copy)]
enum Fault {
    /// Every packet between the agents dropped, without a reset.
    Cut,
    /// 100 ms added each way and 5% of the packets dropped.
    SlowAndLossy,
    /// Both agents killed with SIGKILL and started again a second later.
    KillBothAgents,
    /// The provider's API server stopped with SIGSTOP: connections to it hang.
    FreezeProviderApiServer,
    /// The local agent stopped with SIGSTOP while the origin changes: its watches fall behind
    /// and its link goes quiet, then it resumes where it was.
    FreezeLocalAgent,
    /// The local agent's connections to the origin API server end and new ones are refused
    /// while the origin changes and compacts: its watches resume at a compacted revision, are
    /// answered 410 Gone, and must relist.
    OriginWatchGone,
    /// As `OriginWatchGone`, held past the renew deadline: the agent cannot renew its Lease,
    /// so it must stop acting and exit (a standby may lead by then), and it is started again.
    OriginOutage,
}

/// One fault, how long it holds at least, and what must hold of it.
struct Scenario<'a> {
    name: &'a str,
    fault: Fault,
    hold: Duration,
    /// Whether the provider must catch up while the fault is still on.
    converge_under_fault: bool,
    /// Whether the fault keeps writes from the provider (checked: not all got through).
    cuts_writes: bool,
}

fn cut_for(name: &str, hold: Duration) -> Scenario<'_> {
    Scenario {
        name,
        fault: Fault::Cut,
        hold,
        converge_under_fault: false,
        cuts_writes: true,
    }
}

#[tokio::test]
async fn the_provider_converges_without_loss_or_duplicate_writes_through_real_link_faults() {
    let mut f = Faults::start().await;
    f.scenario(cut_for("cut 5s", Duration::from_secs(5))).await;
    f.scenario(cut_for("cut 60s (half-open)", Duration::from_secs(60)))
        .await;
    f.scenario(Scenario {
        name: "200ms RTT, 5% loss",
        fault: Fault::SlowAndLossy,
        hold: Duration::ZERO,
        converge_under_fault: true,
        cuts_writes: false,
    })
    .await;
    f.scenario(Scenario {
        name: "both agents SIGKILLed mid-burst",
        fault: Fault::KillBothAgents,
        hold: Duration::ZERO,
        converge_under_fault: false,
        cuts_writes: false,
    })
    .await;
    f.scenario(Scenario {
        name: "provider API server frozen (SIGSTOP) 2min",
        fault: Fault::FreezeProviderApiServer,
        hold: Duration::from_secs(120),
        converge_under_fault: false,
        cuts_writes: true,
    })
    .await;
    f.scenario(Scenario {
        name: "local agent frozen (SIGSTOP) 20s",
        fault: Fault::FreezeLocalAgent,
        hold: Duration::from_secs(20),
        converge_under_fault: false,
        cuts_writes: true,
    })
    .await;
    f.scenario(Scenario {
        name: "origin API server out of reach 30s (past the Lease renew deadline)",
        fault: Fault::OriginOutage,
        hold: Duration::from_secs(30),
        converge_under_fault: false,
        cuts_writes: true,
    })
    .await;
    f.scenario(Scenario {
        name: "origin watch answered 410 Gone (API server out of reach 5s, etcd compacted)",
        fault: Fault::OriginWatchGone,
        hold: Duration::from_secs(5),
        converge_under_fault: false,
        cuts_writes: true,
    })
    .await;
    if std::env::var_os("REFRACT_LONG_FAULTS").is_some() {
        f.scenario(cut_for("cut 10min", Duration::from_secs(600)))
            .await;
    }
}
