//! `refractctl status`: each peering of an origin, from the origin's API server, the local
//! agent's metrics (through the API server's pod proxy) and the provider's Inspect service.

use std::fmt::Write as _;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use refract_admin::crd::NamespaceOffloading;
use refract_core::keys::PEERING_LABEL;
use refract_wire::proto::{ListObjectsRequest, ListTenantsRequest, Outcome};

use crate::cli::StatusArgs;
use crate::manifests::NAMESPACE;
use crate::peering::{self, Peering};
use crate::pki;
use crate::plan;
use crate::wait;

/// How many of the provider's latest refusals are shown.
const LAST_ERRORS: usize = 5;

/// Runs `status`.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let (origin, api) =
        peering::connect_cluster(args.origin.origin_kubeconfig.as_deref(), "origin").await?;
    let peerings = peering::list(&origin, args.provider_id.as_ref()).await?;
    if peerings.is_empty() {
        println!("origin {api}: no peerings (no local agent Deployment labelled {PEERING_LABEL} in {NAMESPACE})");
        return Ok(());
    }
    for p in &peerings {
        print!("{}", report(&origin, p).await);
    }
    print!("{}", offloadings(&origin).await);
    Ok(())
}

async fn report(origin: &kube::Client, p: &Peering) -> String {
    let mut out = String::new();
    let origin_id = p
        .origin
        .as_ref()
        .map(|o| o.to_string())
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(out, "PEERING {origin_id} -> {}", p.provider);
    let status = p.deployment.status.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "  local agent:   {NAMESPACE}/{} {}/{} available",
        p.name(),
        status.available_replicas.unwrap_or(0),
        status.replicas.unwrap_or(0)
    );
    let endpoint = p
        .endpoint
        .as_ref()
        .map(|e| e.to_string())
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(out, "  provider:      {endpoint}");
    match p
        .credentials(origin)
        .await
        .and_then(|c| pki::summary(&c.cert_pem))
    {
        Ok(s) => {
            let _ = writeln!(
                out,
                "  certificate:   serial {}, valid until {}",
                s.serial, s.not_after
            );
        }
        Err(e) => {
            let _ = writeln!(out, "  certificate:   unreadable: {e:#}");
        }
    }
    let _ = writeln!(out, "  link:          {}", link(origin, p).await);
    let node = plan::virtual_node(&p.provider);
    let node_line = match wait::node_ready(origin, &node).await {
        Ok(Some((s, r, m))) => format!("{node} Ready={s} {r} {m}"),
        Ok(None) => format!("{node} does not exist"),
        Err(e) => format!("{node}: {e}"),
    };
    let _ = writeln!(out, "  virtual node:  {}", node_line.trim_end());
    let _ = writeln!(out, "  queue:         {}", queue(origin, p).await);
    out
}

/// The tenant as the provider sees it, and its latest refused objects.
async fn link(origin: &kube::Client, p: &Peering) -> String {
    let Some(origin_id) = p.origin.clone() else {
        return "unknown: the local agent has no --cluster-id".into();
    };
    let mut inspect = match p.inspect(origin, peering::Calls::Bounded).await {
        Ok(i) => i,
        Err(e) => return format!("provider not reachable from here: {e:#}"),
    };
    let tenant = match inspect.list_tenants(ListTenantsRequest {}).await {
        Ok(r) => r
            .into_inner()
            .tenants
            .into_iter()
            .find(|t| t.cluster_id == origin_id.as_str()),
        Err(e) => {
            return format!(
                "Inspect refused: {} {}",
                e.code(),
                crate::display::printable(e.message())
            )
        }
    };
    let Some(t) = tenant else {
        return format!("the provider does not know tenant {origin_id} (never connected)");
    };
    let p = crate::display::printable;
    let mut line = if t.connected {
        format!(
            "connected since {} from {} (agent {}, {} connections, {} objects; connection certificate valid until {})",
            p(&t.connected_since),
            p(&t.peer_address),
            p(&t.agent_version),
            t.connections,
            t.objects,
            p(&t.certificate_not_after)
        )
    } else {
        format!(
            "DISCONNECTED since {} ({} connections before)",
            t.disconnected_at, t.connections
        )
    };
    line.push_str(&quota_line(&t.quota));
    let objects = inspect
        .list_objects(ListObjectsRequest {
            cluster_id: origin_id.to_string(),
            kind: String::new(),
            namespace: String::new(),
        })
        .await;
    match objects {
        Ok(r) => {
            let mut refused: Vec<_> = r
                .into_inner()
                .objects
                .into_iter()
                .filter(|o| {
                    !matches!(
                        Outcome::try_from(o.outcome),
                        Ok(Outcome::Applied | Outcome::Unchanged)
                    )
                })
                .collect();
            refused.sort_by(|a, b| b.updated_at.cmp(&a.updated_at));
            if refused.is_empty() {
                line.push_str("\n  last errors:   none");
            } else {
                line.push_str(&format!(
                    "\n  last errors:   {} objects not applied; latest:",
                    refused.len()
                ));
                for o in refused.iter().take(LAST_ERRORS) {
                    let what = o.object.as_ref().map(|r| r.display()).unwrap_or_default();
                    let outcome = Outcome::try_from(o.outcome)
                        .map(|x| x.as_str_name().trim_start_matches("OUTCOME_").to_string())
                        .unwrap_or_else(|_| o.outcome.to_string());
                    line.push_str(&format!(
                        "\n    {} {} {outcome}: {}",
                        p(&o.updated_at),
                        p(&what),
                        p(&o.message)
                    ));
                }
            }
        }
        Err(e) => line.push_str(&format!("\n  last errors:   unknown ({})", p(e.message()))),
    }
    line
}

