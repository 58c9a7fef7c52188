//! Refract's provider-side agent.
//!
//! Data flow: [`tls_listener`] accepts mutual-TLS connections with the current certificate;
//! tonic routes `refract.v1.Reflection/Sync` to [`sync`], which takes the tenant from the
//! verified client certificate ([`peer`]; [`access`] refuses tenants the operator cut off and
//! closes their connections), checks Hello, and runs the tenant's session:
//! each Upsert/Delete goes to [`apply`] and is answered with an Ack. [`registry`] keeps
//! per-tenant state that [`inspect`] serves read-only. [`metrics`] are served on the admin port.
//! Back to the origin: pod status ([`pod_status`]), free capacity ([`capacity`]) and the
//! volumes bound to tenants' claims ([`volumes`]) through each tenant's [`outbox`], which
//! sends a session what it lacks; events ([`events`]) as they happen. [`kubelet`] serves
//! logs, exec, attach, port-forward and stats of a tenant's offloaded pods.

pub mod access;
pub mod apply;
pub mod capacity;
mod cli;
mod csr_signer;
mod custom_kinds;
pub mod custom_status;
pub mod events;
pub mod identity;
pub mod inspect;
pub mod inventory;
pub mod kinds;
pub mod kubelet;
pub mod metrics;
#[cfg(test)]
mod mock_api;
pub mod network_fence;
pub mod networks;
pub mod objects;
pub mod outbox;
mod packed_strs;
pub mod peer;
pub mod pod_status;
pub mod policy;
pub mod policy_file;
pub mod quota;
pub mod registry;
pub mod restore;
pub mod shadowpod;
pub mod shadowpod_controller;
pub mod sync;
pub mod tenancy;
pub mod tenants;
pub mod tls_listener;
pub mod usage;
pub mod volumes;
mod watching;

pub use cli::{parse_duration, Args, Cli, Command, Invocation};

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use refract_shared::telemetry::Admin;
use refract_shared::tls::{self, TlsFiles, Watched};
use refract_wire::proto::inspect_server::InspectServer;
use refract_wire::proto::kubelet_server::KubeletServer;
use refract_wire::proto::reflection_server::ReflectionServer;
use tokio_util::sync::CancellationToken;

