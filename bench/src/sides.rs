//! The two systems under test, behind one interface: where their origin namespace is, which
//! processes are theirs, and how to restart their origin side.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{Api, PostParams};
use refract_e2e::{kubectl_stdin, Agent, Peering};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use refract_bench::procfs::Usage;
use refract_e2e::metric as counter;

use crate::measure::ProviderWatch;
use crate::say;

/// What the phases need of a system.
pub trait Side {
    /// The origin cluster.
    fn origin(&self) -> &kube::Client;
    /// The origin namespace the system reflects.
    fn origin_ns(&self) -> &str;
    /// The watch of the provider namespace it writes.
    fn watch(&self) -> &ProviderWatch;
    /// Its processes: (name, pid).
    fn processes(&self) -> Vec<(String, u32)>;
    /// Restarts its origin side and returns once it agrees with the provider on `objects`
    /// objects again.
    async fn restart(&mut self, objects: usize) -> anyhow::Result<()>;
    /// Stops its processes (between its turns in the latency rounds).
    async fn pause(&mut self);
    /// Starts its processes again and returns once they agree with the provider on every
    /// object of its origin namespace.
    async fn resume(&mut self) -> anyhow::Result<()>;
    /// CPU seconds its processes have used so far.
    fn cpu_seconds(&self) -> f64 {
        self.processes()
            .into_iter()
            .map(|(_, pid)| refract_bench::procfs::cpu_seconds(pid))
            .sum()
    }
    /// CPU and wake-ups each of its processes has used so far.
    fn usage_by_process(&self) -> Vec<(String, Usage)> {
        self.processes()
            .into_iter()
            .map(|(name, pid)| (name, Usage::of(pid)))
            .collect()
    }
}

/// Local agent series: Upserts a resuming local agent answered itself (the provider held them
/// unchanged), and buckets it has not compared yet.
const LOCALLY_ANSWERED: &str = "refract_local_resume_skipped_objects_total";
const PENDING_BUCKETS: &str = "refract_local_resume_pending_buckets";

/// Waits until Refract's agents agree on `answers` objects: answered by the remote agent at
/// `remote` (`series`, counted above `remote_before`) or by the resuming local agent at
/// `local` itself, with no bucket left to compare.
async fn until_agreed(
    (remote, series, remote_before): (&str, &[&str], f64),
    local: &str,
    answers: f64,
    what: &str,
) -> anyhow::Result<()> {
    for _ in 0..60_000 {
        let mut by_remote = -remote_before;
        for s in series {
            by_remote += counter(remote, s).await;
        }
        let answered = by_remote + counter(local, LOCALLY_ANSWERED).await;
        if answered >= answers && counter(local, PENDING_BUCKETS).await == 0.0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("{what}")
}

/// ConfigMaps plus Services in `ns`: what a system reflects of the benchmark's namespace.
async fn count_objects(client: &kube::Client, ns: &str) -> anyhow::Result<usize> {
    let lp = kube::api::ListParams::default();
    let cms = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list_metadata(&lp)
        .await?;
    let svcs = Api::<Service>::namespaced(client.clone(), ns)
        .list_metadata(&lp)
        .await?;
    Ok(cms.items.len() + svcs.items.len())
}

pub async fn create_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("failed to create namespace {name}"))?;
    Ok(())
}

/// Refract: the two agent binaries of a [`Peering`].
pub struct Refract<'a> {
    peering: &'a mut Peering,
    origin: kube::Client,
    provider: kube::Client,
    watch: ProviderWatch,
}

const REFRACT_NS: &str = "bench-refract";
const REFRACT_REMOTE_NS: &str = "bench-refract-origin";
const UNCHANGED_ACKS: &str = "refract_remote_acks_total{tenant=\"origin\",outcome=\"unchanged\"}";
const APPLIED_ACKS: &str = "refract_remote_acks_total{tenant=\"origin\",outcome=\"applied\"}";

