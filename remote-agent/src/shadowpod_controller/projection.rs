//! What the controller's two stores have in common: each keeps a projection of a watched kind
//! (less than the whole object, for memory), under that kind's identity, so that stores,
//! object references and owner references treat the projection as the object itself.

use kube::runtime::watcher;

/// `event` with each of its objects turned into what the store keeps of it.
pub fn event_of<K, P>(event: watcher::Event<K>, keep: impl Fn(K) -> P) -> watcher::Event<P> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(keep(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(keep(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(keep(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Implements `kube::Resource` for `$projection`, a struct with a `metadata: ObjectMeta`
/// field, as the namespaced kind `$kind`: its kind, group, version and plural are `$kind`'s.
macro_rules! resource_as {
    ($projection:ty, $kind:ty) => {
        impl kube::Resource for $projection {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::kind(&())
            }

            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::group(&())
            }

            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::version(&())
            }

            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::plural(&())
            }

            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use resource_as;
