//! Refract's origin-side agent.
//!
//! Data flow: [`link`] keeps one mutual-TLS stream to the remote agent open ([`connector`]
//! dials and checks the provider's identity, [`refract_core::backoff`] spaces reconnects). [`extension`]
//! turns `NamespaceOffloading`s ([`crd`]) into twin namespaces on the provider and publishes
//! which namespaces are extended on the current session; one [`reflect`] reflector per kind
//! forges and sends the desired state of their objects (options from [`config`]). Acks come
//! back on the inbound channel to the [`outbox`] every producer sends through. Pods bound to the [`virtual_node`]
//! are offloaded by [`pods`] (placed by the [`webhook`]), with their ServiceAccount tokens
//! ([`tokens`]); provider volumes of reflected claims become origin PVs ([`volumes`]).
//! [`unpeer`] ends the peering when an operator asks.

mod cli;
pub use refract_admin::crd;
pub mod config;
pub mod connector;
pub mod custom_status;
mod early;
pub mod events;
pub mod extension;
pub mod inbound;
pub mod key;
pub mod kubelet;
pub mod link;
pub mod metrics;
pub mod outbox;
pub mod pods;
pub mod preview;
pub mod recorder;
pub mod reflect;
pub mod resume;
pub mod scheduling_gate;
pub mod settings;
mod throttle;
pub mod tokens;
pub mod unpeer;
pub mod virtual_node;
pub mod volumes;
pub mod watch_backoff;
pub mod webhook;