/// The local agent's outbox, from its /metrics through the API server's pod proxy.
async fn queue(origin: &kube::Client, p: &Peering) -> String {
    match scrape(origin, p).await {
        Ok(text) => {
            let sum = |name: &str| metric_values(&text, name).into_iter().sum::<f64>();
            let max = |name: &str| {
                metric_values(&text, name)
                    .into_iter()
                    .fold(0.0_f64, f64::max)
            };
            format!(
                "{} unacknowledged, oldest {:.1}s; {} reconnects",
                sum("refract_local_outbox_unacked"),
                max("refract_local_outbox_oldest_unacked_seconds"),
                sum("refract_local_reconnects_total")
            )
        }
        Err(e) => format!("unknown: {e:#}"),
    }
}

async fn scrape(origin: &kube::Client, p: &Peering) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(origin.clone(), NAMESPACE);
    let selector = format!("{PEERING_LABEL}={}", p.provider);
    let pod = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .find(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .context("no running local agent pod")?;
    let admin: std::net::SocketAddr = admin_listen(p)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| ([0, 0, 0, 0], 9090).into());
    if admin.ip().is_loopback() {
        // A single-host peering: the agent's admin port is on this machine's loopback, where
        // the API server's pod proxy (which dials the pod IP) does not reach.
        return scrape_loopback(admin).await;
    }
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{NAMESPACE}/pods/{}:{}/proxy/metrics",
        pod.name_any(),
        admin.port()
    ))
    .body(Vec::new())?;
    origin.request_text(request).await.map_err(|e| {
        anyhow::anyhow!(
            "the API server's pod proxy did not reach the agent's admin port: {}",
            short(&e)
        )
    })
}

/// A kube error without the Status dump.
fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// `GET /metrics` over plain HTTP/1.0 on this machine.
async fn scrape_loopback(addr: std::net::SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        std::io::Result::Ok(response)
    };
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), exchange)
        .await
        .context("the local agent's admin port did not answer within 5s")?
        .with_context(|| format!("failed to read {addr}/metrics"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("not an HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        anyhow::bail!(
            "{addr}/metrics answered {}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_string())
}

fn admin_listen(p: &Peering) -> Option<String> {
    let args = p
        .deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .args
        .clone()?;
    args.iter()
        .find_map(|a| a.strip_prefix("--admin-listen="))
        .map(str::to_string)
}

/// The values of every series of metric `name` in a Prometheus text exposition.
fn metric_values(text: &str, name: &str) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit(' ').next()?.parse().ok()
        })
        .collect()
}

/// Every NamespaceOffloading of the origin, one line each.
async fn offloadings(origin: &kube::Client) -> String {
    let api: Api<NamespaceOffloading> = Api::all(origin.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => return format!("OFFLOADED NAMESPACES unknown ({e})\n"),
    };
    if list.is_empty() {
        return "OFFLOADED NAMESPACES none (create a NamespaceOffloading in one)\n".into();
    }
    let mut out = String::from("OFFLOADED NAMESPACES\n");
    for nso in list {
        let ns = nso.namespace().unwrap_or_default();
        let status = nso.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| format!("Ready={} {}", c.status, c.reason))
            .unwrap_or_else(|| "Ready=Unknown".into());
        let _ = writeln!(
            out,
            "  {ns} -> {} {} {ready}",
            status.remote_namespace_name.unwrap_or_default(),
            status.offloading_phase.unwrap_or_default()
        );
    }
    out
}

/// The tenant's usage of each quota it has or holds something of: `pods 3/10`.
fn quota_line(usage: &[refract_wire::proto::QuotaUsage]) -> String {
    let p = crate::display::printable;
    let shown: Vec<String> = usage
        .iter()
        .filter(|u| u.limit.is_some() || u.used > 0.0)
        .map(|u| match u.limit {
            Some(limit) => format!("{} {}/{}", p(&u.resource), u.used, limit),
            None => format!("{} {}", p(&u.resource), u.used),
        })
        .collect();
    if shown.is_empty() {
        return String::new();
    }
    format!("\n  quota:         {}", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_reads_every_series_of_one_name_only() {
        let text = "# HELP x\nrefract_local_outbox_unacked{kind=\"pods\"} 3\nrefract_local_outbox_unacked{kind=\"objects\"} 4\nrefract_local_outbox_unacked_other 9\nrefract_local_outbox_oldest_unacked_seconds 1.5\n";
        assert_eq!(
            metric_values(text, "refract_local_outbox_unacked"),
            vec![3.0, 4.0]
        );
        assert_eq!(
            metric_values(text, "refract_local_outbox_oldest_unacked_seconds"),
            vec![1.5]
        );
    }
}
