//! A stand-in for the provider's storage provisioner, so claims get volumes without storage.
//!
//! Claims of a StorageClass whose provisioner is [`PROVISIONER`] get a PersistentVolume
//! pre-bound to them (capacity as requested, a hostPath nobody mounts), which the cluster's
//! own PV controller then binds, as with a real external provisioner. Released volumes with
//! reclaim policy Delete are deleted. Both sides of the provisioner protocol are the real
//! controller manager's; only the storage is fake.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

/// The provisioner name StorageClasses use to get fake volumes.
pub const PROVISIONER: &str = "refract.test/fake-provisioner";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Provisions and deletes volumes until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) {
    let provision = provision(client.clone());
    let reclaim = reclaim(client);
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = provision => {}
        _ = reclaim => {}
    }
}

async fn provision(client: kube::Client) {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let classes: Api<StorageClass> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client);
    let mut events = watcher(claims, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let claim = match event {
            Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => c,
            _ => continue,
        };
        let spec = claim.spec.clone().unwrap_or_default();
        if spec.volume_name.is_some() || claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(class_name) = spec.storage_class_name.clone() else {
            continue;
        };
        let class = match classes.get_opt(&class_name).await {
            Ok(Some(c)) if c.provisioner == PROVISIONER => c,
            _ => continue,
        };
        let uid = claim.uid().unwrap_or_default();
        let capacity = spec
            .resources
            .and_then(|r| r.requests)
            .map(|r| r.into_iter().filter(|(k, _)| k == "storage").collect());
        let volume = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(format!("pvc-{uid}")),
                annotations: Some(BTreeMap::from([(
                    PROVISIONED_BY.to_string(),
                    PROVISIONER.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity,
                access_modes: spec.access_modes,
                volume_mode: spec.volume_mode,
                storage_class_name: Some(class_name),
                persistent_volume_reclaim_policy: Some(
                    class.reclaim_policy.unwrap_or_else(|| "Delete".into()),
                ),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: claim.namespace(),
                    name: Some(claim.name_any()),
                    uid: Some(uid.clone()),
                    ..Default::default()
                }),
                // A real kubelet mounts it: a folder it creates on first use.
                host_path: Some(HostPathVolumeSource {
                    path: format!("/tmp/refract-fake-volumes/{uid}"),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Default::default()
            }),
            status: None,
        };
        match volumes.create(&PostParams::default(), &volume).await {
            Ok(_) => {
                tracing::info!(claim = %claim.name_any(), "fake provisioner created a volume")
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(error) => tracing::warn!(%error, "fake provisioner failed to create a volume"),
        }
    }
}

async fn reclaim(client: kube::Client) {
    let volumes: Api<PersistentVolume> = Api::all(client);
    let mut events = watcher(volumes.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let volume = match event {
            Ok(watcher::Event::Apply(v) | watcher::Event::InitApply(v)) => v,
            _ => continue,
        };
        let ours =
            volume.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER);
        let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete = volume
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        if ours && released && delete {
            let _ = volumes
                .delete(&volume.name_any(), &DeleteParams::default())
                .await;
        }
    }
}
