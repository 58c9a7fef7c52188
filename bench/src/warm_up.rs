//! An untimed pass of the same load through both control planes before either system is
//! measured.
//!
//! The first burst a fresh control plane takes costs its API server and etcd far more CPU per
//! object than later ones (likely etcd's database growing its file and the API server's heap
//! and caches growing to size; not measured apart): on two fresh control planes, 10,000
//! ConfigMaps cost the origin API server 15.9 CPU-seconds when first and 9.5 when second, for
//! the same 10,000 creates and watch events. Whichever system ran first paid for it. After
//! this pass both find the clusters grown, with the space of deleted objects free for reuse.

use crate::load;
use crate::phases::Plan;
use crate::say;
use crate::sides::create_namespace;

/// The namespace the pass uses on both clusters, emptied afterwards.
const NAMESPACE: &str = "bench-warm-up";

/// Creates the largest ConfigMap burst and the Service burst in the origin and in the
/// provider at once, then deletes them.
pub async fn run(
    origin: &kube::Client,
    provider: &kube::Client,
    plan: &Plan,
) -> anyhow::Result<()> {
    let n = *plan.sizes.last().expect("sizes checked");
    say(&format!(
        "warming up both control planes (untimed): {n} ConfigMaps and {} Services created and deleted in each",
        plan.service_burst
    ));
    tokio::try_join!(pass(origin, n, plan), pass(provider, n, plan))?;
    Ok(())
}

async fn pass(client: &kube::Client, n: usize, plan: &Plan) -> anyhow::Result<()> {
    create_namespace(client, NAMESPACE).await?;
    load::burst(client, NAMESPACE, "w-", n, plan.data_bytes).await?;
    load::service_burst(client, NAMESPACE, "wsvc-", plan.service_burst).await?;
    load::delete_all(client, NAMESPACE).await
}
