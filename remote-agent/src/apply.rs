//! Applying tenants' requests to the provider cluster.

use refract_shared::proto::{Delete, Outcome, Upsert};
use refract_shared::tls::ClusterId;

/// Writes tenants' objects into the provider cluster with the remote agent's own identity.
#[derive(Clone)]
pub struct Applier {
    #[allow(dead_code)]
    client: kube::Client,
}

impl Applier {
    /// An applier writing with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// Applies one Upsert for `tenant`.
    pub async fn upsert(&self, _tenant: &ClusterId, upsert: &Upsert) -> (Outcome, String) {
        let kind = upsert
            .object
            .as_ref()
            .map(|o| o.kind.as_str())
            .unwrap_or("");
        (
            Outcome::Denied,
            format!("kind {kind:?} is not reflected by this remote agent"),
        )
    }

    /// Applies one Delete for `tenant`.
    pub async fn delete(&self, _tenant: &ClusterId, delete: &Delete) -> (Outcome, String) {
        let kind = delete
            .object
            .as_ref()
            .map(|o| o.kind.as_str())
            .unwrap_or("");
        (
            Outcome::Denied,
            format!("kind {kind:?} is not reflected by this remote agent"),
        )
    }
}
