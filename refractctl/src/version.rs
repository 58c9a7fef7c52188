//! `refractctl version`: this client's version, and for each peering of the origin the
//! versions its two agents run, the remote agent's and the local agent's as the provider's
//! Inspect service reports them (the local agent's from its Hello).

use refract_wire::proto::ListTenantsRequest;
use serde::Serialize;

use crate::cli::{Output, VersionArgs};
use crate::peering::{self, Peering};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Versions {
    client: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    peerings: Option<Vec<PeeringVersions>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PeeringVersions {
    provider: String,
    /// The image of the local agent's Deployment.
    local_agent_image: String,
    /// What the local agent told the provider in its last Hello; empty when unknown.
    local_agent: String,
    /// The version of the remote agent replica that answered; empty when unknown.
    remote_agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Runs `version`.
pub async fn run(args: VersionArgs) -> anyhow::Result<()> {
    let client = env!("CARGO_PKG_VERSION").to_string();
    let peerings = if args.client {
        None
    } else {
        let (origin, _) = peering::connect_cluster(
            args.origin.origin_kubeconfig.as_deref(),
            args.origin.origin_context.as_deref(),
            "origin",
        )
        .await?;
        let mut all = Vec::new();
        for p in peering::list(&origin, None).await? {
            all.push(of_peering(&origin, &p).await);
        }
        Some(all)
    };
    let versions = Versions { client, peerings };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&versions)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&versions)?),
        Output::Text => {
            println!("client: refractctl {}", versions.client);
            for p in versions.peerings.iter().flatten() {
                let shown = |v: &str| {
                    if v.is_empty() {
                        "unknown".to_string()
                    } else {
                        v.to_string()
                    }
                };
                println!(
                    "peering with {}: local agent {} (image {}), remote agent {}{}",
                    p.provider,
                    shown(&p.local_agent),
                    p.local_agent_image,
                    shown(&p.remote_agent),
                    p.error
                        .as_ref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}

async fn of_peering(origin: &kube::Client, p: &Peering) -> PeeringVersions {
    let mut versions = PeeringVersions {
        provider: p.provider.to_string(),
        local_agent_image: p.image().unwrap_or_default().to_string(),
        local_agent: String::new(),
        remote_agent: String::new(),
        error: None,
    };
    let answer = async {
        let mut inspect = p.inspect(origin, peering::Calls::Bounded).await?;
        anyhow::Ok(
            inspect
                .list_tenants(ListTenantsRequest {})
                .await?
                .into_inner(),
        )
    };
    match answer.await {
        Ok(tenants) => {
            let printable = crate::display::printable;
            versions.remote_agent = printable(&tenants.agent_version);
            versions.local_agent = tenants
                .tenants
                .iter()
                .find(|t| {
                    p.origin
                        .as_ref()
                        .is_some_and(|o| o.as_str() == t.cluster_id)
                })
                .map(|t| printable(&t.agent_version))
                .unwrap_or_default();
        }
        Err(e) => versions.error = Some(format!("provider not reachable from here: {e:#}")),
    }
    versions
}
