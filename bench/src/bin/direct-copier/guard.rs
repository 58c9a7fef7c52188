//! `--guarded`: what the copier must add to offer Refract's guarantees from one trusted
//! process, the benchmark's Liqo-shaped baseline.
//!
//! - A label-selected metadata watch of the provider namespace: only what this copier wrote
//!   (its origin label), and only metadata.
//! - A hash skip: every write carries the desired state's hash; an object whose hash is
//!   unchanged is not written again, so a restart that finds the provider up to date writes
//!   nothing.
//! - Drift restore: a version of a copy that this copier did not write (another resourceVersion
//!   than its last write's), or the copy deleted, queues the object to be written again.
//! - No takeover: an object is created with a POST, which fails on one that exists; one that
//!   exists without this copier's label is left alone and reported. Deletes carry the
//!   resourceVersion last written as a precondition, so an object changed since stays.
//! - Writes read back only the resourceVersion from the API server's answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::{PartialObjectMeta, Request};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use refract_core::keys::{DESIRED_HASH_ANNOTATION, ORIGIN_LABEL};
use refract_local_agent::reflect::queue::WorkQueue;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::FIELD_MANAGER;

/// What the copier knows of one provider copy it owns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// The desired-state hash the copy carries.
    pub hash: String,
    /// The resourceVersion of its last write, or as first seen.
    pub resource_version: Option<String>,
    /// A write or delete of it is under way: the watch's events for it are its own.
    pub in_flight: bool,
    /// Someone else changed it: the next copy writes whatever the hash says.
    pub drifted: bool,
}

/// What to do with one object.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The provider holds it as desired.
    Skip,
    /// Not known on the provider: create it, failing if it exists.
    Create,
    /// Known as ours: write it.
    Update,
    /// Gone at the origin and ours on the provider: delete it unless changed since.
    Delete(Option<String>),
    /// Gone at the origin and not ours on the provider.
    Nothing,
}

/// The step for an object whose origin has `desired_hash` (`None`: deleted) and whose copy the
/// copier knows as `known`.
pub fn step(desired_hash: Option<&str>, known: Option<&Written>) -> Step {
    match (desired_hash, known) {
        (None, None) => Step::Nothing,
        (None, Some(w)) => Step::Delete(w.resource_version.clone()),
        (Some(_), None) => Step::Create,
        (Some(hash), Some(w)) if !w.drifted && w.hash == hash => Step::Skip,
        (Some(_), Some(_)) => Step::Update,
    }
}

/// The copies one kind's copier owns, by name, kept by the provider watch and the writes.
#[derive(Clone, Default)]
pub struct Guard {
    known: Arc<Mutex<HashMap<String, Written>>>,
}

#[derive(Deserialize)]
struct Answer {
    metadata: AnswerMeta,
}

#[derive(Deserialize)]
struct AnswerMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

impl Guard {
    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Names of every copy known.
    pub fn names(&self) -> Vec<String> {
        self.known().keys().cloned().collect()
    }