/// Streams a client may reset before the server accepted them (HTTP/2 rapid-reset guard).
const MAX_PENDING_RESETS: usize = 32;
/// The largest header list of a request (HTTP/2 CONTINUATION-flood guard).
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// How long open connections get to close after a shutdown signal.
const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the remote agent until `shutdown` resolves.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tls::install_default_crypto_provider();
    let token = CancellationToken::new();
    let admin = Admin::default();
    let metrics = metrics::Metrics::register(&admin);
    let admin_addr = admin
        .spawn(
            args.telemetry.admin_listen,
            args.telemetry.admin_auth,
            token.clone(),
        )
        .await?;

    let files = TlsFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        ca: args.client_ca.clone(),
    };
    let server_tls: Watched<Arc<rustls::ServerConfig>> = Watched::spawn(
        files,
        args.cert_poll_interval,
        tls::server_config,
        token.clone(),
    )
    .context("failed to load the serving certificate")?;
    refract_shared::telemetry::register_agent_info(
        &admin,
        "refract_remote",
        server_tls.clone(),
        Vec::new(),
        token.clone(),
    );
    let own = server_tls.current().identity.clone();
    if own != args.cluster_id {
        anyhow::bail!(
            "--tls-cert identifies cluster {own:?} but --cluster-id is {:?}; issue the serving certificate for this cluster",
            args.cluster_id.as_str()
        );
    }

    let denied = match &args.tenant_deny_list {
        Some(path) => {
            let (text, list) = access::load_deny_list(path)?;
            tracing::info!(file = %path.display(), entries = list.len(), "tenant deny list loaded");
            Some((path.clone(), text, list))
        }
        None => None,
    };
    let access = access::Access::new(
        args.inspect_admins.iter().cloned().collect(),
        denied.as_ref().map(|d| d.2.clone()).unwrap_or_default(),
    );
    if let Some((path, text, _)) = denied {
        access::follow_deny_list(access.clone(), path, text, token.clone());
    }

    let limits = args.limits()?;
    let (client, config) =
        refract_shared::kubeconfig::client_and_config(args.kubeconfig.as_deref()).await?;
    let identities =
        identity::Identities::impersonating(client.clone(), config, args.own_namespace.clone());
    identities
        .check_role(
            &limits
                .policies
                .custom_kinds()
                .into_iter()
                .collect::<Vec<_>>(),
        )
        .await?;
    admin.review_readers_with(client.clone());
    let registry = registry::Registry::default();
    // Before the stores are made: each custom kind gets its store and watch.
    for name in limits.policies.custom_kinds() {
        kinds::custom::register(&name)?;
        tracing::info!(kind = %name, "custom kind tenants may write: watched, and checked against the provider's CustomResourceDefinition before each write");
    }
    // ShadowPods and claims are watched whole by their controller and the volume stream;
    // those watches feed the tenant objects' stores too, so each kind is watched once.
    let claims = kinds::Allowed::Reflected(refract_core::options::Kind::PersistentVolumeClaim);
    let (objects, changes, mut feeds) = objects::spawn(
        client.clone(),
        &args.cluster_id,
        apply::needs_managed_fields,
        &[kinds::Allowed::ShadowPod, claims],
        token.clone(),
    );
    let (Some(shadow_feed), Some(claim_feed)) = (
        feeds.remove(&kinds::Allowed::ShadowPod),
        feeds.remove(&claims),
    ) else {
        anyhow::bail!("ShadowPods and claims are not among the kinds tenants may write");
    };
    let outbox = outbox::Outbox::default();
    let (drift, cleared) =
        restore::Drift::new(args.fight_rule(), metrics.drift.clone(), outbox.clone());
    let applier = apply::Applier::new(identities.clone(), args.cluster_id.clone(), limits, objects)
        .with_drift(drift.clone());
    let collector = usage::UsageCollector::new(applier.clone());
    admin.register("refract_remote", |r| {
        r.register_collector(Box::new(collector))
    });
    // Before any tenant is served: no EndpointSlice is judged without the discovered networks.
    let api_service = networks::discover(&client, &args.provider_cidrs, &applier.networks()).await;
    restore::spawn_restorer(applier.clone(), drift.clone(), cleared, changes);
    let candidacy = args
        .leader_election
        .candidacy(String::new(), &args.own_namespace)
        .map_err(anyhow::Error::msg)?;
    let tenancy = match &candidacy {
        Some(candidacy) => tenancy::Tenancy::elected(
            client.clone(),
            candidacy.clone(),
            registry.clone(),
            applier.desired.clone(),
            token.clone(),
        ),
        None => tenancy::Tenancy::alone(),
    };
    // Before any stream is served, so that a claim here never meets this pod's stale Lease.
    tenancy.release_predecessors().await;
    // Whether this replica runs the work that spans tenants.
    let leading = tenancy::spawn_controller_election(client.clone(), candidacy, token.clone());
    if let Some(expiry) = args.tenant_expiry {
        let desired = applier.desired.clone();
        tenants::spawn_collector(
            identities.clone(),
            tenants::Served {
                here: registry.clone(),
                tenancy: tenancy.clone(),
                leading: leading.clone(),
            },
            desired,
            expiry,
            token.clone(),
        );
    }
    if !args.tenant_ca_secret.is_empty() {
        csr_signer::spawn(
            client.clone(),
            csr_signer::SignerConfig {
                namespace: args.own_namespace.clone(),
                ca_secret: args.tenant_ca_secret.clone(),
                validity_days: args.tenant_certificate_days,
            },
            leading.clone(),
            token.clone(),
        );
    }
    let stores = shadowpod_controller::spawn(
        identities.clone(),
        &args.cluster_id,
        usize::from(args.pod_workers),
        shadow_feed,
        applier.desired.clone(),
        leading.clone(),
        token.clone(),
    );
    pod_status::spawn(stores.clone(), outbox.clone(), token.clone());
    custom_status::spawn(
        client.clone(),
        &args.cluster_id,
        outbox.clone(),
        token.clone(),
    );
    let nodes = capacity::spawn(
        client.clone(),
        stores.clone(),
        registry.clone(),
        outbox.clone(),
        applier.clone(),
        args.node_labels(),
        token.clone(),
    );
    let networks_changed = Arc::new(tokio::sync::Notify::new());
    networks::follow(
        nodes.store,
        nodes.changed,
        args.provider_cidrs.clone(),
        api_service,
        applier.networks(),
        networks_changed.clone(),
        token.clone(),
    );
    spawn_fence_writer(
        applier.clone(),
        networks_changed,
        leading.clone(),
        token.clone(),
    );
    volumes::spawn(
        client.clone(),
        &args.cluster_id,
        claim_feed,
        outbox.clone(),
        token.clone(),
    );
    let kubelet = kubelet::KubeletService {
        identities: identities.clone(),
        stores,
        registry: registry.clone(),
        max_sessions: args.max_kubelet_sessions as usize,
        applier: applier.clone(),
        stats: kubelet::stats::StatsReader::new(args.pod_stats),
    };
    events::spawn(
        identities.clone(),
        outbox.clone(),
        applier.objects().clone(),
        token.clone(),
    );
    if let Some(path) = &args.policy {
        // What `limits` loaded; a change from here on is followed.
        let text = std::fs::read_to_string(path).unwrap_or_default();
        policy_file::follow(
            path.clone(),
            text,
            args.base_policy(),
            policy_file::Effects {
                applier: applier.clone(),
                outbox: outbox.clone(),
                metrics: metrics.policy.clone(),
                registry: registry.clone(),
                client: client.clone(),
                leading: leading.clone(),
                custom_kinds: custom_kinds::CustomKindWatches {
                    client: client.clone(),
                    provider: args.cluster_id.clone(),
                    objects: applier.objects().clone(),
                    outbox: outbox.clone(),
                    identities: identities.clone(),
                    shutdown: token.clone(),
                },
            },
            token.clone(),
        );
    }
    let reflection = sync::ReflectionService {
        cluster_id: args.cluster_id.clone(),
        registry: registry.clone(),
        outbox,
        applier: applier.clone(),
        metrics: metrics.clone(),
        shutdown: token.clone(),
        write_share: sync::share::WriteShare::new(
            usize::from(args.apply_concurrency_total),
            usize::from(args.apply_concurrency),
            args.tenant_write_rate,
        ),
        started: std::time::Instant::now(),
        client,
        tenant_expiry: args.tenant_expiry,
        tenancy: tenancy.clone(),
        ack_linger: args.ack_linger,
    };
    let inspect = inspect::InspectService {
        registry,
        applier,
        drift,
    };

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ReflectionServer<sync::ReflectionService>>()
        .await;
    health_reporter
        .set_serving::<InspectServer<inspect::InspectService>>()
        .await;
    health_reporter
        .set_serving::<KubeletServer<kubelet::KubeletService>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(refract_wire::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    // grpcurl 1.8 and many tools still ask the v1alpha reflection service.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(refract_wire::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("failed to bind --listen {}", args.listen))?;
    let grpc_addr = listener.local_addr()?;
    let incoming = tls_listener::incoming(
        listener,
        server_tls,
        access,
        metrics.handshakes.clone(),
        access::sources::Sources::new(args.max_connections_per_source as usize),
        token.clone(),
    );
    tracing::info!(%grpc_addr, %admin_addr, cluster_id = %args.cluster_id, "remote agent serving");
    admin.set_ready(true);

    let signal_token = token.clone();
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(args.keepalive_interval))
        .http2_keepalive_timeout(Some(args.keepalive_timeout))
        // A client opens one Sync stream and a few short calls; more is abuse, and an
        // unbounded number of streams per connection is memory the client decides.
        .max_concurrent_streams(Some(args.max_concurrent_streams))
        // Log and exec output of kubelet calls shares each connection with the reflection
        // stream; a connection window above the calls' stream windows together keeps output
        // an origin reads slowly from holding up that stream.
        .initial_stream_window_size(Some(refract_core::limits::STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(refract_core::limits::CONNECTION_WINDOW_BYTES))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        // A request's headers, all HEADERS and CONTINUATION frames together: gRPC metadata is
        // small, and a client streaming CONTINUATION frames is cut off after a few of them.
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_connection_age(args.max_connection_age)
        .max_connection_age_grace(args.max_connection_age_grace)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            ReflectionServer::new(reflection)
                .max_decoding_message_size(refract_core::limits::MAX_MESSAGE_BYTES),
        )
        .add_service(InspectServer::new(inspect))
        .add_service(KubeletServer::new(kubelet))
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            // Stops accepting, ends open sessions, then lets tonic drain.
            signal_token.cancel();
        });
    let drain_deadline = async {
        token.cancelled().await;
        tokio::time::sleep(SHUTDOWN_DRAIN).await;
    };
    let result = tokio::select! {
        r = served => r,
        _ = drain_deadline => {
            tracing::warn!(after = ?SHUTDOWN_DRAIN, "connections still open at shutdown; closing them");
            Ok(())
        }
    };
    token.cancel();
    // The tenants served here are released, so that other replicas take them at once.
    tenancy.released(SHUTDOWN_DRAIN).await;
    tracing::info!("remote agent stopped");
    result.context("gRPC server failed")
}

/// Writes every twin namespace's fences (binding, ResourceQuota, LimitRange, NetworkPolicy)
/// while this replica runs the work that spans tenants: once the namespaces are listed and
/// whenever it starts leading (the policy may have changed meanwhile), and again whenever the
/// provider's networks change.
fn spawn_fence_writer(
    applier: apply::Applier,
    networks_changed: Arc<tokio::sync::Notify>,
    mut leading: tokio::sync::watch::Receiver<bool>,
    token: CancellationToken,
) {
    tokio::spawn(async move {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = applier.objects().namespaces_listed() => {}
        }
        let mut was_leading = false;
        loop {
            let now_leading = *leading.borrow_and_update();
            if now_leading && !was_leading {
                applier.write_all_fences().await;
            }
            was_leading = now_leading;
            tokio::select! {
                _ = token.cancelled() => return,
                changed = leading.changed() => if changed.is_err() { return },
                _ = networks_changed.notified() => {
                    if *leading.borrow() {
                        applier.write_all_fences().await;
                    }
                }
            }
        }
    });
}