pub use cli::{Args, Cli, Command, Invocation};

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use kube::runtime::events::{Recorder, Reporter};
use refract_core::offloading;
use refract_core::options::Kind;
use refract_shared::telemetry::Admin;
use refract_shared::tls::{self, TlsFiles, Watched};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Runs the local agent until `shutdown` resolves.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tls::install_default_crypto_provider();
    // What every replica does (the webhook and what it reads), and the leader's work under it;
    // the admin endpoint outlives both when the agent has unpeered.
    let serving = CancellationToken::new();
    let token = serving.child_token();
    let admin_token = CancellationToken::new();
    let admin = Admin::default();
    let metrics = metrics::Metrics::register(&admin);
    admin
        .spawn(
            args.telemetry.admin_listen,
            args.telemetry.admin_auth,
            admin_token.clone(),
        )
        .await?;

    let client_tls = client_identity(&args, &admin, &serving)?;
    let server_name = args
        .remote
        .server_name(args.tls_server_name.as_deref())
        .map_err(anyhow::Error::msg)?;
    let origin = refract_shared::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    admin.review_readers_with(origin.clone());
    let candidacy = args
        .leader_election
        .candidacy(
            refract_core::keys::local_agent_lease(args.remote_cluster_id.as_str()),
            origin.default_namespace(),
        )
        .map_err(anyhow::Error::msg)?;
    let sources = settings::Sources {
        flags: args.reflection.clone(),
        local: args.cluster_id.to_string(),
        remote: args.remote_cluster_id.to_string(),
        sharing_flag: args.sharing_percentage,
        virtual_node: args.node_name(),
    };
    let initial = sources.read()?;
    if initial.options.api_server.enabled && initial.options.api_server.address().is_none() {
        tracing::warn!("API server support is on but --home-api-server-host/--home-api-server-port are not set: offloaded pods get origin tokens, but their KUBERNETES_SERVICE_* still point at the provider's API server");
    }
    let settings::Followed {
        options,
        sharing_percentage,
    } = settings::follow(sources, initial, metrics.settings.clone(), serving.clone());

    let offloadings = extension::watch_offloadings(origin.clone(), serving.clone());
    let offloadings_cache = offloadings.store.clone();
    let offloadings_changed = offloadings.gate.clone();
    if let (Some(listen), Some(cert), Some(key)) =
        (args.webhook_listen, &args.webhook_cert, &args.webhook_key)
    {
        let store = offloadings.store.clone();
        webhook::spawn(
            origin.clone(),
            store,
            listen,
            cert,
            key,
            args.cert_poll_interval,
            serving.clone(),
        )
        .await?;
    }
    // Ready as soon as it serves the webhook, leader or standby: the webhook's Service then
    // has an endpoint whenever one replica runs. Which replica leads is the Lease's to say
    // (and `refract_local_leader`'s).
    admin.set_ready(true);
    tokio::pin!(shutdown);
    let leadership = match candidacy {
        None => None,
        Some(candidacy) => {
            let elector = refract_shared::leader::Elector::new(origin.clone(), candidacy);
            tokio::select! {
                _ = &mut shutdown => {
                    serving.cancel();
                    admin_token.cancel();
                    tracing::info!("local agent stopped while standing by");
                    return Ok(());
                }
                leadership = elector.acquire() => Some(leadership),
            }
        }
    };
    metrics.leader.set(1);

    let pod_addresses = refract_core::inbound::address::PodAddresses {
        remapping: refract_core::remap::Remapping(args.remote_pod_remap.clone()),
        allowed: args.remote_pod_cidr.clone(),
    };
    if !pod_addresses.is_bounded() {
        tracing::warn!("neither --remote-pod-cidr nor --remote-pod-remap is set: any provider pod IP but loopback, link-local, multicast and unspecified ones reaches origin EndpointSlices; name the provider's pod ranges to refuse the rest");
    }
    let (inbound_tx, inbound_rx) = mpsc::channel(1024);
    // The virtual node's labels, published by the node as it applies them.
    let (labels_tx, labels_rx) = watch::channel(offloading::virtual_node_labels(
        args.remote_cluster_id.as_str(),
        &args.reflection.node_labels(),
    ));
    let connector = connector::Connector {
        addr: args.remote.dial(),
        server_name,
        expected: args.remote_cluster_id.clone(),
        tls: client_tls,
    };
    let unpeering = unpeer::Unpeering {
        client: origin.clone(),
        node: args.node_name(),
        remote_cluster_id: args.remote_cluster_id.to_string(),
        connector: connector.clone(),
        work: token.clone(),
    };
    let sessions = link::spawn_link(
        link::LinkConfig {
            connector,
            cluster_id: args.cluster_id.clone(),
            keepalive_interval: args.keepalive_interval,
            keepalive_timeout: args.keepalive_timeout,
            send_window: args.send_window,
            backoff: refract_core::backoff::Backoff::new(args.min_backoff, args.max_backoff),
        },
        inbound_tx,
        metrics.clone(),
        token.clone(),
    );
    let outbox = outbox::Outbox::default();
    outbox.spawn_gauges(metrics.outbox.clone(), token.clone());
    outbox.observe_answers(metrics.answer_latency.clone());
    let recorder = Recorder::new(
        origin.clone(),
        Reporter {
            controller: "refract-local-agent".into(),
            instance: Some(format!("{}-{}", args.cluster_id, args.remote_cluster_id)),
        },
    );
    let (extension_tx, extension_rx) = watch::channel(extension::Extension::default());
    tokio::spawn(extension::run(
        origin.clone(),
        extension::ExtensionConfig {
            local_cluster_id: args.cluster_id.to_string(),
            remote_cluster_id: args.remote_cluster_id.to_string(),
            virtual_node_labels: labels_rx,
            recorder: recorder.clone(),
        },
        offloadings,
        sessions.clone(),
        outbox.clone(),
        extension_tx,
        token.clone(),
    ));
    tokio::spawn(scheduling_gate::run(
        origin.clone(),
        offloadings_cache,
        offloadings_changed,
        recorder.clone(),
        token.clone(),
    ));
    let (capacity_tx, capacity_rx) = watch::channel(None);
    let (readiness_tx, readiness_rx) = watch::channel(None);
    let kubelet_port = args.kubelet_listen.map(|a| a.port());
    // Dropped at cancellation, not just at its next tick: an unpeer deletes the node right
    // after, and a heartbeat still under way would write it back.
    tokio::spawn(token.clone().run_until_cancelled_owned(virtual_node::run(
        origin.clone(),
        virtual_node::NodeConfig {
            name: args.node_name(),
            remote_cluster_id: args.remote_cluster_id.to_string(),
            node_ip: args.node_ip.clone(),
            sharing_percentage,
            health_interval: args.health_check_interval,
            health_failures: args.health_failure_threshold,
            extra_labels: args.reflection.node_labels(),
            kubelet_port,
            refused_labels: metrics.refused_counter("node_label"),
            refused_capacity: metrics.refused_counter("capacity"),
        },
        sessions.clone(),
        capacity_rx,
        readiness_tx,
        labels_tx,
        token.clone(),
    )));
    let pods = spawn_pods_and_tokens(
        &origin,
        &args,
        pod_addresses,
        &metrics,
        &options,
        &extension_rx,
        &recorder,
        &outbox,
        readiness_rx,
        &token,
    );
    spawn_kubelet(&args, &origin, &sessions, &pods, &token).await?;
    let reflectors = reflect::start::spawn_all(
        origin.clone(),
        options.clone(),
        extension_rx.clone(),
        &outbox,
        recorder,
        metrics.relists.clone(),
        token.clone(),
    );
    let events = spawn_event_intake(&outbox, &origin, &args, &options, &metrics, &token);
    let custom_status = custom_status::CustomStatusIntake::spawn(
        origin.clone(),
        options.clone(),
        outbox.clone(),
        token.clone(),
    );
    let volumes = volumes::VolumeIntake::spawn_with_claims(
        origin,
        options,
        extension_rx,
        reflectors.claims,
        token.clone(),
    );
    let inbound = inbound::Inbound {
        outbox,
        capacity: capacity_tx,
        pods,
        volumes,
        events,
        custom_status,
    };
    tracing::info!(remote = %args.remote, cluster_id = %args.cluster_id, remote_cluster_id = %args.remote_cluster_id, "local agent started");

    let ended = serve(
        shutdown,
        leadership.as_ref(),
        unpeering,
        sessions,
        inbound_rx,
        inbound,
        &admin,
        &serving,
        &token,
        &args,
    )
    .await;
    serving.cancel();
    metrics.leader.set(0);
    if let Some(leadership) = leadership {
        if ended != Ended::LostLeadership {
            leadership.release().await;
        }
    }
    admin_token.cancel();
    if ended == Ended::LostLeadership {
        anyhow::bail!("lost the leadership Lease and stopped acting; exiting so that this replica starts again as a standby");
    }
    tracing::info!("local agent stopped");
    Ok(())
}

