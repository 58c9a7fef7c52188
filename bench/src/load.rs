//! What the benchmark does to the origin: bursts of ConfigMaps, updates, no-op touches, and
//! objects created at a steady rate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

/// Origin requests in flight while loading.
const WRITERS: usize = 32;
/// Label on burst objects: which burst.
pub const BURST_LABEL: &str = "bench.refract.io/burst";
/// An annotation Refract never reflects: changing it is not an effective change.
const SKIPPED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn config_map(name: &str, bytes: usize, burst: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(BURST_LABEL.into(), burst_label(burst))])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("payload".into(), "x".repeat(bytes))])),
        ..Default::default()
    }
}

fn service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".into(), name.into())])),
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A burst's label value: its name prefix without the trailing dash.
fn burst_label(prefix: &str) -> String {
    prefix.trim_end_matches('-').to_string()
}

async fn for_each_concurrently<F, Fut>(n: usize, f: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    stream::iter(0..n)
        .map(f)
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|e| anyhow::anyhow!("origin request failed: {e:?}"))?;
    Ok(())
}

/// Creates `n` ConfigMaps `<prefix><i>` of `bytes` as fast as the origin takes them.
pub async fn burst(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    n: usize,
    bytes: usize,
) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for_each_concurrently(n, |i| {
        let (api, cm) = (
            api.clone(),
            config_map(&format!("{prefix}{i}"), bytes, prefix),
        );
        async move { api.create(&PostParams::default(), &cm).await.map(|_| ()) }
    })
    .await
}

/// Creates `n` Services `<prefix><i>` as fast as the origin takes them.
pub async fn service_burst(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    for_each_concurrently(n, |i| {
        let (api, svc) = (api.clone(), service(&format!("{prefix}{i}")));
        async move { api.create(&PostParams::default(), &svc).await.map(|_| ()) }
    })
    .await
}

/// Changes the data of ConfigMaps `<prefix>0..n`: `n` effective changes.
pub async fn update(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    n: usize,
    bytes: usize,
) -> anyhow::Result<()> {
    let payload = "y".repeat(bytes);
    patch_each(
        client,
        ns,
        prefix,
        n,
        |_| serde_json::json!({"data": {"payload": payload}}),
    )
    .await
}

/// Writes an annotation Refract never reflects on ConfigMaps `<prefix>0..n`: `n` origin
/// writes, no effective change.
pub async fn touch(client: &kube::Client, ns: &str, prefix: &str, n: usize) -> anyhow::Result<()> {
    patch_each(
        client,
        ns,
        prefix,
        n,
        |i| serde_json::json!({"metadata": {"annotations": {SKIPPED_ANNOTATION: i.to_string()}}}),
    )
    .await
}

/// Merge-patches ConfigMaps `<prefix>0..n` with `patch(i)`.
async fn patch_each(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    n: usize,
    patch: impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for_each_concurrently(n, |i| {
        let (api, patch) = (api.clone(), patch(i));
        let name = format!("{prefix}{i}");
        async move {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    })
    .await
}

/// Deletes a burst's ConfigMaps (see [`delete_configmaps`]).
pub async fn delete_burst(client: &kube::Client, ns: &str, prefix: &str) -> anyhow::Result<()> {
    let selector = format!("{BURST_LABEL}={}", burst_label(prefix));
    let burst = ListParams::default().labels(&selector);
    delete_configmaps(&Api::namespaced(client.clone(), ns), &burst, ns).await
}

/// Deletes the ConfigMaps of `ns` that `selected` lists. A deletecollection of thousands of
/// objects can outlast the API server's request deadline on a slow machine (it answers 500,
/// "context deadline exceeded", having deleted part of them; one stopped run 28 in its fourth
/// round): it is repeated until none is left.
async fn delete_configmaps(
    cms: &Api<ConfigMap>,
    selected: &ListParams,
    ns: &str,
) -> anyhow::Result<()> {
    const ATTEMPTS: usize = 20;
    for _ in 0..ATTEMPTS {
        match cms
            .delete_collection(&DeleteParams::default(), selected)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code >= 500 => {}
            Err(e) => return Err(e.into()),
        }
        let left = cms.list_metadata(&selected.clone().limit(1)).await?;
        if left.items.is_empty() {
            return Ok(());
        }
    }
    anyhow::bail!("ConfigMaps of {ns} remain after {ATTEMPTS} deletions")
}

/// Deletes every ConfigMap and Service of `ns` (one request per kind and object).
pub async fn delete_all(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    delete_configmaps(
        &Api::namespaced(client.clone(), ns),
        &ListParams::default(),
        ns,
    )
    .await?;
    // Services have no deletecollection in Kubernetes 1.20.
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = svcs
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    for_each_concurrently(names.len(), |i| {
        let (svcs, name) = (svcs.clone(), names[i].clone());
        async move {
            match svcs.delete(&name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
                Err(e) => Err(e),
            }
        }
    })
    .await
}

/// Which kind a steady load creates.
#[derive(Debug, Clone, Copy)]
pub enum SteadyKind {
    /// ConfigMaps of the burst size.
    ConfigMap,
    /// Services with one port.
    Service,
}

/// Creates objects `<prefix><i>` at `rate` per second for `duration`; returns each name with
/// the instant its create request was sent.
pub async fn steady(
    client: &kube::Client,
    ns: &str,
    kind: SteadyKind,
    prefix: &str,
    rate: f64,
    duration: Duration,
    bytes: usize,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let count = (rate * duration.as_secs_f64()).ceil().max(1.0) as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let name = format!("{prefix}{i}");
        let client = client.clone();
        let ns = ns.to_string();
        tasks.spawn(async move {
            let sent = Instant::now();
            let result = match kind {
                SteadyKind::ConfigMap => Api::<ConfigMap>::namespaced(client, &ns)
                    .create(&PostParams::default(), &config_map(&name, bytes, "steady"))
                    .await
                    .map(|_| ()),
                SteadyKind::Service => Api::<Service>::namespaced(client, &ns)
                    .create(&PostParams::default(), &service(&name))
                    .await
                    .map(|_| ()),
            };
            result.map(|()| (name, sent))
        });
    }
    let mut sent = Vec::with_capacity(count);
    while let Some(r) = tasks.join_next().await {
        sent.push(r??);
    }
    Ok(sent)
}
