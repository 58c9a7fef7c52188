//! The benchmark's baselines: the design Refract avoids, kept as the reference harness.
//!
//! It watches one origin namespace and server-side applies the same mutated objects (Refract's
//! own forge) straight into the provider with a provider kubeconfig: no gRPC hop, no remote
//! agent, no desired-state hash, `--concurrency` workers per kind, no client-side rate limit.
//! That bare copier is a floor: it watches nothing on the provider, takes over foreign objects
//! and rewrites everything on a restart. With `--guarded` it does what a trusted single-process
//! reflector needs to offer Refract's guarantees (see [`guard`]): the Liqo-shaped baseline.
//! It prints `synced <n>` once everything listed at start-up has been applied, so a benchmark
//! can time a restart.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
mod guard;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use refract_core::forge::{self, Context, Decision};
use refract_core::options::{Kind, ReflectionOptions};
use refract_local_agent::reflect::queue::WorkQueue;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub(crate) const FIELD_MANAGER: &str = "refract-direct-copier";

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

/// Copies an origin namespace's ConfigMaps and Services into a provider namespace directly.
#[derive(Debug, clap::Parser)]
#[command(name = "direct-copier", version)]
struct Args {
    /// Kubeconfig of the origin cluster.
    #[arg(long)]
    origin_kubeconfig: PathBuf,
    /// Kubeconfig of the provider cluster (the credential Refract keeps out of the origin).
    #[arg(long)]
    provider_kubeconfig: PathBuf,
    /// The origin namespace to copy.
    #[arg(long)]
    namespace: String,
    /// The provider namespace to write into (must exist).
    #[arg(long)]
    remote_namespace: String,
    /// The origin cluster id (for the origin/destination labels).
    #[arg(long, default_value = "origin")]
    cluster_id: String,
    /// The provider cluster id.
    #[arg(long, default_value = "provider")]
    remote_cluster_id: String,
    /// Concurrent writers per kind.
    #[arg(long, default_value_t = 3)]
    concurrency: usize,
    /// Watch the copies' metadata on the provider, restore drift, skip unchanged hashes, never
    /// take over a foreign object, and read back only resourceVersions (the Liqo-shaped
    /// baseline).
    #[arg(long)]
    guarded: bool,
    /// The async runtime, as the agents take it.
    #[command(flatten)]
    runtime: refract_shared::runtime::RuntimeArgs,
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let runtime = args.runtime.clone();
    runtime.run(copy(args))
}