/// Why [`serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Asked to stop (also after an unpeer).
    Shutdown,
    /// Another replica leads now, or the Lease could not be renewed in time.
    LostLeadership,
}

/// Dispatches what the provider sends until `shutdown`, until leadership is lost, or until an
/// operator unpeers (then everything stops and the agent idles until `shutdown`, still holding
/// its Lease so that no standby peers again).
#[allow(clippy::too_many_arguments)]
async fn serve(
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    leadership: Option<&refract_shared::leader::Leadership>,
    unpeering: unpeer::Unpeering,
    mut sessions: watch::Receiver<Option<link::SessionTx>>,
    mut inbound_rx: mpsc::Receiver<refract_wire::proto::RemoteMessage>,
    inbound: inbound::Inbound,
    admin: &Admin,
    serving: &CancellationToken,
    token: &CancellationToken,
    args: &Args,
) -> Ended {
    let lost = async {
        match leadership {
            Some(leadership) => leadership.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let unpeered = tokio::spawn(unpeering.run());
    tokio::pin!(unpeered);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ended::Shutdown,
            _ = &mut lost => return Ended::LostLeadership,
            Ok(mode) = &mut unpeered => {
                serving.cancel();
                admin.set_ready(false);
                tracing::info!(remote_cluster_id = %args.remote_cluster_id, mode = mode.as_str(), "unpeered: the link is stopped for good; this agent now idles until stopped (remove its Deployment: started again, it peers again)");
                tokio::select! {
                    _ = &mut shutdown => return Ended::Shutdown,
                    _ = &mut lost => return Ended::LostLeadership,
                }
            }
            // An unpeer stops the link before it is done; the agent must outlive that.
            changed = sessions.changed(), if !token.is_cancelled() => {
                if changed.is_err() && !token.is_cancelled() {
                    return Ended::Shutdown;
                }
            }
            Some(message) = inbound_rx.recv() => inbound.dispatch(message),
        }
    }
}

