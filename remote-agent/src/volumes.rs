//! Streams the persistent volumes the provider bound to tenants' claims back to their origin.
//!
//! Like the pod status stream: when a volume or a tenant's claim changes, the volume bound to
//! it is put in the tenant's [`Outbox`] (sent unless the tenant's current session has it, and
//! again to a reconnecting origin), or taken out once it is no longer bound. A volume is only
//! sent to the tenant whose labels its claim carries.

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

use crate::objects::Feed;
use crate::outbox::{Outbox, Subject};

/// What changed: a volume (by name), or a claim naming the volume it is bound to.
enum Changed {
    Volume(String),
    Claim(Option<String>),
}

/// Starts the volume stream.
///
/// Its watch of claims also feeds the tenant objects' store of them (`feed`).
pub fn spawn(
    client: kube::Client,
    provider: &ClusterId,
    feed: Feed,
    outbox: Outbox,
    shutdown: CancellationToken,
) {
    let (volumes, volumes_writer) = reflector::store::<PersistentVolume>();
    let (claims, claims_writer) = reflector::store::<PersistentVolumeClaim>();
    let volume_changes = watcher(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(volumes_writer)
    .touched_objects()
    .filter_map(|r| futures::future::ready(r.ok().map(|v| Changed::Volume(v.name_any()))));
    let claim_changes = feed
        .feeding(
            watcher(
                Api::<PersistentVolumeClaim>::all(client),
                watcher::Config::default().labels(&format!("{DESTINATION_LABEL}={provider}")),
            )
            .default_backoff(),
        )
        .reflect(claims_writer)
        .touched_objects()
        .filter_map(|r| {
            futures::future::ready(
                r.ok()
                    .map(|c| Changed::Claim(c.spec.and_then(|s| s.volume_name))),
            )
        });
    let mut changes = futures::stream::select(volume_changes, claim_changes).boxed();
    tokio::spawn(async move {
        let ready = async {
            let _ = volumes.wait_until_ready().await;
            let _ = claims.wait_until_ready().await;
        };
        // The watches run (the stream is polled) while the stores list.
        let listed = async {
            tokio::pin!(ready);
            loop {
                tokio::select! {
                    _ = &mut ready => return true,
                    c = changes.next() => if c.is_none() { return false },
                }
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            listed = listed => if !listed { return },
        }
        for volume in volumes.state() {
            offer(&volumes, &claims, &outbox, &volume.name_any());
        }
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => return,
                c = changes.next() => match c {
                    Some(c) => c,
                    None => return,
                },
            };
            match change {
                Changed::Volume(name) | Changed::Claim(Some(name)) => {
                    offer(&volumes, &claims, &outbox, &name)
                }
                Changed::Claim(None) => {}
            }
        }
    });
}

/// Puts volume `name` in the outbox of the tenant whose claim it is bound to, or takes it out.
fn offer(
    volumes: &Store<PersistentVolume>,
    claims: &Store<PersistentVolumeClaim>,
    outbox: &Outbox,
    name: &str,
) {
    let subject = Subject::volume(name);
    let bound = volumes
        .get(&ObjectRef::new(name))
        .and_then(|volume| Some((message_for(&volume, claims)?, volume)));
    let Some(((tenant, message), volume)) = bound else {
        outbox.remove(&subject);
        return;
    };
    let hash = desired_hash(&serde_json::json!([volume.metadata.name, volume.spec]));
    tracing::debug!(%tenant, volume = %name, "a provider volume for its origin");
    outbox.put(
        &tenant,
        subject,
        hash,
        RemoteMessage {
            kind: Some(remote_message::Kind::PersistentVolume(message)),
        },
    );
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
