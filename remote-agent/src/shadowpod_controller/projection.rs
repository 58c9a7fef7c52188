//! What the controller's two stores have in common: each keeps a projection of a watched kind
//! (less than the whole object, for memory), under that kind's identity
//! ([`refract_shared::resource_as`]).

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