/// The certificates the agent serves the origin's API server with, for their expiry metric.
fn served_certificates(args: &Args) -> Vec<(&'static str, std::path::PathBuf)> {
    let mut served = Vec::new();
    if let (Some(_), Some(cert)) = (args.webhook_listen, &args.webhook_cert) {
        served.push(("webhook", cert.clone()));
    }
    if let (Some(_), Some(cert)) = (args.kubelet_listen, &args.kubelet_cert) {
        served.push(("kubelet", cert.clone()));
    }
    served
}

/// The client certificate, followed on disk, after checking it names `--cluster-id`.
fn client_identity(
    args: &Args,
    admin: &Admin,
    token: &CancellationToken,
) -> anyhow::Result<Watched<Arc<rustls::ClientConfig>>> {
    let files = TlsFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        ca: args.server_ca.clone(),
    };
    let client_tls: Watched<Arc<rustls::ClientConfig>> = Watched::spawn(
        files,
        args.cert_poll_interval,
        tls::client_config,
        token.clone(),
    )
    .context("failed to load the client certificate")?;
    refract_shared::telemetry::register_agent_info(
        admin,
        "refract_local",
        client_tls.clone(),
        served_certificates(args),
        token.clone(),
    );
    let own = client_tls.current().identity.clone();
    if own != args.cluster_id {
        anyhow::bail!(
            "--tls-cert identifies cluster {own:?} but --cluster-id is {:?}; issue the client certificate for this cluster",
            args.cluster_id.as_str()
        );
    }
    Ok(client_tls)
}

/// Starts pod offloading and the reflection of offloaded pods' ServiceAccount tokens, which
/// follows the pods; the pods follow the virtual node's readiness.
#[allow(clippy::too_many_arguments)]
fn spawn_pods_and_tokens(
    origin: &kube::Client,
    args: &Args,
    pod_addresses: refract_core::inbound::address::PodAddresses,
    metrics: &metrics::Metrics,
    options: &settings::LiveOptions,
    extension_rx: &watch::Receiver<extension::Extension>,
    recorder: &Recorder,
    outbox: &outbox::Outbox,
    readiness_rx: watch::Receiver<Option<bool>>,
    token: &CancellationToken,
) -> Arc<pods::PodOffloader> {
    let pods = pods::spawn(
        origin.clone(),
        pods::PodConfig {
            node_name: args.node_name(),
            node_ip: args.node_ip.clone(),
            pod_addresses,
            workers: args.pod_reflection_workers,
            refused: metrics.refused_counter("pod_status"),
            running_latency: metrics.pod_running_latency.clone(),
            status_latency: metrics.pod_status_latency.clone(),
        },
        options.clone(),
        extension_rx.clone(),
        recorder.clone(),
        outbox,
        token.clone(),
    );
    let tokens = tokens::spawn(
        origin.clone(),
        tokens::TokenConfig {
            pods: pods.pods(),
            refresh_percentage: args.token_refresh_percentage,
        },
        options.clone(),
        extension_rx.clone(),
        recorder.clone(),
        outbox,
        token.clone(),
    );
    let follower = pods.clone();
    tokio::spawn(token.clone().run_until_cancelled_owned(async move {
        follower.follow_node_readiness(readiness_rx).await
    }));
    if let Some(tokens) = tokens {
        pods.follow(move |pod| tokens.pod_changed(pod));
    }
    pods
}