impl<'a> Refract<'a> {
    /// Extends the benchmark namespace to the provider and watches its twin.
    pub async fn new(peering: &'a mut Peering) -> anyhow::Result<Self> {
        let origin = peering.origin.client().await?;
        let provider = peering.provider.client().await?;
        kubectl_stdin(
            &peering.origin,
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {REFRACT_NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {REFRACT_NS}}}\nspec: {{}}\n"),
        );
        let namespaces: Api<Namespace> = Api::all(provider.clone());
        for _ in 0..300 {
            if namespaces.get_opt(REFRACT_REMOTE_NS).await?.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let watch = ProviderWatch::start(provider.clone(), REFRACT_REMOTE_NS).await;
        // Let the reflectors see the extension before loading.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(Self {
            peering,
            origin,
            provider,
            watch,
        })
    }

    /// Stops both agents and deletes what they reflected on both sides, so the next system
    /// starts from the same clusters.
    pub async fn clean_up(&mut self) -> anyhow::Result<()> {
        self.pause().await;
        crate::load::delete_all(&self.origin, REFRACT_NS).await?;
        crate::load::delete_all(&self.provider, REFRACT_REMOTE_NS).await?;
        Ok(())
    }

    /// The peering, for what else runs on its clusters.
    pub fn peering(&self) -> &Peering {
        self.peering
    }
}

impl Side for Refract<'_> {
    fn origin(&self) -> &kube::Client {
        &self.origin
    }
    fn origin_ns(&self) -> &str {
        REFRACT_NS
    }
    fn watch(&self) -> &ProviderWatch {
        &self.watch
    }
    fn processes(&self) -> Vec<(String, u32)> {
        let pid = |a: &Option<Agent>| a.as_ref().and_then(Agent::pid);
        [
            ("local-agent", pid(&self.peering.local)),
            ("remote-agent", pid(&self.peering.remote)),
        ]
        .into_iter()
        .filter_map(|(n, p)| p.map(|p| (n.to_string(), p)))
        .collect()
    }
    async fn restart(&mut self, objects: usize) -> anyhow::Result<()> {
        let admin = self.peering.remote_admin.clone();
        let before = counter(&admin, UNCHANGED_ACKS).await;
        if let Some(local) = self.peering.local.take() {
            local.stop().await;
        }
        self.peering.start_local();
        // In agreement once every object is confirmed unchanged: by the remote agent, or by the
        // local agent itself when the provider's description matched.
        until_agreed(
            (&admin, &[UNCHANGED_ACKS], before),
            &self.peering.local_admin,
            objects as f64,
            &format!("the restarted local agent did not re-confirm {objects} objects"),
        )
        .await
    }
    async fn pause(&mut self) {
        for agent in [self.peering.local.take(), self.peering.remote.take()]
            .into_iter()
            .flatten()
        {
            agent.stop().await;
        }
    }
    async fn resume(&mut self) -> anyhow::Result<()> {
        let objects = count_objects(&self.origin, REFRACT_NS).await?;
        self.peering.start_remote();
        self.peering.start_local();
        // Fresh agents count from zero: in agreement once every object of the namespace and the
        // twin namespace itself is answered for (unchanged, or applied if it differed), by the
        // remote agent or, where the provider's description matched, by the local agent.
        until_agreed(
            (
                &self.peering.remote_admin,
                &[UNCHANGED_ACKS, APPLIED_ACKS],
                0.0,
            ),
            &self.peering.local_admin,
            (objects + 1) as f64,
            &format!("the restarted agents did not confirm the namespace's {objects} objects"),
        )
        .await
    }
}

/// Which of the direct copier's shapes runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copier {
    /// The bare copier: a floor that keeps none of Refract's guarantees.
    Bare,
    /// `--guarded`: the Liqo-shaped baseline (provider metadata watch, drift restore, hash
    /// skip, no takeover of foreign objects).
    Guarded,
}

