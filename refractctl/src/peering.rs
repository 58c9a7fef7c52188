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

/// The labels deploy/'s kustomization gives the local agent's objects: a peering made by
/// refractctl and one applied with `kubectl apply -k` carry them alike, so every command finds
/// both.
const LOCAL_AGENT_SELECTOR: &str =
    "app.kubernetes.io/part-of=refract,app.kubernetes.io/component=local-agent";
/// The volumes of deploy/local-agent holding the tenant's certificate and the kubelet's.
const TLS_VOLUME: &str = "tls";
const KUBELET_TLS_VOLUME: &str = "kubelet-tls";

impl Peering {
    /// The peering a local agent's Deployment runs: its provider is the agent's own
    /// `--remote-cluster-id` (refractctl also labels it `refract.io/peering`).
    fn from_deployment(deployment: Deployment) -> Option<Self> {
        let provider = arg_of(&deployment, "--remote-cluster-id")
            .or_else(|| deployment.labels().get(PEERING_LABEL).cloned())?;
        Some(Self {
            provider: ClusterId::parse(&provider).ok()?,
            origin: arg_of(&deployment, "--cluster-id").and_then(|id| ClusterId::parse(&id).ok()),
            endpoint: arg_of(&deployment, "--remote").and_then(|e| e.parse().ok()),
            deployment,
        })
    }

    /// The Secret the agent mounts as volume `volume`, else refractctl's name for it.
    fn secret_of_volume(&self, volume: &str, otherwise: String) -> String {
        self.deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v.iter().find(|v| v.name == volume))
            .and_then(|v| v.secret.as_ref()?.secret_name.clone())
            .unwrap_or(otherwise)
    }

    /// The Secret with the tenant's key, client certificate and the provider's CA.
    pub fn tls_secret(&self) -> String {
        self.secret_of_volume(TLS_VOLUME, plan::local_tls_secret(&self.provider))
    }

    /// The Secret with the virtual node's kubelet serving certificate.
    pub fn kubelet_tls_secret(&self) -> String {
        self.secret_of_volume(KUBELET_TLS_VOLUME, plan::kubelet_tls_secret(&self.provider))
    }

    /// The virtual node the agent registers: its `--node-name`, else the default.
    pub fn virtual_node(&self) -> String {
        self.arg("--node-name")
            .unwrap_or_else(|| plan::virtual_node(&self.provider))
    }

    /// The selector of the agent's pods (its Deployment's).
    pub fn pod_selector(&self) -> String {
        self.deployment
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_else(|| format!("{PEERING_LABEL}={}", self.provider))
    }

    /// The value the local agent is given for `flag` (`--flag=value`).
    pub fn arg(&self, flag: &str) -> Option<String> {
        arg_of(&self.deployment, flag)
    }

    /// The local agent's image.
    pub fn image(&self) -> Option<&str> {
        container_of(&self.deployment)?.image.as_deref()
    }

    /// The local agent Deployment's name.
    pub fn name(&self) -> String {
        self.deployment.name_any()
    }

    /// The peering's client certificate and CA bundle.
    pub async fn credentials(&self, origin: &kube::Client) -> anyhow::Result<TlsSecret> {
        let name = self.tls_secret();
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

/// The local agent's container.
fn container_of(deployment: &Deployment) -> Option<&Container> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()
}

/// The value the local agent of `deployment` is given for `flag` (`--flag=value`).
fn arg_of(deployment: &Deployment, flag: &str) -> Option<String> {
    container_of(deployment)?
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix(flag)?.strip_prefix('=').map(str::to_string))
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
    let api: Api<Deployment> = Api::namespaced(origin.clone(), NAMESPACE.as_str());
    let deployments = api
        .list(&ListParams::default().labels(LOCAL_AGENT_SELECTOR))
        .await
        .with_context(|| format!("failed to list the local agents (Deployments in {NAMESPACE})"))?;
    Ok(deployments
        .items
        .into_iter()
        .filter_map(Peering::from_deployment)
        .filter(|p| provider.is_none_or(|wanted| p.provider == *wanted))
        .collect())
}

/// The peering with `provider`, which must exist.
pub async fn get(origin: &kube::Client, provider: &ClusterId) -> anyhow::Result<Peering> {
    match list(origin, Some(provider)).await?.into_iter().next() {
        Some(p) => Ok(p),
        None => bail!(
            "this origin has no peering with {provider} (no local agent in {NAMESPACE} runs with --remote-cluster-id={provider}); `refractctl status` lists its peerings"
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
