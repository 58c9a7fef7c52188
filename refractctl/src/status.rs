//! `refractctl status`: each peering of an origin, from the origin's API server, the local
//! agent's metrics (through the API server's pod proxy) and the provider's Inspect service.

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use refract_admin::crd::NamespaceOffloading;
use refract_wire::proto::{ListObjectsRequest, ListTenantsRequest, Outcome};

use crate::cli::{Output, StatusArgs};
use crate::manifests::NAMESPACE;
use crate::peering::{self, Peering};
use crate::pki;
use crate::wait;

mod report;

use report::{
    Certificate, Fallible, Link, LinkState, LocalAgent, Offloading, PeeringReport,
    QuarantinedObject, Queue, QuotaUse, Refused, RefusedObject, Report, Tenant, VirtualNode,
};

/// How many of the provider's latest refusals are shown.
const LAST_ERRORS: usize = 5;

/// Runs `status`: the report on stdout; exits non-zero (with the problems on stderr) when a
/// peering's link is not up or its virtual node not Ready, or there is no peering.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let (origin, api) = peering::connect_cluster(
        args.origin.origin_kubeconfig.as_deref(),
        args.origin.origin_context.as_deref(),
        "origin",
    )
    .await?;
    let peerings = peering::list(&origin, args.provider_id.as_ref()).await?;
    let mut reports = Vec::new();
    for p in &peerings {
        reports.push(peering_report(&origin, p).await);
    }
    let report = Report {
        origin_api_server: api.to_string(),
        peerings: reports,
        offloaded_namespaces: Fallible::from_result(offloadings(&origin).await),
    };
    match args.output {
        Output::Text => print!("{}", report.text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&report)?),
    }
    let problems = report.problems();
    if problems.is_empty() {
        return Ok(());
    }
    Err(Unhealthy(problems).into())
}

/// `status` found a peering that does not work (or none): the exit code says so.
#[derive(Debug, thiserror::Error)]
#[error("not healthy: {}", .0.join("; "))]
pub struct Unhealthy(pub Vec<String>);

async fn peering_report(origin: &kube::Client, p: &Peering) -> PeeringReport {
    let status = p.deployment.status.clone().unwrap_or_default();
    let certificate = p
        .credentials(origin)
        .await
        .and_then(|c| pki::summary(&c.cert_pem))
        .map(|s| Certificate {
            serial: s.serial,
            not_after: s
                .not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|_| s.not_after.to_string()),
        });
    let name = p.virtual_node();
    let mut virtual_node = VirtualNode {
        name,
        ready: None,
        reason: String::new(),
        message: String::new(),
        error: None,
    };
    match wait::node_ready(origin, &virtual_node.name).await {
        Ok(Some((ready, reason, message))) => {
            virtual_node.ready = Some(ready);
            virtual_node.reason = reason;
            virtual_node.message = message;
        }
        Ok(None) => {}
        Err(e) => virtual_node.error = Some(e.to_string()),
    }
    PeeringReport {
        origin: p.origin.as_ref().map(|o| o.to_string()),
        provider: p.provider.to_string(),
        local_agent: LocalAgent {
            deployment: format!("{NAMESPACE}/{}", p.name()),
            available_replicas: status.available_replicas.unwrap_or(0),
            replicas: status.replicas.unwrap_or(0),
        },
        provider_endpoint: p.endpoint.as_ref().map(|e| e.to_string()),
        certificate: Fallible::from_result(certificate),
        link: link(origin, p).await,
        virtual_node,
        queue: Fallible::from_result(queue(origin, p).await),
    }
}

/// How many connections `status` opens to find the remote agent replica serving the tenant.
const CONNECTIONS_TO_FIND_THE_SERVING_REPLICA: usize = 12;