/// Serves the virtual node's kubelet API (logs, exec, attach, port-forward, stats) when
/// `--kubelet-listen` is set.
async fn spawn_kubelet(
    args: &Args,
    origin: &kube::Client,
    sessions: &watch::Receiver<Option<link::SessionTx>>,
    pods: &Arc<pods::PodOffloader>,
    token: &CancellationToken,
) -> anyhow::Result<()> {
    if let (Some(listen), Some(cert), Some(key)) =
        (args.kubelet_listen, &args.kubelet_cert, &args.kubelet_key)
    {
        kubelet::spawn(
            kubelet::KubeletConfig {
                listen,
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.kubelet_client_ca.clone(),
                cert_poll: args.cert_poll_interval,
            },
            kubelet::Backend {
                origin: origin.clone(),
                sessions: sessions.clone(),
                pods: pods.clone(),
                node_name: args.node_name(),
                started_unix_nanos: k8s_openapi::jiff::Timestamp::now()
                    .as_nanosecond()
                    .clamp(0, i64::MAX as i128) as i64,
                decisions: Default::default(),
                tokens: Default::default(),
            },
            token.clone(),
        )
        .await?;
    } else {
        tracing::warn!("no --kubelet-listen: kubectl logs, exec, attach and port-forward will not work for offloaded pods");
    }
    Ok(())
}

/// Starts the intake of provider events, which resolves each through what the outbox sent.
fn spawn_event_intake(
    outbox: &outbox::Outbox,
    origin: &kube::Client,
    args: &Args,
    options: &settings::LiveOptions,
    metrics: &metrics::Metrics,
    token: &CancellationToken,
) -> Arc<events::EventIntake> {
    if options.current().events.workers == 0 {
        tracing::info!("provider event reflection disabled (0 workers): no provider event is recorded at the origin");
    }
    // Provider events resolve through what the outbox sent: pods by their ShadowPods.
    let mut reflected = events::ReflectedKinds::new();
    for kind in Kind::ALL {
        let resolver: Arc<dyn events::Reflected> = outbox.resolver(outbox::Producer::Objects(kind));
        reflected.insert(kind.kind(), resolver);
    }
    for kind in ["Pod", "ShadowPod"] {
        reflected.insert(kind, outbox.resolver(outbox::Producer::Pods));
    }
    let intake = events::EventIntake::spawn(
        reflected,
        options.current().events,
        events::origin::KubeEventWriter {
            client: origin.clone(),
            local_id: args.cluster_id.to_string(),
            remote_id: args.remote_cluster_id.to_string(),
        },
        args.event_rate,
        metrics.events.clone(),
        token.clone(),
    );
    // The event reflection policy and workers, and the custom kinds, follow the reflection
    // values file.
    let mut changes = options.changes();
    let following = intake.clone();
    let outbox = outbox.clone();
    let add_custom_kinds = move |options: &refract_core::options::ReflectionOptions| {
        for custom in &options.custom_kinds {
            let kind = Kind::Custom(custom.kind);
            following.add_kind(
                kind.kind(),
                outbox.resolver(outbox::Producer::Objects(kind)),
            );
        }
    };
    add_custom_kinds(&options.current());
    let following = intake.clone();
    tokio::spawn(token.clone().run_until_cancelled_owned(async move {
        while changes.changed().await.is_ok() {
            let options = changes.borrow_and_update().clone();
            following.set_reflection(options.events);
            add_custom_kinds(&options);
        }
    }));
    intake
}
