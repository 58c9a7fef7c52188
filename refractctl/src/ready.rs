//! Waiting after a peering's objects were applied: both agents available, the tenant connected at
//! the provider, the virtual node Ready. A step that does not finish in time says what it saw.

use std::time::Instant;

use refract_core::keys::PEERING_LABEL;
use refract_wire::proto::ListTenantsRequest;

use crate::display;
use crate::peering;
use crate::plan::{self, OriginPlan};
use crate::wait;

/// Waits until the provider's remote agent is available.
pub async fn remote_agent_available(
    provider: &kube::Client,
    deadline: Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let remote_selector = "app.kubernetes.io/name=refract-remote-agent";
    wait::until(
        deadline,
        "the remote agent to become available",
        || wait::deployment_available(provider, plan::REMOTE_NAME),
        || async { wait::pods_state(provider, remote_selector).await },
    )
    .await?;
    say("remote agent available");
    Ok(())
}

/// Waits for what the origin alone can see: its local agent available, the tenant connected
/// (asked of the remote agent with the origin's own certificate), the virtual node Ready.
pub async fn origin_side_ready(
    origin: &kube::Client,
    plan: &OriginPlan,
    deadline: Instant,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let local_name = plan::local_agent_name(&plan.provider);
    let local_selector = format!("{PEERING_LABEL}={}", plan.provider);
    wait::until(
        deadline,
        "the local agent to become available",
        || wait::deployment_available(origin, &local_name),
        || async { wait::pods_state(origin, &local_selector).await },
    )
    .await?;
    say("local agent available");
    let made = peering::get(origin, &plan.provider).await?;
    let tenant = wait::until(
        deadline,
        "the provider to show the tenant connected",
        || async {
            let mut inspect = made.inspect(origin, peering::Calls::Bounded).await?;
            let tenants = inspect
                .list_tenants(ListTenantsRequest {})
                .await?
                .into_inner();
            Ok(tenants
                .tenants
                .into_iter()
                .find(|t| t.cluster_id == plan.origin.as_str() && t.connected))
        },
        || async { wait::pods_state(origin, &local_selector).await },
    )
    .await?;
    say(&format!(
        "tenant {} connected to provider {} since {} (agent {})",
        plan.origin,
        plan.provider,
        display::printable(&tenant.connected_since),
        display::printable(&tenant.agent_version)
    ));
    let node = plan::virtual_node(&plan.provider);
    wait::until(
        deadline,
        &format!("virtual node {node} to become Ready"),
        || async {
            Ok(wait::node_ready(origin, &node)
                .await?
                .filter(|(status, ..)| status == "True"))
        },
        || async {
            match wait::node_ready(origin, &node).await {
                Ok(Some((s, r, m))) => format!("  node {node}: Ready={s} {r} {m}"),
                Ok(None) => format!(
                    "  node {node} does not exist yet\n{}",
                    wait::pods_state(origin, &local_selector).await
                ),
                Err(e) => format!("  could not read node {node}: {e}"),
            }
        },
    )
    .await?;
    say(&format!("virtual node {node} Ready"));
    Ok(())
}
