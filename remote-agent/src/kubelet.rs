//! `refract.v1.Kubelet`: logs, exec, attach, port-forward and pod stats of a tenant's
//! offloaded pods.
//!
//! Every call names a provider pod; it is served only when that pod was created from a
//! ShadowPod of the calling tenant (the tenant comes from the client certificate, never from
//! the request). The call is then made against the provider's API server as the tenant's own
//! identity ([`upgrade`] for the SPDY ones), and listed in Inspect while open. A tenant has at
//! most `max_sessions` calls open at once. Pod statistics come from the source the provider
//! chose ([`stats`]).

mod coalesce;
mod logs;
mod port_forward;
mod remote_command;
pub mod stats;
pub mod upgrade;

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use refract_core::keys::ORIGIN_LABEL;
use refract_shared::tls::ClusterId;
use refract_wire::proto::kubelet_server::Kubelet;
use refract_wire::proto::{
    LogChunk, LogsRequest, PodRef, PodStatsRequest, PodStatsResponse, PortForwardInput,
    PortForwardOutput, SessionInput, SessionOutput,
};
use tonic::{Request, Response, Status, Streaming};

use crate::identity::Identities;
use crate::peer::Peer;
use crate::registry::{KubeletSessionGuard, Registry};
use crate::shadowpod_controller::{ProviderPod, Stores};

/// Serves `refract.v1.Kubelet`.
#[derive(Clone)]
pub struct KubeletService {
    /// The provider's API server: as this agent for node statistics, as the tenant for
    /// anything on its pods.
    pub identities: Identities,
    /// ShadowPods and their pods.
    pub stores: Stores,
    /// Where open calls are listed.
    pub registry: Registry,
    /// Open calls per tenant, at most (`--max-kubelet-sessions`).
    pub max_sessions: usize,
    /// Tenants' quotas, which may allow fewer.
    pub applier: crate::apply::Applier,
    /// Where pod statistics come from (`--pod-stats`).
    pub stats: stats::StatsReader,
}

type Output<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl KubeletService {
    /// A client acting as `tenant`: the API server itself refuses the tenant's calls on any
    /// pod outside its namespaces.
    fn as_tenant(&self, tenant: &ClusterId) -> Result<kube::Client, Status> {
        self.identities
            .client(tenant)
            .map_err(|e| Status::internal(format!("no client for tenant {tenant}: {e}")))
    }

    /// The tenant's pod named by `pod`, or why the call is refused.
    fn owned_pod(
        &self,
        tenant: &ClusterId,
        pod: Option<&PodRef>,
    ) -> Result<Arc<ProviderPod>, Status> {
        let pod = pod.ok_or_else(|| Status::invalid_argument("no pod named"))?;
        if pod.namespace.is_empty() || pod.name.is_empty() {
            return Err(Status::invalid_argument(
                "the pod's namespace and name are required",
            ));
        }
        let not_offloaded = || {
            Status::permission_denied(format!(
                "pod {}/{} is not one of this tenant's offloaded pods",
                pod.namespace, pod.name
            ))
        };
        let shadow = self
            .stores
            .shadows
            .get(&ObjectRef::new(&pod.name).within(&pod.namespace))
            .ok_or_else(not_offloaded)?;
        if shadow.meta().label(ORIGIN_LABEL) != Some(tenant.as_str()) {
            return Err(not_offloaded());
        }
        let found = self
            .stores
            .pods
            .get(&ObjectRef::new(&pod.name).within(&pod.namespace))
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "pod {}/{} is not created on the provider yet",
                    pod.namespace, pod.name
                ))
            })?;
        let created_from_shadow = found
            .meta()
            .controller_uid()
            .is_some_and(|uid| shadow.meta().uid() == Some(uid));
        if !created_from_shadow {
            return Err(not_offloaded());
        }
        Ok(found)
    }

    /// Checks the pod and lists the call in Inspect until the guard drops.
    fn admit(
        &self,
        tenant: &ClusterId,
        call: &str,
        pod: Option<&PodRef>,
    ) -> Result<(Arc<ProviderPod>, KubeletSessionGuard), Status> {
        let found = self.owned_pod(tenant, pod)?;
        let (namespace, name) = (
            found.meta().namespace().to_string(),
            found.meta().name().to_string(),
        );
        let guard = self
            .registry
            .open_kubelet_session(
                tenant,
                call,
                format!("{namespace}/{name}"),
                self.max_sessions
                    .min(self.applier.quota_of(tenant).kubelet_sessions as usize),
            )
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        tracing::info!(%tenant, call, %namespace, pod = %name, "kubelet call opened");
        Ok((found, guard))
    }
}

