//! Refract's origin-side agent.
//!
//! Data flow: [`link`] keeps one mutual-TLS stream to the remote agent open ([`connector`]
//! dials and checks the provider's identity, [`backoff`] spaces reconnects); producers of
//! desired state send on the current session; messages from the remote agent come back on
//! an inbound channel and are dispatched here.

pub mod backoff;
mod cli;
pub mod connector;
pub mod link;
pub mod metrics;

pub use cli::Args;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use refract_shared::proto::{remote_message, Outcome, RemoteMessage};
use refract_shared::telemetry::Admin;
use refract_shared::tls::{self, TlsFiles, Watched};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Runs the local agent until `shutdown` resolves.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tls::install_default_crypto_provider();
    let token = CancellationToken::new();
    let admin = Admin::default();
    let metrics = metrics::Metrics::register(&admin);
    admin
        .spawn(args.telemetry.admin_listen, token.clone())
        .await?;

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
    let own = client_tls.current().identity.clone();
    if own != args.cluster_id {
        anyhow::bail!(
            "--tls-cert identifies cluster {own:?} but --cluster-id is {:?}; issue the client certificate for this cluster",
            args.cluster_id.as_str()
        );
    }
    let server_name = connector::server_name_of(&args.remote, args.tls_server_name.as_deref())
        .map_err(anyhow::Error::msg)?;
    let _origin = kube_client(args.kubeconfig.as_deref()).await?;

    let (inbound_tx, mut inbound_rx) = mpsc::channel(1024);
    let mut sessions = link::spawn_link(
        link::LinkConfig {
            connector: connector::Connector {
                addr: args.remote.clone(),
                server_name,
                expected: args.remote_cluster_id.clone(),
                tls: client_tls,
            },
            cluster_id: args.cluster_id.clone(),
            keepalive_interval: args.keepalive_interval,
            keepalive_timeout: args.keepalive_timeout,
            backoff: backoff::Backoff::new(args.min_backoff, args.max_backoff),
        },
        inbound_tx,
        metrics,
        token.clone(),
    );
    tracing::info!(remote = %args.remote, cluster_id = %args.cluster_id, remote_cluster_id = %args.remote_cluster_id, "local agent started");

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            changed = sessions.changed() => {
                if changed.is_err() { break; }
                // Ready once the first session is up; a later link drop does not make the
                // agent unready (it keeps working and reconnecting).
                if sessions.borrow().is_some() {
                    admin.set_ready(true);
                }
            }
            Some(message) = inbound_rx.recv() => dispatch(message),
        }
    }
    token.cancel();
    tracing::info!("local agent stopped");
    Ok(())
}

fn dispatch(message: RemoteMessage) {
    match message.kind {
        Some(remote_message::Kind::Ack(ack)) => {
            let outcome = Outcome::try_from(ack.outcome).unwrap_or(Outcome::Unspecified);
            let object = ack.object.map(|o| o.display()).unwrap_or_default();
            tracing::debug!(%object, outcome = outcome.as_str_name(), message = %ack.message, "ack");
        }
        other => tracing::debug!(?other, "message from remote agent"),
    }
}

/// A client for the origin cluster: `--kubeconfig`, else in-cluster, else `$KUBECONFIG`.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("failed to read --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig given and neither in-cluster config nor $KUBECONFIG works")?,
    };
    kube::Client::try_from(config).context("failed to build Kubernetes client")
}