async fn copy(args: Args) -> anyhow::Result<()> {
    let origin = client(&args.origin_kubeconfig).await?;
    let provider = client(&args.provider_kubeconfig).await?;
    let options = Arc::new(ReflectionOptions::new(
        &args.cluster_id,
        &args.remote_cluster_id,
    ));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (cm_queue, svc_queue) = (WorkQueue::new(), WorkQueue::new());
    let copier = |kind, queue| Copier {
        kind,
        origin: origin.clone(),
        provider: provider.clone(),
        namespace: args.namespace.clone(),
        remote_namespace: args.remote_namespace.clone(),
        options: options.clone(),
        concurrency: args.concurrency,
        queue,
        in_flight: in_flight.clone(),
        guard: args.guarded.then(guard::Guard::default),
    };
    let (cm_listed, svc_listed) = (
        tokio::sync::oneshot::channel::<usize>(),
        tokio::sync::oneshot::channel::<usize>(),
    );
    let cms = tokio::spawn(copier(Kind::ConfigMap, cm_queue.clone()).run::<ConfigMap>(cm_listed.0));
    let svcs = tokio::spawn(copier(Kind::Service, svc_queue.clone()).run::<Service>(svc_listed.0));
    let listed = cm_listed.1.await? + svc_listed.1.await?;
    // Everything listed at start-up is queued by now: synced once nothing is queued or being
    // written, twice in a row (a worker may be between taking a key and counting it).
    let idle =
        || cm_queue.is_empty() && svc_queue.is_empty() && in_flight.load(Ordering::SeqCst) == 0;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if idle() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            if idle() {
                break;
            }
        }
    }
    println!("synced {listed}");
    tokio::select! {
        r = cms => r??,
        r = svcs => r??,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

async fn client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

struct Copier {
    kind: Kind,
    origin: kube::Client,
    provider: kube::Client,
    namespace: String,
    remote_namespace: String,
    options: Arc<ReflectionOptions>,
    concurrency: usize,
    queue: WorkQueue<String>,
    /// Keys being written, over every kind.
    in_flight: Arc<AtomicUsize>,
    /// With `--guarded`, the copies this kind's copier owns.
    guard: Option<guard::Guard>,
}

impl Copier {
    async fn run<K>(self, listed: tokio::sync::oneshot::Sender<usize>) -> anyhow::Result<()>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + forge::Forgeable
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let this = Arc::new(self);
        if let Some(guard) = &this.guard {
            // Every copy already on the provider is known before the first origin object is.
            let copies: Api<PartialObjectMeta<K>> =
                Api::namespaced(this.provider.clone(), &this.remote_namespace);
            guard
                .watch(copies, &this.options.local_cluster_id, this.queue.clone())
                .await?;
        }
        let (store, writer) = reflector::store::<K>();
        for _ in 0..this.concurrency.max(1) {
            let (this, store) = (this.clone(), store.clone());
            tokio::spawn(async move {
                loop {
                    let name = this.queue.next().await;
                    this.in_flight.fetch_add(1, Ordering::SeqCst);
                    if let Err(error) = this.copy(&store, &name).await {
                        eprintln!("failed to copy {} {}: {error}", this.kind.kind(), *name);
                        // Queued again once this claim ends.
                        this.queue.add(name.clone());
                    }
                    this.in_flight.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
        let mut listed = Some(listed);
        let mut initial = 0;
        let api: Api<K> = Api::namespaced(this.origin.clone(), &this.namespace);
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .boxed();
        while let Some(event) = events.next().await {
            let obj = match event {
                Ok(watcher::Event::InitDone) => {
                    // Copies whose origin is gone while the copier was away are deleted.
                    for name in this.guard.iter().flat_map(guard::Guard::names) {
                        this.queue.add(name);
                    }
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(initial);
                    }
                    continue;
                }
                Ok(watcher::Event::InitApply(obj)) => {
                    initial += 1;
                    obj
                }
                Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => obj,
                Ok(watcher::Event::Init) | Err(_) => continue,
            };
            this.queue.add(obj.name_any());
        }
        Ok(())
    }

    async fn copy<K>(&self, store: &Store<K>, name: &str) -> anyhow::Result<()>
    where
        K: Resource<DynamicType = ()> + forge::Forgeable + Clone + Serialize,
    {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.provider.clone(),
            &self.remote_namespace,
            &ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "",
                "v1",
                self.kind.kind(),
            )),
        );
        let origin = store.get(&ObjectRef::new(name).within(&self.namespace));
        let ctx = Context {
            options: &self.options,
            remote_namespace: &self.remote_namespace,
            service: None,
            nodes: &forge::NO_NODES,
        };
        if let Some(guard) = &self.guard {
            let desired = match origin.map(|obj| obj.forge(&ctx)).transpose()? {
                Some(Decision::Reflect(desired)) => Some(desired.object),
                Some(Decision::Skip { .. }) | None => None,
            };
            return guard.copy(&api, name, desired).await;
        }
        let Some(obj) = origin else {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        };
        // The same typed forge the local agent calls, so both pay the same for the rules.
        match obj.forge(&ctx)? {
            Decision::Reflect(desired) => {
                api.patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&desired.object),
                )
                .await?;
            }
            Decision::Skip { .. } => {
                let _ = api.delete(name, &DeleteParams::default()).await;
            }
        }
        Ok(())
    }
}
