//! Streams the persistent volumes the provider bound to tenants' claims back to their origin.
//!
//! Level-triggered like the pod status stream: every few seconds (and at every change) each
//! bound volume of a tenant claim is sent unless the tenant's current session already has it,
//! so a reconnecting origin gets them all again without asking. A volume is only sent to the
//! tenant whose labels its claim carries.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::hash::desired_hash;
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL};
use refract_shared::tls::ClusterId;
use refract_wire::proto::{remote_message, PersistentVolume as VolumeMessage, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::delivered::Delivered;
use crate::registry::Registry;

/// How often every volume is re-checked against what each session has.
const RESCAN: Duration = Duration::from_secs(2);

/// Starts the volume stream.
pub fn spawn(
    client: kube::Client,
    provider: &ClusterId,
    registry: Registry,
    shutdown: CancellationToken,
) {
    let (volumes, volumes_writer) = reflector::store::<PersistentVolume>();
    let (claims, claims_writer) = reflector::store::<PersistentVolumeClaim>();
    let volume_feed = watcher(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(volumes_writer)
    .for_each(|_| futures::future::ready(()));
    let claim_feed = watcher(
        Api::<PersistentVolumeClaim>::all(client),
        watcher::Config::default().labels(&format!("{DESTINATION_LABEL}={provider}")),
    )
    .default_backoff()
    .reflect(claims_writer)
    .for_each(|_| futures::future::ready(()));
    let stream = send_loop(volumes, claims, registry);
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = volume_feed => {}
            _ = claim_feed => {}
            _ = stream => {}
        }
    });
}

async fn send_loop(
    volumes: Store<PersistentVolume>,
    claims: Store<PersistentVolumeClaim>,
    registry: Registry,
) {
    let mut delivered = Delivered::default();
    let mut tick = tokio::time::interval(RESCAN);
    loop {
        tick.tick().await;
        for volume in volumes.state() {
            let Some((tenant, message)) = message_for(&volume, &claims) else {
                continue;
            };
            let Some(session) = registry.session_of(&tenant) else {
                continue;
            };
            let hash = desired_hash(&serde_json::json!([volume.metadata.name, volume.spec]));
            let uid = volume.uid().unwrap_or_default();
            if delivered.has(&uid, &session, &hash) {
                continue;
            }
            let message = RemoteMessage {
                kind: Some(remote_message::Kind::PersistentVolume(message)),
            };
            if registry.send_to(&tenant, message) {
                tracing::info!(%tenant, volume = %volume.name_any(), "sent a provider volume to its origin");
                delivered.record(uid, session, hash);
            }
        }
        let live: std::collections::HashSet<String> =
            volumes.state().iter().filter_map(|v| v.uid()).collect();
        delivered.retain(&live);
    }
}

/// The tenant and message for `volume`, when it is bound to a tenant's claim.
fn message_for(
    volume: &PersistentVolume,
    claims: &Store<PersistentVolumeClaim>,
) -> Option<(ClusterId, VolumeMessage)> {
    let claim_ref = volume.spec.as_ref()?.claim_ref.as_ref()?;
    let (namespace, name) = (claim_ref.namespace.clone()?, claim_ref.name.clone()?);
    let claim = claims.get(&ObjectRef::new(&name).within(&namespace))?;
    // Bound both ways: the claim names this volume and the volume names this very claim.
    let bound = claim.spec.as_ref()?.volume_name.as_deref() == Some(volume.name_any().as_str())
        && claim_ref
            .uid
            .as_ref()
            .is_none_or(|uid| Some(uid.clone()) == claim.uid());
    if !bound {
        return None;
    }
    let tenant = ClusterId::parse(claim.labels().get(ORIGIN_LABEL)?).ok()?;
    Some((
        tenant,
        VolumeMessage {
            claim_namespace: namespace,
            claim_name: name,
            volume_json: serde_json::to_vec(volume).ok()?,
        },
    ))
}