/// How long a bidirectional call may wait before its start message.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The first message of a bidirectional call, which must be its start and come at once: a
/// call holds a stream of the connection before it counts as a session.
async fn first<T>(inbound: &mut Streaming<T>) -> Result<T, Status> {
    tokio::time::timeout(START_TIMEOUT, inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no start message within 10s"))??
        .ok_or_else(|| Status::invalid_argument("the call ended before its start message"))
}

#[tonic::async_trait]
impl Kubelet for KubeletService {
    type ContainerLogsStream = Output<LogChunk>;
    type ExecStream = Output<SessionOutput>;
    type AttachStream = Output<SessionOutput>;
    type PortForwardStream = Output<PortForwardOutput>;

    async fn container_logs(
        &self,
        request: Request<LogsRequest>,
    ) -> Result<Response<Self::ContainerLogsStream>, Status> {
        let tenant = Peer::tenant_from_request(&request)?.cluster_id;
        let (pod, guard) = self.admit(&tenant, "ContainerLogs", request.get_ref().pod.as_ref())?;
        let client = self.as_tenant(&tenant)?;
        let stream = logs::stream(&client, &pod, request.into_inner(), guard).await?;
        Ok(Response::new(stream))
    }

    async fn exec(
        &self,
        request: Request<Streaming<SessionInput>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        self.remote_command(request, remote_command::Call::Exec)
            .await
    }

    async fn attach(
        &self,
        request: Request<Streaming<SessionInput>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        self.remote_command(request, remote_command::Call::Attach)
            .await
    }

    async fn port_forward(
        &self,
        request: Request<Streaming<PortForwardInput>>,
    ) -> Result<Response<Self::PortForwardStream>, Status> {
        use refract_wire::proto::port_forward_input::Kind;
        let peer = Peer::tenant_from_request(&request)?;
        let mut inbound = request.into_inner();
        let Some(Kind::Start(start)) = first(&mut inbound).await?.kind else {
            return Err(Status::invalid_argument(
                "the first message must be a start",
            ));
        };
        let port = u16::try_from(start.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                Status::invalid_argument(format!("port {} is not a TCP port", start.port))
            })?;
        let (pod, guard) = self.admit(&peer.cluster_id, "PortForward", start.pod.as_ref())?;
        let client = self.as_tenant(&peer.cluster_id)?;
        let stream = port_forward::run(&client, &pod, port, inbound, guard).await?;
        Ok(Response::new(stream))
    }

    async fn pod_stats(
        &self,
        request: Request<PodStatsRequest>,
    ) -> Result<Response<PodStatsResponse>, Status> {
        let tenant = Peer::tenant_from_request(&request)?.cluster_id;
        let pods = stats::tenant_pods(&self.stores, &tenant);
        let as_tenant = self.as_tenant(&tenant)?;
        let pods = self
            .stats
            .read(self.identities.own(), &as_tenant, &tenant, &pods)
            .await?;
        Ok(Response::new(PodStatsResponse { pods }))
    }
}

impl KubeletService {
    async fn remote_command(
        &self,
        request: Request<Streaming<SessionInput>>,
        call: remote_command::Call,
    ) -> Result<Response<Output<SessionOutput>>, Status> {
        use refract_wire::proto::session_input::Kind;
        let peer = Peer::tenant_from_request(&request)?;
        let mut inbound = request.into_inner();
        let Some(Kind::Start(start)) = first(&mut inbound).await?.kind else {
            return Err(Status::invalid_argument(
                "the first message must be a start",
            ));
        };
        let (pod, guard) = self.admit(&peer.cluster_id, call.name(), start.pod.as_ref())?;
        let client = self.as_tenant(&peer.cluster_id)?;
        let stream = remote_command::run(&client, &pod, call, start, inbound, guard).await?;
        Ok(Response::new(stream))
    }
}
