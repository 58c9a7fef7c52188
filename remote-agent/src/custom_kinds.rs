//! Custom kinds the followed policy file names after the agent started: each is registered
//! and watched from then on (the tenant objects' store, and the status of the copies), as the
//! kinds named at start are (`lib.rs`), so tenants may write it without a restart.

use std::collections::BTreeSet;

use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use tokio_util::sync::CancellationToken;

use crate::identity::Identities;
use crate::kinds::{custom, Allowed, CustomKindName};
use crate::objects::TenantObjects;
use crate::outbox::Outbox;

/// What watching one more custom kind needs.
pub struct CustomKindWatches {
    pub client: kube::Client,
    pub provider: ClusterId,
    pub objects: TenantObjects,
    pub outbox: Outbox,
    pub identities: Identities,
    pub shutdown: CancellationToken,
}

impl CustomKindWatches {
    /// Registers and watches every kind of `names` not registered yet. One that cannot be
    /// registered (a kind name another group took first, or too many kinds) is logged and
    /// stays refused: tenants' objects of an unknown kind are refused by name.
    pub async fn watch_new(&self, names: &BTreeSet<CustomKindName>) {
        let registered = custom::registered();
        let mut added = Vec::new();
        for name in names {
            if registered.iter().any(|k| k.name() == name) {
                continue;
            }
            match custom::register(name) {
                Ok(kind) => added.push(kind),
                Err(error) => {
                    tracing::error!(kind = %name, %error, "custom kind added to the policy cannot be watched; tenants' objects of it are refused until the agent restarts with a policy that can")
                }
            }
        }
        if added.is_empty() {
            return;
        }
        let added_names: Vec<CustomKindName> = added.iter().map(|k| k.name().clone()).collect();
        if let Err(error) = self.identities.check_role(&added_names).await {
            tracing::warn!(error = %format!("{error:#}"), "cannot check that tenants may write the custom kinds added to the policy");
        }
        for kind in added {
            self.objects
                .watch_kind(Allowed::Reflected(Kind::Custom(kind)));
            crate::custom_status::watch(
                self.client.clone(),
                &self.provider,
                self.outbox.clone(),
                kind,
                self.shutdown.clone(),
            );
            tracing::info!(kind = %kind.name(), "custom kind added to the policy: watched from now on, and written for the tenants it lists, each write checked against the provider's CustomResourceDefinition");
        }
    }
}
