//! An origin's peerings as `peer` left them: one local agent Deployment each, labelled with
//! its provider, and the Secret with its client certificate. `status`, `tap`, `rotate` and
//! `unpeer` start here.

use std::time::Duration;

use anyhow::{bail, Context};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::ClusterId;
use refract_wire::proto::inspect_client::InspectClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::manifests::NAMESPACE;
use crate::pki::{self, TlsSecret};
use crate::plan::{self, HostPort};

/// How long a call to the provider's agent may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One peering of the origin.
#[derive(Debug, Clone)]
pub struct Peering {
    /// The provider's cluster id.
    pub provider: ClusterId,
    /// The origin's cluster id, from the local agent's `--cluster-id`.
    pub origin: Option<ClusterId>,
    /// Where the local agent dials, from its `--remote`.
    pub endpoint: Option<HostPort>,
    /// The local agent's Deployment.
    pub deployment: Deployment,
}

impl Peering {
    fn from_deployment(deployment: Deployment) -> Option<Self> {
        let provider = ClusterId::parse(deployment.labels().get(PEERING_LABEL)?).ok()?;
        let mut peering = Self {
            provider,
            origin: None,
            endpoint: None,
            deployment,
        };
        peering.origin = peering
            .arg("--cluster-id")
            .and_then(|id| ClusterId::parse(&id).ok());
        peering.endpoint = peering.arg("--remote").and_then(|e| e.parse().ok());
        Some(peering)
    }

    /// The local agent's container.
    fn container(&self) -> Option<&Container> {
        self.deployment
            .spec
            .as_ref()?
            .template
            .spec
            .as_ref()?
            .containers
            .first()
    }

    /// The value the local agent is given for `flag` (`--flag=value`).
    pub fn arg(&self, flag: &str) -> Option<String> {
        self.container()?
            .args
            .iter()
            .flatten()
            .find_map(|a| a.strip_prefix(flag)?.strip_prefix('=').map(str::to_string))
    }

    /// The local agent's image.
    pub fn image(&self) -> Option<&str> {
        self.container()?.image.as_deref()
    }

    /// The local agent Deployment's name.
    pub fn name(&self) -> String {
        self.deployment.name_any()
    }

    /// The peering's client certificate and CA bundle.
    pub async fn credentials(&self, origin: &kube::Client) -> anyhow::Result<TlsSecret> {
        let name = plan::local_tls_secret(&self.provider);
        pki::read(origin, &name).await?.with_context(|| {
            format!("Secret {NAMESPACE}/{name} with the peering's client certificate is missing")
        })
    }

    /// An Inspect client to the provider's agent, authenticated as this origin.
    pub async fn inspect(
        &self,
        origin: &kube::Client,
        calls: Calls,
    ) -> anyhow::Result<InspectClient<Channel>> {
        let endpoint = self
            .endpoint
            .clone()
            .context("the local agent has no --remote=HOST:PORT")?;
        let tls = self.credentials(origin).await?;
        let channel = channel(&endpoint, &tls, calls).await?;
        Ok(InspectClient::new(channel))
    }
}

/// How long a call on a channel may take.
#[derive(Debug, Clone, Copy)]
pub enum Calls {
    /// Short calls (ListTenants, ListObjects).
    Bounded,
    /// A stream that stays open (Tap).
    Open,
}

/// A mutual-TLS channel to the remote agent at `endpoint` with `tls`.
pub async fn channel(
    endpoint: &HostPort,
    tls: &TlsSecret,
    calls: Calls,
) -> anyhow::Result<Channel> {
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_pem))
        .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
        .domain_name(endpoint.host.clone());
    let mut channel = Endpoint::from_shared(format!("https://{endpoint}"))?
        .tls_config(config)?
        .connect_timeout(CALL_TIMEOUT);
    if let Calls::Bounded = calls {
        channel = channel.timeout(CALL_TIMEOUT);
    }
    channel
        .connect()
        .await
        .with_context(|| format!("failed to reach the provider's agent at {endpoint}"))
}

/// The origin's peerings, or only the one with `provider`.
pub async fn list(
    origin: &kube::Client,
    provider: Option<&ClusterId>,
) -> anyhow::Result<Vec<Peering>> {
    let api: Api<Deployment> = Api::namespaced(origin.clone(), NAMESPACE);
    let selector = match provider {
        Some(p) => format!("{PEERING_LABEL}={p}"),
        None => PEERING_LABEL.to_string(),
    };
    let deployments = api
        .list(&ListParams::default().labels(&selector))
        .await
        .context("failed to list the local agents (Deployments in refract-system)")?;
    Ok(deployments
        .items
        .into_iter()
        .filter_map(Peering::from_deployment)
        .collect())
}

/// The peering with `provider`, which must exist.
pub async fn get(origin: &kube::Client, provider: &ClusterId) -> anyhow::Result<Peering> {
    match list(origin, Some(provider)).await?.into_iter().next() {
        Some(p) => Ok(p),
        None => bail!(
            "this origin has no peering with {provider} (no Deployment {NAMESPACE}/{} labelled {PEERING_LABEL}={provider}); `refractctl status` lists its peerings",
            plan::local_agent_name(provider)
        ),
    }
}

/// A client for the cluster of `kubeconfig` (else $KUBECONFIG, else ~/.kube/config), and the
/// API server's address as the kubeconfig names it.
pub async fn connect_cluster(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    which: &str,
) -> anyhow::Result<(kube::Client, HostPort)> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let in_context = context
        .map(|c| format!(" (context {c})"))
        .unwrap_or_default();
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).with_context(|| {
                format!("failed to read the {which} kubeconfig {}", path.display())
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| {
                    format!("the {which} kubeconfig {}{in_context}", path.display())
                })?
        }
        None => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| {
                format!("no {which} kubeconfig given{in_context}, and none usable in $KUBECONFIG or ~/.kube/config")
            })?,
    };
    let uri = config.cluster_url.clone();
    let server = HostPort {
        host: uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port: uri.port_u16().unwrap_or(443),
    };
    let client = kube::Client::try_from(config)
        .with_context(|| format!("failed to build a client for the {which} cluster"))?;
    Ok((client, server))
}

/// A peering with `provider` may exist already (peering again brings it to what was asked),
/// but not under another origin id than `origin_id`: the provider would see a second tenant.
pub async fn refuse_another_origin(
    origin: &kube::Client,
    provider: &ClusterId,
    origin_id: &ClusterId,
    say: &impl Fn(&str),
) -> anyhow::Result<()> {
    let existing = list(origin, Some(provider)).await?;
    let Some(existing) = existing.first() else {
        return Ok(());
    };
    if let Some(other) = existing.origin.as_ref().filter(|o| *o != origin_id) {
        bail!(
            "this origin already peers with {provider} as {other}; unpeer it first, or peer again with --origin-id {other}"
        );
    }
    say(&format!(
        "a peering with {provider} exists; bringing it to what was asked"
    ));
    Ok(())
}