impl Copier {
    /// The system's name in the results.
    pub fn system(self) -> &'static str {
        match self {
            Copier::Bare => "direct",
            Copier::Guarded => "guarded",
        }
    }

    /// Its origin namespace and the provider namespace it writes.
    fn namespaces(self) -> (&'static str, &'static str) {
        match self {
            Copier::Bare => ("bench-direct", "bench-direct-origin"),
            Copier::Guarded => ("bench-guarded", "bench-guarded-origin"),
        }
    }

    /// Its process, as the tables name it.
    fn process(self) -> &'static str {
        match self {
            Copier::Bare => "direct-copier",
            Copier::Guarded => "guarded-copier",
        }
    }
}

/// A direct copier process.
pub struct Direct {
    shape: Copier,
    args: Vec<String>,
    child: Option<Child>,
    origin: kube::Client,
    provider: kube::Client,
    watch: ProviderWatch,
}

impl Direct {
    /// The system's name in the results.
    pub fn system(&self) -> &'static str {
        self.shape.system()
    }

    /// Creates its namespaces and starts it.
    pub async fn new(
        shape: Copier,
        peering: &Peering,
        concurrency: usize,
        worker_threads: u16,
    ) -> anyhow::Result<Self> {
        let origin = peering.origin.client().await?;
        let provider = peering.provider.client().await?;
        let (ns, remote_ns) = shape.namespaces();
        create_namespace(&origin, ns).await?;
        create_namespace(&provider, remote_ns).await?;
        let watch = ProviderWatch::start(provider.clone(), remote_ns).await;
        let mut args = vec![
            format!(
                "--origin-kubeconfig={}",
                peering.origin.kubeconfig.display()
            ),
            format!(
                "--provider-kubeconfig={}",
                peering.provider.kubeconfig.display()
            ),
            format!("--namespace={ns}"),
            format!("--remote-namespace={remote_ns}"),
            // Its own origin label: the remote agent counts every object labelled with
            // Refract's origin id against that tenant's quota, the copiers' too otherwise.
            format!("--cluster-id={}", shape.system()),
            format!("--concurrency={concurrency}"),
            format!("--worker-threads={worker_threads}"),
        ];
        if shape == Copier::Guarded {
            args.push("--guarded".into());
        }
        let mut d = Self {
            shape,
            args,
            child: None,
            origin,
            provider,
            watch,
        };
        d.start().await?;
        Ok(d)
    }

    /// Starts the copier and waits until it has applied what it listed.
    async fn start(&mut self) -> anyhow::Result<()> {
        let mut child = Command::new(refract_e2e::bin("direct-copier"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("failed to start direct-copier")?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next_line().await? {
                Some(l) if l.starts_with("synced") => break,
                Some(_) => {}
                None => anyhow::bail!("direct-copier exited before it synced"),
            }
        }
        self.child = Some(child);
        Ok(())
    }

    /// Stops the copier and deletes what it copied on both sides, so the latency rounds
    /// start from the same clusters for both systems.
    pub async fn clean_up(&mut self) -> anyhow::Result<()> {
        self.pause().await;
        let (ns, remote_ns) = self.shape.namespaces();
        crate::load::delete_all(&self.origin, ns).await?;
        crate::load::delete_all(&self.provider, remote_ns).await?;
        Ok(())
    }
}

impl Side for Direct {
    fn origin(&self) -> &kube::Client {
        &self.origin
    }
    fn origin_ns(&self) -> &str {
        self.shape.namespaces().0
    }
    fn watch(&self) -> &ProviderWatch {
        &self.watch
    }
    fn processes(&self) -> Vec<(String, u32)> {
        self.child
            .as_ref()
            .and_then(Child::id)
            .map(|p| vec![(self.shape.process().to_string(), p)])
            .unwrap_or_default()
    }
    async fn restart(&mut self, _objects: usize) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
        say(&format!("restarting {}", self.shape.process()));
        self.start().await
    }
    async fn pause(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
    async fn resume(&mut self) -> anyhow::Result<()> {
        // `synced` comes once it has applied everything it listed.
        self.start().await
    }
}
