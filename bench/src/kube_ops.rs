//! Kubernetes calls the benchmarks make in bulk.

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, PostParams};

/// Creates `n` objects made by `object(i)`, `parallel` at a time.
pub async fn create_all<K>(
    api: &Api<K>,
    n: usize,
    parallel: usize,
    object: impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()>
where
    K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(0..n)
        .map(|i| {
            let body = object(i);
            async move {
                let object: K = serde_json::from_value(body)?;
                api.create(&PostParams::default(), &object).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(parallel)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// How many objects `api` lists with `fields` (a field selector, or none).
pub async fn count<K>(api: &Api<K>, fields: &str) -> anyhow::Result<usize>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default();
    if !fields.is_empty() {
        params = params.fields(fields);
    }
    Ok(api.list_metadata(&params).await?.items.len())
}
