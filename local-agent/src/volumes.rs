//! The storage fabric at the origin: provider volumes become origin PVs, and go with their
//! claims.
//!
//! Claims of the virtual storage class are reflected by the generic reflector (kind
//! PersistentVolumeClaim). When the provider has bound one, its PV comes back on the stream;
//! here it becomes an origin PV pre-bound to the claim and pinned to the virtual node, which
//! the origin's PV controller binds (and the scheduler then lets the claim's pod onto the
//! virtual node). Only a claim this agent reflects gets a PV, named after the claim's UID: a
//! provider cannot make the agent write any other PV. When the claim is deleted, its PV is
//! released and, if its reclaim policy is Delete, removed here (the provider removes its own).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::forge::{self, Context, Decision};
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL};
use refract_core::lock::Locked;
use refract_core::options::ReflectionOptions;
use refract_wire::proto::PersistentVolume as VolumeMessage;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::early::{self, Early};
use crate::extension::Extension;
use crate::reflect::queue::Latest;
use crate::reflect::Reflector;
use crate::settings::LiveOptions;
use crate::throttle::Throttle;

/// The most volumes, and volume bytes, held for claims not known here yet.
const EARLY_VOLUMES: usize = 1024;
const EARLY_VOLUME_BYTES: usize = 4 * 1024 * 1024;

/// Why a provider volume is not made an origin PV.
enum Refusal {
    /// What it is about is not known here yet: its namespace is not extended yet, or the
    /// claim watch has not seen the claim yet (both happen as a session starts).
    NotYet,
    /// It is not acceptable.
    Invalid(String),
}

/// Attempts at creating one origin PV before waiting for the provider to send it again.
const CREATE_ATTEMPTS: u32 = 5;

/// Turns provider volumes into origin PVs.
pub struct VolumeIntake {
    client: kube::Client,
    options: LiveOptions,
    extension: watch::Receiver<Extension>,
    claims: Arc<Reflector<PersistentVolumeClaim>>,
    /// Origin PVs to create, the latest per claim.
    pending: Latest<String, PersistentVolume>,
    /// Volumes for a claim not known here yet, by claim ([`crate::early`]).
    early: Mutex<Early<String, VolumeMessage>>,
    log: Throttle,
}

