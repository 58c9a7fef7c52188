//! Who else hears of a watch's objects, so a kind that several parts need is watched once
//! (EndpointSlices follow the Service reflector's watch, tokens the pod offloader's).

use std::sync::Mutex;

use refract_core::lock::Locked;

/// One callback.
type Follower<K> = Box<dyn Fn(&K) + Send + Sync>;

/// Callbacks told of every object a watch sees change.
pub struct Followers<K>(Mutex<Vec<Follower<K>>>);

impl<K> Default for Followers<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K> Followers<K> {
    /// Calls `follower` with every object told from now on.
    pub fn add(&self, follower: impl Fn(&K) + Send + Sync + 'static) {
        self.0.locked().push(Box::new(follower));
    }

    /// Tells every follower of `object`.
    pub fn tell(&self, object: &K) {
        for follower in self.0.locked().iter() {
            follower(object);
        }
    }
}
