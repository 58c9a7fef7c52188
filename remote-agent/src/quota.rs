//! Per-tenant quotas: how much of the provider one tenant may hold, all its namespaces together.
//!
//! Every object the remote agent writes for a tenant carries its footprint ([`footprint`]):
//! what it counts for (one object of its kind, its bytes, and for pods, claims and Services the
//! resources a Kubernetes ResourceQuota would count). The watch of tenant objects adds the
//! footprints up per tenant ([`crate::objects`]), so the usage survives a restart, and an
//! object is written only if the usage it leaves stays within the tenant's [`Quota`]
//! ([`check`]). A change that does not grow the usage is always let through, so lowering a
//! quota below what a tenant holds never blocks its objects' updates, only their growth.
//!
//! Kubernetes backs the count for what it can count ([`backstop`]): a ResourceQuota in each
//! twin namespace with the tenant's limits, and a LimitRange giving containers the requests
//! and limits the quota needs, so an error in this accounting cannot exceed them.

pub mod backstop;
pub mod footprint;

use std::collections::BTreeMap;

use refract_core::quantity::parse_milli;
use serde::{Deserialize, Serialize};

pub use footprint::Footprint;

/// The footprint key of twin namespaces.
pub const NAMESPACES: &str = "namespaces";
/// The footprint key of the bytes of the tenant's objects, as sent.
pub const BYTES: &str = "bytes";
/// The prefix of the footprint keys counting objects of one kind (`objects/ConfigMap`).
pub const OBJECTS_PREFIX: &str = "objects/";

/// The ResourceQuota keys a quota's `hard` may set, besides `requests.<extended resource>`:
/// what Kubernetes counts and the remote agent counts the same way.
pub const HARD_KEYS: &[&str] = &[
    "pods",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.storage",
    "persistentvolumeclaims",
    "services.loadbalancers",
    "services.nodeports",
];

/// An amount: a Kubernetes quantity (`500m`, `4Gi`) or a count, in milli-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount(pub i128);

impl Amount {
    /// `n` whole units.
    pub const fn units(n: i128) -> Self {
        Self(n * 1000)
    }

    /// As a Kubernetes quantity.
    pub fn quantity(self) -> String {
        if self.0 % 1000 == 0 {
            (self.0 / 1000).to_string()
        } else {
            format!("{}m", self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        let milli = match Raw::deserialize(d)? {
            Raw::Number(n) => Some(i128::from(n) * 1000),
            Raw::Text(text) => parse_milli(&text),
        };
        match milli {
            Some(m) if m >= 0 => Ok(Self(m)),
            _ => Err(serde::de::Error::custom(
                "is not a quantity of zero or more (such as 10, 500m or 4Gi)",
            )),
        }
    }
}

impl Serialize for Amount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.quantity().serialize(s)
    }
}

/// What one tenant may hold on this provider, all its namespaces together. See the README's
/// "Provider policy" for the defaults and the file format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Quota {
    /// Twin namespaces.
    pub namespaces: Amount,
    /// Objects of any one kind (ConfigMaps, Secrets, Services, ShadowPods, ...).
    pub objects_per_kind: Amount,
    /// The bytes of all the tenant's objects together, as the origin sent them.
    pub bytes: Amount,
    /// Kubelet calls (logs, exec, attach, port-forward) open at once; never more than
    /// `--max-kubelet-sessions`.
    pub kubelet_sessions: u32,
    /// ResourceQuota limits over all the tenant's namespaces together: [`HARD_KEYS`], and
    /// `requests.<extended resource>`. A key not set is not limited.
    pub hard: BTreeMap<String, Amount>,
    /// What a container that does not say gets (and is counted for): requests and limits by
    /// resource, set by a LimitRange in each twin namespace when `hard` limits that resource.
    pub container_defaults: ContainerDefaults,
}

/// Requests and limits a container gets when it names none.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ContainerDefaults {
    /// Requests by resource (`cpu`, `memory`, `ephemeral-storage`).
    pub requests: BTreeMap<String, Amount>,
    /// Limits by resource.
    pub limits: BTreeMap<String, Amount>,
}

impl Default for ContainerDefaults {
    fn default() -> Self {
        Self {
            requests: BTreeMap::from([
                ("cpu".into(), Amount(100)),
                ("memory".into(), Amount::units(128 << 20)),
            ]),
            limits: BTreeMap::from([
                ("cpu".into(), Amount::units(1)),
                ("memory".into(), Amount::units(512 << 20)),
            ]),
        }
    }
}

impl Default for Quota {
    /// Bounds that hold a tenant to a share an operator can plan for, and leave CPU and memory
    /// to the virtual node's share of the provider's free resources.
    fn default() -> Self {
        Self {
            namespaces: Amount::units(100),
            objects_per_kind: Amount::units(20_000),
            bytes: Amount::units(256 << 20),
            kubelet_sessions: 32,
            hard: BTreeMap::from([
                ("pods".into(), Amount::units(1000)),
                ("persistentvolumeclaims".into(), Amount::units(100)),
                ("services.loadbalancers".into(), Amount::units(5)),
                ("services.nodeports".into(), Amount::units(10)),
            ]),
            container_defaults: ContainerDefaults::default(),
        }
    }
}

