//! Waiting for what `peer` set up, with what an operator needs when it does not come.

use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use crate::manifests::NAMESPACE;

const POLL: Duration = Duration::from_secs(1);

/// Waits until `check` gives a value, polling every second, up to `deadline`; on time-out, the
/// error says what was awaited and what `explain` finds.
pub async fn until<T, F, Fut, E, EFut>(
    deadline: Instant,
    what: &str,
    mut check: F,
    explain: E,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    E: FnOnce() -> EFut,
    EFut: std::future::Future<Output = String>,
{
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(format!("{e:#}")),
        }
        if Instant::now() >= deadline {
            let mut message = format!("timed out waiting for {what}");
            if let Some(e) = last_error {
                message.push_str(&format!("; last error: {e}"));
            }
            let found = explain().await;
            if !found.is_empty() {
                message.push_str(&format!("\n{found}"));
            }
            bail!(message);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether Deployment `name` of refract-system has rolled out and has an available pod.
pub async fn deployment_available(client: &kube::Client, name: &str) -> anyhow::Result<Option<()>> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE.as_str());
    let Some(d) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let generation = d.metadata.generation.unwrap_or(0);
    let status = d.status.unwrap_or_default();
    let rolled_out = status.observed_generation.unwrap_or(0) >= generation
        && status.updated_replicas.unwrap_or(0) >= 1
        && status.replicas.unwrap_or(0) == status.updated_replicas.unwrap_or(0);
    Ok((rolled_out && status.available_replicas.unwrap_or(0) >= 1).then_some(()))
}

/// The pods of the agent with `selector` and why they are not ready, one line each.
pub async fn pods_state(client: &kube::Client, selector: &str) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE.as_str());
    let pods = match api.list(&ListParams::default().labels(selector)).await {
        Ok(p) => p.items,
        Err(e) => return format!("  (could not list the pods: {e})"),
    };
    if pods.is_empty() {
        return format!(
            "  no pod matches {selector} (see `kubectl -n {NAMESPACE} describe deployment`)"
        );
    }
    pods.iter()
        .map(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            let status = p.status.clone().unwrap_or_default();
            let mut line = format!("  pod {name}: {}", status.phase.unwrap_or_default());
            for c in status.container_statuses.unwrap_or_default() {
                if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                    line.push_str(&format!(
                        "; {} waiting: {} {}",
                        c.name,
                        w.reason.clone().unwrap_or_default(),
                        w.message.clone().unwrap_or_default()
                    ));
                }
                if c.restart_count > 0 {
                    line.push_str(&format!("; {} restarted {} times", c.name, c.restart_count));
                }
            }
            line.push_str(&format!(" (`kubectl -n {NAMESPACE} logs {name}`)"));
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Ready condition of node `name`: (status, reason, message), if the node exists.
pub async fn node_ready(
    client: &kube::Client,
    name: &str,
) -> anyhow::Result<Option<(String, String, String)>> {
    let api: Api<Node> = Api::all(client.clone());
    let Some(node) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready");
    Ok(Some(match ready {
        Some(c) => (
            c.status,
            c.reason.unwrap_or_default(),
            c.message.unwrap_or_default(),
        ),
        None => ("Unknown".into(), "NoReadyCondition".into(), String::new()),
    }))
}
