//! Kinds watched whole, foreign objects included.
//!
//! Kubernetes up to 1.22 refuses the guarded create ([`crate::apply`]) for Services, so a new
//! Service cannot be created in one request that is sure not to take over a same-named foreign
//! one; the applier would have to read each new Service before writing it. With every Service
//! of the cluster in the watch's store, it tells a new Service from a foreign one without that
//! read: absent from the store means absent as far as the API server's cache knows, which is
//! what the read (served from the same cache, and followed by a separate write) would tell.
//! Neither is race-free: a foreign Service created within that lag could be taken over. Only
//! the guarded create is, where the API server takes it.
//!
//! The restorer must still see only what a watch of the agent's own objects shows:
//! [`OwnEvents`] passes on the events of objects labelled for this provider, and turns the
//! first event of an object that lost those labels into its deletion, as the API server does
//! for a label-selected watch, so that the copy is restored.

use std::collections::HashMap;

use kube::runtime::watcher::Event;
use kube::ResourceExt;
use refract_shared::keys::{DESTINATION_LABEL, ORIGIN_LABEL};
use refract_shared::options::Kind;

use super::Meta;
use crate::kinds::Allowed;

/// The kinds watched whole.
pub(super) const WATCHED_WHOLE: &[Allowed] = &[Allowed::Reflected(Kind::Service)];

/// Filters a whole kind's watch events down to those of this provider's tenant objects.
pub(super) struct OwnEvents {
    provider: String,
    /// Objects labelled for this provider, by namespace and name, with their origin label.
    labelled: HashMap<(String, String), Option<String>>,
}

impl OwnEvents {
    pub(super) fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_string(),
            labelled: HashMap::new(),
        }
    }

    fn is_labelled(&self, obj: &Meta) -> bool {
        obj.labels().get(DESTINATION_LABEL) == Some(&self.provider)
    }

    /// The event a watch of this provider's objects would have sent, if any.
    pub(super) fn pass(&mut self, event: Event<Meta>) -> Option<Event<Meta>> {
        match event {
            // A relist: the objects labelled now are listed again.
            Event::Init => {
                self.labelled.clear();
                Some(Event::Init)
            }
            Event::InitDone => Some(Event::InitDone),
            Event::InitApply(obj) => self.remember(&obj).then_some(Event::InitApply(obj)),
            Event::Apply(obj) => {
                if self.remember(&obj) {
                    Some(Event::Apply(obj))
                } else {
                    self.unlabelled(obj).map(Event::Delete)
                }
            }
            Event::Delete(obj) => {
                if self.is_labelled(&obj) {
                    self.labelled.remove(&key(&obj));
                    Some(Event::Delete(obj))
                } else {
                    self.unlabelled(obj).map(Event::Delete)
                }
            }
        }
    }

    /// Records `obj` if it is labelled for this provider; says whether it is.
    fn remember(&mut self, obj: &Meta) -> bool {
        if !self.is_labelled(obj) {
            return false;
        }
        let origin = obj.labels().get(ORIGIN_LABEL).cloned();
        self.labelled.insert(key(obj), origin);
        true
    }

    /// An unlabelled object that was labelled before, with its labels put back as they were
    /// (what tells the restorer whose it is); `None` for an object that never was ours.
    fn unlabelled(&mut self, mut obj: Meta) -> Option<Meta> {
        let origin = self.labelled.remove(&key(&obj))?;
        let labels = obj.labels_mut();
        labels.insert(DESTINATION_LABEL.to_string(), self.provider.clone());
        if let Some(origin) = origin {
            labels.insert(ORIGIN_LABEL.to_string(), origin);
        }
        Some(obj)
    }
}

fn key(obj: &Meta) -> (String, String) {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{DynamicObject, ObjectMeta};
    use kube::core::PartialObjectMeta;

    fn service(name: &str, labels: &[(&str, &str)]) -> Meta {
        let mut meta: PartialObjectMeta<DynamicObject> = PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            _phantom: Default::default(),
        };
        for (k, v) in labels {
            meta.labels_mut().insert(k.to_string(), v.to_string());
        }
        meta
    }

    fn ours(name: &str) -> Meta {
        service(
            name,
            &[(DESTINATION_LABEL, "provider"), (ORIGIN_LABEL, "origin")],
        )
    }

    fn deleted_labels(event: Option<Event<Meta>>) -> Option<(String, String)> {
        match event {
            Some(Event::Delete(obj)) => Some((
                obj.labels().get(ORIGIN_LABEL)?.clone(),
                obj.labels().get(DESTINATION_LABEL)?.clone(),
            )),
            _ => None,
        }
    }

    #[test]
    fn foreign_objects_are_not_passed_on() {
        let mut own = OwnEvents::new("provider");
        assert!(own.pass(Event::Apply(service("web", &[]))).is_none());
        assert!(own.pass(Event::Delete(service("web", &[]))).is_none());
        let elsewhere = service("web", &[(DESTINATION_LABEL, "other")]);
        assert!(own.pass(Event::Apply(elsewhere)).is_none());
    }

    #[test]
    fn own_objects_are_passed_on_as_they_are() {
        let mut own = OwnEvents::new("provider");
        assert!(matches!(
            own.pass(Event::Apply(ours("web"))),
            Some(Event::Apply(_))
        ));
        assert!(matches!(
            own.pass(Event::Delete(ours("web"))),
            Some(Event::Delete(_))
        ));
        // Gone: its name is forgotten, a foreign object of that name later is not ours.
        assert!(own.pass(Event::Apply(service("web", &[]))).is_none());
    }

    #[test]
    fn an_object_that_loses_its_labels_is_deleted_once_with_its_old_labels() {
        let mut own = OwnEvents::new("provider");
        own.pass(Event::Apply(ours("web")));
        let stripped = own.pass(Event::Apply(service("web", &[])));
        assert_eq!(
            deleted_labels(stripped),
            Some(("origin".into(), "provider".into()))
        );
        assert!(own.pass(Event::Apply(service("web", &[]))).is_none());
        assert!(own.pass(Event::Delete(service("web", &[]))).is_none());
    }

    #[test]
    fn a_relist_forgets_objects_it_does_not_list() {
        let mut own = OwnEvents::new("provider");
        own.pass(Event::Apply(ours("gone")));
        own.pass(Event::Init);
        assert!(matches!(
            own.pass(Event::InitApply(ours("kept"))),
            Some(Event::InitApply(_))
        ));
        assert!(own
            .pass(Event::InitApply(service("foreign", &[])))
            .is_none());
        own.pass(Event::InitDone);
        assert!(own.pass(Event::Apply(service("gone", &[]))).is_none());
        assert!(deleted_labels(own.pass(Event::Apply(service("kept", &[])))).is_some());
    }
}