impl Quota {
    /// Refuses keys of `hard` that neither Kubernetes nor the agent counts.
    pub fn validate(&self) -> Result<(), String> {
        for key in self.hard.keys() {
            let extended = key
                .strip_prefix("requests.")
                .is_some_and(|resource| resource.contains('/'));
            if !extended && !HARD_KEYS.contains(&key.as_str()) {
                return Err(format!(
                    "quota.hard.{key}: not a quota the provider counts (one of {}, or requests.<extended resource> such as requests.nvidia.com/gpu)",
                    HARD_KEYS.join(", ")
                ));
            }
        }
        let defaults = &self.container_defaults;
        for (resource, request) in &defaults.requests {
            if defaults
                .limits
                .get(resource)
                .is_some_and(|limit| limit < request)
            {
                return Err(format!(
                    "quota.containerDefaults.requests.{resource}: more than the default limit"
                ));
            }
        }
        Ok(())
    }

    /// The limit on footprint key `key`, and the policy key that sets it; `None` when it is not
    /// limited.
    pub fn limit_of(&self, key: &str) -> Option<(Amount, String)> {
        if key == NAMESPACES {
            return Some((self.namespaces, "quota.namespaces".into()));
        }
        if key == BYTES {
            return Some((self.bytes, "quota.bytes".into()));
        }
        if key.starts_with(OBJECTS_PREFIX) {
            return Some((self.objects_per_kind, "quota.objectsPerKind".into()));
        }
        self.hard
            .get(key)
            .map(|limit| (*limit, format!("quota.hard.{key}")))
    }
}

impl Quota {
    /// The quota as node resources (`requests.cpu` as `cpu`, `pods` as `pods`), for the
    /// virtual node, which offers no more: quantity text by resource name.
    pub fn node_caps(&self) -> BTreeMap<String, String> {
        self.hard
            .iter()
            .filter_map(|(key, amount)| {
                let resource = match key.as_str() {
                    "pods" => "pods",
                    other => other.strip_prefix("requests.")?,
                };
                (resource != "storage").then(|| (resource.to_string(), amount.quantity()))
            })
            .collect()
    }
}

/// A change that would take a tenant over a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quota exceeded: {policy_key} is {}, the tenant holds {} and this asks for {} more", .limit.quantity(), .used.quantity(), .asked.quantity())]
pub struct Exceeded {
    /// The policy key of the quota.
    pub policy_key: String,
    /// The quota.
    pub limit: Amount,
    /// What the tenant holds without the object.
    pub used: Amount,
    /// What the object adds.
    pub asked: Amount,
}

/// Whether replacing `old` (what the object counts for now, if anything) by `new` keeps the
/// tenant's `usage` (which includes `old`) within `quota`. Only what grows is checked.
pub fn check(
    quota: &Quota,
    usage: &Footprint,
    old: &Footprint,
    new: &Footprint,
) -> Result<(), Exceeded> {
    for (key, wanted) in new.iter() {
        let before = old.get(key);
        if wanted <= before {
            continue;
        }
        let Some((limit, policy_key)) = quota.limit_of(key) else {
            continue;
        };
        let used = (usage.get(key) - before).max(0);
        if used + wanted > limit.0 {
            return Err(Exceeded {
                policy_key,
                limit,
                used: Amount(used),
                asked: Amount(wanted - before),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(pairs: &[(&str, i128)]) -> Footprint {
        Footprint::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), *v)))
    }

    #[test]
    fn amounts_read_quantities_and_counts_and_refuse_the_rest() {
        let read = |text: &str| serde_yaml_ng::from_str::<Amount>(text);
        assert_eq!(read("10").unwrap(), Amount::units(10));
        assert_eq!(read("500m").unwrap(), Amount(500));
        assert_eq!(read("1Ki").unwrap(), Amount::units(1024));
        assert!(read("-1").is_err());
        assert!(read("lots").is_err());
        assert_eq!(Amount(1500).quantity(), "1500m");
        assert_eq!(Amount::units(3).quantity(), "3");
    }

    #[test]
    fn growth_past_a_limit_is_refused_naming_the_quota_and_the_usage() {
        let mut quota = Quota::default();
        quota.hard.insert("pods".into(), Amount::units(2));
        let usage = fp(&[("pods", 2000), ("objects/ShadowPod", 2000)]);
        let pod = fp(&[("pods", 1000), ("objects/ShadowPod", 1000)]);
        let refused = check(&quota, &usage, &Footprint::default(), &pod).unwrap_err();
        assert_eq!(refused.policy_key, "quota.hard.pods");
        assert_eq!(
            refused.to_string(),
            "quota exceeded: quota.hard.pods is 2, the tenant holds 2 and this asks for 1 more"
        );
        // The same pod again (an update) asks for nothing more.
        assert_eq!(check(&quota, &usage, &pod, &pod), Ok(()));
    }

    #[test]
    fn what_does_not_grow_passes_even_over_a_lowered_quota() {
        let quota = Quota {
            bytes: Amount::units(100),
            ..Quota::default()
        };
        let usage = fp(&[("bytes", 500_000)]);
        let old = fp(&[("bytes", 300_000)]);
        assert_eq!(
            check(&quota, &usage, &old, &fp(&[("bytes", 200_000)])),
            Ok(())
        );
        assert!(check(&quota, &usage, &old, &fp(&[("bytes", 301_000)])).is_err());
    }

    #[test]
    fn unlimited_keys_pass_and_unknown_hard_keys_are_refused() {
        let quota = Quota::default();
        let usage = Footprint::default();
        let big = fp(&[("requests.cpu", 1_000_000_000)]);
        assert_eq!(check(&quota, &usage, &Footprint::default(), &big), Ok(()));
        let mut bad = Quota::default();
        bad.hard.insert("cpu".into(), Amount::units(1));
        assert!(bad.validate().unwrap_err().contains("quota.hard.cpu"));
        let mut gpu = Quota::default();
        gpu.hard
            .insert("requests.nvidia.com/gpu".into(), Amount::units(1));
        assert_eq!(gpu.validate(), Ok(()));
    }
}
