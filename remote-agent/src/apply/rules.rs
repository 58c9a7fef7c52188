//! The rules an [`Applier`] judges tenants' objects by: the policy file's, and the names no
//! tenant may take; swapped whole when the policy file changes, with what is already written
//! judged again.

use std::sync::Arc;

use refract_core::lock::RwLocked;
use refract_shared::tls::ClusterId;

use super::{judge, Applier, ApplyError, ObjectKey};
use crate::kinds::Allowed;
use crate::policy::{self, Policies};

/// What tenants may have written: the policy file's rules, and the names none may take.
/// Swapped whole when the policy file changes ([`Applier::set_policies`]).
pub(super) struct Rules {
    policies: Policies,
    reserved: policy::ReservedNames,
}

impl Rules {
    pub(super) fn new(policies: Policies, own_namespace: String) -> Self {
        let reserved = policy::ReservedNames {
            own_namespace,
            tenants: policies.named_tenants(),
        };
        Self { policies, reserved }
    }
}

impl Applier {
    /// Puts `policies` in force for every request from now on, and judges again every object
    /// the agent keeps whole (twin namespaces, ShadowPods, token Secrets): those the new
    /// policy refuses are returned, with why. Objects kept as a hash are judged again when the
    /// origin next sends them.
    pub fn set_policies(&self, policies: Policies) -> Vec<(ObjectKey, ApplyError)> {
        let own_namespace = self.rules.read_locked().reserved.own_namespace.clone();
        *self.rules.write_locked() = Arc::new(Rules::new(policies, own_namespace));
        self.policies_changed
            .send_modify(|n| *n = n.wrapping_add(1));
        self.desired
            .whole()
            .into_iter()
            .filter_map(|(key, desired)| {
                let refused = self.judged(&key.tenant, key.kind, desired).err()?;
                Some((key, refused))
            })
            .collect()
    }

    /// Changes whenever the policy in force changes.
    pub fn policies_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.policies_changed.subscribe()
    }

    /// The policy of `tenant` now in force.
    pub fn policy_of(&self, tenant: &ClusterId) -> policy::TenantPolicy {
        self.rules.read_locked().policies.of(tenant).clone()
    }

    /// The quota of `tenant` now in force.
    pub fn quota_of(&self, tenant: &ClusterId) -> crate::quota::Quota {
        self.rules.read_locked().policies.of(tenant).quota.clone()
    }

    /// The network fence `tenant`'s policy now in force asks for.
    pub fn network_fence_of(&self, tenant: &ClusterId) -> crate::network_fence::NetworkFence {
        self.rules.read_locked().policies.of(tenant).network.clone()
    }

    /// The object as the provider will hold it for `tenant` ([`judge::Judge`]).
    pub(super) fn judged(
        &self,
        tenant: &ClusterId,
        kind: Allowed,
        value: serde_json::Value,
    ) -> Result<serde_json::Value, ApplyError> {
        let rules = self.rules.read_locked().clone();
        judge::Judge {
            tenant,
            provider: &self.provider,
            policy: rules.policies.of(tenant),
            networks: &self.networks.read_locked(),
            reserved: &rules.reserved,
        }
        .judge(kind, value)
    }
}