    /// Watches the provider namespace's copies labelled as this origin's, returning once the
    /// first list is in: every copy is then known, with the hash it carries. Later events that
    /// are not the copier's own writes queue the object again.
    pub async fn watch<K>(
        &self,
        api: Api<PartialObjectMeta<K>>,
        cluster_id: &str,
        queue: WorkQueue<String>,
    ) -> anyhow::Result<()>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let config = watcher::Config::default().labels(&format!("{ORIGIN_LABEL}={cluster_id}"));
        // An `Api` of `PartialObjectMeta` lists and watches metadata only.
        let mut events = watcher(api, config).default_backoff().boxed();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitApply(meta) | watcher::Event::Apply(meta)) => {
                        if this.seen(&meta.metadata) {
                            queue.add(meta.metadata.name.unwrap_or_default());
                        }
                    }
                    Ok(watcher::Event::Delete(meta)) => {
                        let name = meta.metadata.name.unwrap_or_default();
                        if this.gone(&name) {
                            queue.add(name);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Init) | Err(_) => {}
                }
            }
        });
        listed.await?;
        Ok(())
    }

    /// A version of a copy was seen; whether it must be written again (someone else wrote it).
    fn seen(&self, meta: &ObjectMeta) -> bool {
        let (name, resource_version) = (
            meta.name.clone().unwrap_or_default(),
            meta.resource_version.clone(),
        );
        let mut known = self.known();
        match known.get_mut(&name) {
            None => {
                // Written before this process started (or by another copier of this origin).
                let hash = meta
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
                    .cloned();
                known.insert(
                    name,
                    Written {
                        hash: hash.unwrap_or_default(),
                        resource_version,
                        ..Written::default()
                    },
                );
                false
            }
            Some(w) if w.in_flight || w.resource_version == resource_version => false,
            Some(w) => {
                w.drifted = true;
                true
            }
        }
    }

    /// A copy was deleted; whether that was someone else (to be restored if still desired).
    fn gone(&self, name: &str) -> bool {
        let mut known = self.known();
        match known.get(name) {
            Some(w) if !w.in_flight => {
                known.remove(name);
                true
            }
            _ => false,
        }
    }

    /// Brings the copy `name` in `api` to `desired` (`None`: deleted at the origin).
    pub async fn copy(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        desired: Option<serde_json::Value>,
    ) -> anyhow::Result<()> {
        let desired = desired.map(|mut object| {
            let hash = refract_core::hash::object_hash(&object);
            object["metadata"]["annotations"][DESIRED_HASH_ANNOTATION] = hash.clone().into();
            (object, hash)
        });
        let step = {
            let mut known = self.known();
            let step = step(desired.as_ref().map(|(_, h)| h.as_str()), known.get(name));
            if !matches!(step, Step::Skip | Step::Nothing) {
                known.entry(name.to_string()).or_default().in_flight = true;
            }
            step
        };
        let result = match (step, desired) {
            (Step::Skip | Step::Nothing, _) => return Ok(()),
            (Step::Delete(resource_version), _) => self.delete(api, name, resource_version).await,
            (Step::Create, Some((object, hash))) => match write(api, name, &object, false).await {
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    self.create_refused(api, name, &object, hash).await
                }
                written => self.written(name, hash, written),
            },
            (Step::Update, Some((object, hash))) => {
                let written = write(api, name, &object, true).await;
                self.written(name, hash, written)
            }
            (Step::Create | Step::Update, None) => unreachable!("a write has a desired state"),
        };
        if result.is_err() {
            let mut known = self.known();
            match known.get_mut(name) {
                // Never written: the retry creates it again (failing on a foreign object).
                Some(w) if w.resource_version.is_none() => {
                    known.remove(name);
                }
                // Written again on the retry, whatever the hash says.
                Some(w) => (w.in_flight, w.drifted) = (false, true),
                None => {}
            }
        }
        result
    }

    /// The create of `name` found an object there: written over only if it is ours (this
    /// origin's label), left alone and reported otherwise.
    async fn create_refused(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        object: &serde_json::Value,
        hash: String,
    ) -> anyhow::Result<()> {
        let existing = api.get_metadata(name).await?;
        let ours = existing.labels().get(ORIGIN_LABEL)
            == object["metadata"]["labels"][ORIGIN_LABEL]
                .as_str()
                .map(str::to_string)
                .as_ref();
        if ours {
            let written = write(api, name, object, true).await;
            return self.written(name, hash, written);
        }
        self.known().remove(name);
        eprintln!("not copying {name}: the provider holds a foreign object of that name");
        Ok(())
    }

    fn written(
        &self,
        name: &str,
        hash: String,
        written: Result<Option<String>, kube::Error>,
    ) -> anyhow::Result<()> {
        let resource_version = written?;
        self.known().insert(
            name.to_string(),
            Written {
                hash,
                resource_version,
                in_flight: false,
                drifted: false,
            },
        );
        Ok(())
    }

    async fn delete(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        resource_version: Option<String>,
    ) -> anyhow::Result<()> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version,
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            // Deleted, gone already, or changed since the last write (then it stays).
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        self.known().remove(name);
        Ok(())
    }
}

/// Creates (POST) or, with `apply`, server-side applies `object` as `name`; returns the
/// written resourceVersion, the only field read from the answer.
async fn write(
    api: &Api<DynamicObject>,
    name: &str,
    object: &serde_json::Value,
    apply: bool,
) -> Result<Option<String>, kube::Error> {
    let url = api.resource_url();
    let request = if apply {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        Request::new(url).patch(name, &params, &Patch::Apply(object))
    } else {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        serde_json::to_vec(object)
            .map_err(kube::core::request::Error::SerializeBody)
            .and_then(|body| Request::new(url).create(&params, body))
    }
    .map_err(kube::Error::BuildRequest)?;
    let client = kube::Client::from(api.clone());
    Ok(client
        .request::<Answer>(request)
        .await?
        .metadata
        .resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(hash: &str, drifted: bool) -> Written {
        Written {
            hash: hash.into(),
            resource_version: Some("7".into()),
            in_flight: false,
            drifted,
        }
    }

    #[test]
    fn an_unchanged_hash_is_not_written_again_unless_the_copy_drifted() {
        assert_eq!(step(Some("a"), Some(&known("a", false))), Step::Skip);
        assert_eq!(step(Some("a"), Some(&known("a", true))), Step::Update);
        assert_eq!(step(Some("b"), Some(&known("a", false))), Step::Update);
    }

    #[test]
    fn unknown_copies_are_created_and_only_known_ones_deleted() {
        assert_eq!(step(Some("a"), None), Step::Create);
        assert_eq!(step(None, None), Step::Nothing);
        assert_eq!(
            step(None, Some(&known("a", false))),
            Step::Delete(Some("7".into()))
        );
    }

    fn meta(name: &str, resource_version: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(resource_version.into()),
            annotations: Some([(DESIRED_HASH_ANNOTATION.into(), "h".into())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_watch_queues_only_versions_the_copier_did_not_write() {
        let guard = Guard::default();
        // First sight: known with the hash it carries, nothing to do.
        assert!(!guard.seen(&meta("x", "5")));
        assert_eq!(guard.known()["x"].hash, "h");
        // Its own version again, or any version while a write is under way.
        assert!(!guard.seen(&meta("x", "5")));
        guard.known().get_mut("x").unwrap().in_flight = true;
        assert!(!guard.seen(&meta("x", "6")));
        // Someone else's version: drifted and queued.
        guard.known().get_mut("x").unwrap().in_flight = false;
        assert!(guard.seen(&meta("x", "6")));
        assert!(guard.known()["x"].drifted);
        // Deleted by someone else: forgotten and queued; an unknown name is not.
        assert!(guard.gone("x"));
        assert!(!guard.gone("x"));
    }
}