/// The tenant as the provider sees it, and its latest refused objects.
async fn link(origin: &kube::Client, p: &Peering) -> Link {
    let unknown = |reason: String| Link {
        state: LinkState::Unknown,
        reason: Some(reason),
        tenant: None,
    };
    let Some(origin_id) = p.origin.clone() else {
        return unknown("unknown: the local agent has no --cluster-id".into());
    };
    // Inspect shows a tenant only at the remote agent replica serving it, and the provider's
    // Service balances each connection to one replica: ask on new connections until one
    // serves the tenant (two replicas all missed twelve times: one chance in 4,096).
    let mut answered = None;
    for _ in 0..CONNECTIONS_TO_FIND_THE_SERVING_REPLICA {
        let mut inspect = match p.inspect(origin, peering::Calls::Bounded).await {
            Ok(i) => i,
            Err(e) => return unknown(format!("provider not reachable from here: {e:#}")),
        };
        let tenant = match inspect.list_tenants(ListTenantsRequest {}).await {
            Ok(r) => r
                .into_inner()
                .tenants
                .into_iter()
                .find(|t| t.cluster_id == origin_id.as_str()),
            Err(e) => {
                return unknown(format!(
                    "Inspect refused: {} {}",
                    e.code(),
                    crate::display::printable(e.message())
                ))
            }
        };
        if let Some(t) = tenant {
            answered = Some((inspect, t));
            break;
        }
    }
    let Some((mut inspect, t)) = answered else {
        return Link {
            state: LinkState::NeverConnected,
            reason: Some(format!(
                "no remote agent replica reached in {CONNECTIONS_TO_FIND_THE_SERVING_REPLICA} connections knows tenant {origin_id}: it never connected (with several replicas, Inspect shows a tenant only at the one serving it)"
            )),
            tenant: None,
        };
    };
    let objects = inspect
        .list_objects(ListObjectsRequest {
            cluster_id: origin_id.to_string(),
            kind: String::new(),
            namespace: String::new(),
        })
        .await;
    let mut quarantined = Vec::new();
    let refused = match objects {
        Ok(r) => {
            let objects = r.into_inner().objects;
            quarantined = objects
                .iter()
                .filter(|o| !o.quarantined_since.is_empty())
                .map(|o| QuarantinedObject {
                    since: o.quarantined_since.clone(),
                    object: o.object.as_ref().map(|r| r.display()).unwrap_or_default(),
                    restores: o.restores,
                })
                .collect();
            quarantined.sort_by(|a, b| a.since.cmp(&b.since));
            let mut refused: Vec<_> = objects
                .into_iter()
                .filter(|o| {
                    !matches!(
                        Outcome::try_from(o.outcome),
                        Ok(Outcome::Applied | Outcome::Unchanged)
                    )
                })
                .collect();
            refused.sort_by(|a, b| b.updated_at.cmp(&a.updated_at));
            Fallible::Known(Refused {
                count: refused.len(),
                latest: refused
                    .iter()
                    .take(LAST_ERRORS)
                    .map(|o| RefusedObject {
                        at: o.updated_at.clone(),
                        object: o.object.as_ref().map(|r| r.display()).unwrap_or_default(),
                        outcome: Outcome::try_from(o.outcome)
                            .map(|x| x.label().to_string())
                            .unwrap_or_else(|_| o.outcome.to_string()),
                        message: o.message.clone(),
                    })
                    .collect(),
            })
        }
        Err(e) => Fallible::Unknown {
            error: e.message().to_string(),
        },
    };
    Link {
        state: if t.connected {
            LinkState::Connected
        } else {
            LinkState::Disconnected
        },
        reason: (!t.connected).then(|| "the provider saw the tenant's stream close".to_string()),
        tenant: Some(Tenant {
            connected_since: t.connected_since,
            disconnected_at: t.disconnected_at,
            peer_address: t.peer_address,
            agent_version: t.agent_version,
            connections: t.connections,
            objects: t.objects,
            certificate_not_after: t.certificate_not_after,
            quota: t
                .quota
                .into_iter()
                .map(|u| QuotaUse {
                    resource: u.resource,
                    used: u.used,
                    limit: u.limit,
                })
                .collect(),
            refused,
            quarantined,
        }),
    }
}

/// The local agent's outbox, from its /metrics through the API server's pod proxy.
async fn queue(origin: &kube::Client, p: &Peering) -> anyhow::Result<Queue> {
    let text = scrape(origin, p).await?;
    let sum = |name: &str| metric_values(&text, name).into_iter().sum::<f64>();
    let max = |name: &str| {
        metric_values(&text, name)
            .into_iter()
            .fold(0.0_f64, f64::max)
    };
    Ok(Queue {
        unacknowledged: sum("refract_local_outbox_unacked"),
        oldest_unacknowledged_seconds: max("refract_local_outbox_oldest_unacked_seconds"),
        reconnects: sum("refract_local_reconnects_total"),
    })
}

async fn scrape(origin: &kube::Client, p: &Peering) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(origin.clone(), NAMESPACE.as_str());
    let selector = p.pod_selector();
    let pod = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .find(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .context("no running local agent pod")?;
    let admin: std::net::SocketAddr = p
        .arg("--admin-listen")
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

/// Every NamespaceOffloading of the origin.
async fn offloadings(origin: &kube::Client) -> anyhow::Result<Vec<Offloading>> {
    let api: Api<NamespaceOffloading> = Api::all(origin.clone());
    let list = api.list(&ListParams::default()).await?.items;
    Ok(list
        .into_iter()
        .map(|nso| {
            let namespace = nso.namespace().unwrap_or_default();
            let status = nso.status.unwrap_or_default();
            let (ready, reason) = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.status.clone(), c.reason.clone()))
                .unwrap_or_else(|| ("Unknown".into(), String::new()));
            Offloading {
                namespace,
                remote_namespace: status.remote_namespace_name.unwrap_or_default(),
                phase: status.offloading_phase.unwrap_or_default(),
                ready,
                reason,
            }
        })
        .collect())
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