impl VolumeIntake {
    /// Starts the intake and the clean-up of released origin PVs.
    pub fn spawn(
        client: kube::Client,
        options: LiveOptions,
        extension: watch::Receiver<Extension>,
        claims: Arc<Reflector<PersistentVolumeClaim>>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let cleanup = delete_released(client.clone(), options.current());
        let intake = Arc::new(Self {
            client,
            options,
            extension,
            claims,
            pending: Latest::default(),
            early: Mutex::new(Early::new(EARLY_VOLUMES, EARLY_VOLUME_BYTES)),
            log: Throttle::new(Duration::from_secs(10)),
        });
        let writer = intake.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = cleanup => {}
                _ = writer.write_volumes() => {}
                _ = writer.retry_early() => {}
            }
        });
        intake
    }

    /// Starts the intake once claims are reflected: at once if they are, or the first time the
    /// settings turn them on. Until then the cell stays empty and volumes are ignored.
    pub fn spawn_with_claims(
        client: kube::Client,
        options: LiveOptions,
        extension: watch::Receiver<Extension>,
        mut claims: watch::Receiver<Option<Arc<Reflector<PersistentVolumeClaim>>>>,
        shutdown: CancellationToken,
    ) -> Arc<OnceLock<Arc<Self>>> {
        let cell = Arc::new(OnceLock::new());
        let start = {
            let cell = cell.clone();
            move |claims| {
                let intake = Self::spawn(client, options, extension, claims, shutdown);
                let _ = cell.set(intake);
            }
        };
        let reflected = claims.borrow_and_update().clone();
        match reflected {
            // Before the first message can come: no volume is ignored for want of the intake.
            Some(reflector) => start(reflector),
            None => {
                tokio::spawn(async move {
                    if let Ok(reflector) = claims.wait_for(Option::is_some).await {
                        if let Some(reflector) = reflector.clone() {
                            start(reflector);
                        }
                    }
                });
            }
        }
        cell
    }

    /// Takes a provider volume; never waits. A volume for a claim this agent reflects is kept,
    /// the latest per claim, for the writer; one whose claim or namespace is not known here
    /// yet waits ([`crate::early`]); anything else is refused here.
    pub fn offer(&self, message: VolumeMessage) {
        if let Some(message) = self.settle(message) {
            let what = claim_of(&message);
            tracing::debug!(claim = %what, "a volume for a claim not known here yet; held");
            let dropped = self.early_volumes().hold(what, message, Instant::now());
            self.refuse_early(dropped);
        }
    }

    /// Queues the origin PV of `message` or refuses it; gives it back when its claim or
    /// namespace is not known here yet.
    fn settle(&self, message: VolumeMessage) -> Option<VolumeMessage> {
        let what = claim_of(&message);
        match self.origin_volume(&message) {
            Ok(Some(volume)) => self.pending.put(what, volume),
            Ok(None) => {}
            Err(Refusal::NotYet) => return Some(message),
            Err(Refusal::Invalid(reason)) => {
                if let Some(suppressed) = self.log.allow("volume") {
                    tracing::warn!(claim = %what, %reason, suppressed, "ignoring a volume from the provider");
                }
            }
        }
        None
    }

    fn early_volumes(&self) -> std::sync::MutexGuard<'_, Early<String, VolumeMessage>> {
        self.early.locked()
    }

    fn refuse_early(&self, dropped: Vec<VolumeMessage>) {
        if dropped.is_empty() {
            return;
        }
        if let Some(suppressed) = self.log.allow("early volume") {
            tracing::warn!(dropped = dropped.len(), claims = ?early::some_subjects(&dropped), suppressed, held_at_most_seconds = early::MAX_WAIT.as_secs(), "ignoring volumes from the provider: their claims are not claims this agent reflects");
        }
    }

    /// Offers the held volumes again each second.
    async fn retry_early(&self) {
        early::retry_each_second(
            &self.early,
            |message| self.settle(message),
            |dropped| self.refuse_early(dropped),
        )
        .await;
    }

    /// Creates the origin PVs offered, one claim at a time.
    async fn write_volumes(&self) {
        loop {
            let (what, volume) = self.pending.next().await;
            if let Some(volume) = volume {
                self.create(&what, volume).await;
            }
        }
    }

    async fn create(&self, what: &str, volume: PersistentVolume) {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let name = volume.name_any();
        for attempt in 1..=CREATE_ATTEMPTS {
            match api.create(&PostParams::default(), &volume).await {
                Ok(_) => {
                    tracing::info!(claim = %what, volume = %name, "created the origin volume of a provider volume");
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => return, // made on an earlier message
                Err(error) => {
                    tracing::warn!(claim = %what, volume = %name, attempt, %error, "failed to create the origin volume");
                    tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
                }
            }
        }
    }

    /// The origin PV for `message`; `Ok(None)` when there is nothing to do (already bound),
    /// `Err` when the provider named something this agent did not send.
    fn origin_volume(&self, message: &VolumeMessage) -> Result<Option<PersistentVolume>, Refusal> {
        let extension = self.extension.borrow().clone();
        let local_ns = extension
            .namespaces
            .iter()
            .find(|(_, remote)| **remote == message.claim_namespace)
            .map(|(local, _)| local.clone())
            .ok_or(Refusal::NotYet)?; // the namespace is not extended to this provider (yet)
        let claim = self
            .claims
            .get(&local_ns, &message.claim_name)
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .ok_or(Refusal::NotYet)?; // no such claim at the origin (yet)
        let options = self.options.current();
        let ctx = Context {
            options: &options,
            remote_namespace: &message.claim_namespace,
            service: None,
            nodes: &forge::NO_NODES,
        };
        if !matches!(forge::pvc::forge(&claim, &ctx), Ok(Decision::Reflect(_))) {
            return Err(Refusal::Invalid(
                "the claim is not one this agent reflects".into(),
            ));
        }
        let remote: PersistentVolume = serde_json::from_slice(&message.volume_json)
            .map_err(|e| Refusal::Invalid(format!("malformed PersistentVolume: {e}")))?;
        let claim_ref = remote.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        if claim_ref.and_then(|r| r.name.as_deref()) != Some(message.claim_name.as_str())
            || claim_ref.and_then(|r| r.namespace.as_deref())
                != Some(message.claim_namespace.as_str())
        {
            return Err(Refusal::Invalid(
                "the volume is not bound to that claim".into(),
            ));
        }
        let wanted = forge::volume::origin_volume_name(&claim);
        let bound = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
        if bound.is_some() && bound != wanted {
            return Ok(None); // bound to something else at the origin; leave it
        }
        forge::volume::origin_volume(&remote, &claim, &options)
            .map(Some)
            .map_err(|e| Refusal::Invalid(e.to_string()))
    }
}

/// The claim a provider volume names, for keys and logs.
fn claim_of(message: &VolumeMessage) -> String {
    format!(
        "{}/{}",
        refract_core::inbound::excerpt(&message.claim_namespace),
        refract_core::inbound::excerpt(&message.claim_name)
    )
}

/// Deletes origin PVs of this peering whose claim is gone (phase Released) and whose reclaim
/// policy is Delete: the provider deletes the real volume with its own claim.
async fn delete_released(client: kube::Client, options: Arc<ReflectionOptions>) {
    let api: Api<PersistentVolume> = Api::all(client);
    let selector = format!(
        "{ORIGIN_LABEL}={},{DESTINATION_LABEL}={}",
        options.local_cluster_id, options.remote_cluster_id
    );
    let mut events = watcher(api.clone(), watcher::Config::default().labels(&selector))
        .backoff(crate::watch_backoff::watch_backoff())
        .applied_objects()
        .boxed();
    while let Some(event) = events.next().await {
        let Ok(volume) = event else { continue };
        let spec = volume.spec.clone().unwrap_or_default();
        let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        if !released || spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: volume.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&volume.name_any(), &params).await {
            Ok(_) => {
                tracing::info!(volume = %volume.name_any(), "deleted the origin volume of a deleted claim")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(error) => {
                tracing::warn!(volume = %volume.name_any(), %error, "failed to delete a released volume")
            }
        }
    }
}
