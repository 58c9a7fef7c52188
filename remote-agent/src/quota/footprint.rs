//! What one object counts for against its tenant's quota, computed from the object as the
//! provider will hold it, and stamped on it so that the watch of tenant objects can add it up.
//!
//! Pods count as Kubernetes' ResourceQuota counts them: a container without a request has its
//! limit, or the LimitRange's default ([`crate::quota::backstop`]); a pod's requests are the
//! larger of its containers' sum and its largest init container.

use std::collections::BTreeMap;

use refract_core::options::Kind;
use refract_core::quantity::parse_milli;

use super::{backstop, Quota, BYTES, NAMESPACES, OBJECTS_PREFIX};
use crate::kinds::Allowed;

/// The annotation carrying an object's footprint.
pub const ANNOTATION: &str = "refract.io/quota-footprint";

/// Amounts in milli-units by footprint key; keys with nothing are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint(BTreeMap<String, i128>);

impl Footprint {
    /// A footprint of these amounts (zero ones left out).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, i128)>) -> Self {
        let mut fp = Self::default();
        for (key, amount) in pairs {
            fp.add_to(&key, amount);
        }
        fp
    }

    /// The amount of `key`, zero when absent.
    pub fn get(&self, key: &str) -> i128 {
        self.0.get(key).copied().unwrap_or(0)
    }

    /// Every key and amount.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i128)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    fn add_to(&mut self, key: &str, amount: i128) {
        let total = self.get(key).saturating_add(amount);
        if total == 0 {
            self.0.remove(key);
        } else {
            self.0.insert(key.to_string(), total);
        }
    }

    /// Adds `other` in.
    pub fn add(&mut self, other: &Footprint) {
        for (key, amount) in other.iter() {
            self.add_to(key, amount);
        }
    }

    /// Takes `other` out.
    pub fn subtract(&mut self, other: &Footprint) {
        for (key, amount) in other.iter() {
            self.add_to(key, -amount);
        }
    }

    /// As the annotation's value: `key=milli` pairs joined by commas.
    pub fn encode(&self) -> String {
        let pairs: Vec<String> = self.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.join(",")
    }

    /// From the annotation's value; pairs that do not read are left out.
    pub fn decode(text: &str) -> Self {
        Self::from_pairs(text.split(',').filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_string(), value.parse().ok()?))
        }))
    }
}

/// What `object` (of `kind`, judged, `bytes` long as sent) counts for under `quota`.
pub fn of(kind: Allowed, object: &serde_json::Value, bytes: usize, quota: &Quota) -> Footprint {
    let mut fp = unstamped(kind);
    fp.add_to(BYTES, i128::try_from(bytes).unwrap_or(i128::MAX) * 1000);
    match kind {
        Allowed::Namespace => {}
        Allowed::ShadowPod => pod(&object["spec"]["pod"], quota, &mut fp),
        Allowed::Reflected(Kind::PersistentVolumeClaim) => {
            fp.add_to("persistentvolumeclaims", 1000);
            let storage = &object["spec"]["resources"]["requests"]["storage"];
            fp.add_to("requests.storage", milli(storage));
        }
        Allowed::Reflected(Kind::Service) => {
            let ports = object["spec"]["ports"].as_array().map_or(0, Vec::len);
            let ports = i128::try_from(ports).unwrap_or(0) * 1000;
            match object["spec"]["type"].as_str() {
                Some("NodePort") => fp.add_to("services.nodeports", ports),
                Some("LoadBalancer") => {
                    fp.add_to("services.loadbalancers", 1000);
                    fp.add_to("services.nodeports", ports);
                }
                _ => {}
            }
        }
        Allowed::Reflected(_) => {}
    }
    fp
}

/// What an object of `kind` without a stamped footprint counts for: one object, and one
/// namespace for a namespace.
pub fn unstamped(kind: Allowed) -> Footprint {
    let mut fp = Footprint::default();
    fp.add_to(&format!("{OBJECTS_PREFIX}{}", kind.kind()), 1000);
    if kind == Allowed::Namespace {
        fp.add_to(NAMESPACES, 1000);
    }
    fp
}

/// A quantity's milli-units; zero for anything that is not one.
fn milli(value: &serde_json::Value) -> i128 {
    match value {
        serde_json::Value::String(s) => parse_milli(s).unwrap_or(0).max(0),
        serde_json::Value::Number(n) => n.as_u64().map_or(0, |n| i128::from(n) * 1000),
        _ => 0,
    }
}

/// A container's requests and limits as the provider's API server will have them.
fn container(
    container: &serde_json::Value,
    defaulted: &[&str],
    quota: &Quota,
) -> (BTreeMap<String, i128>, BTreeMap<String, i128>) {
    let read = |field: &str| -> BTreeMap<String, i128> {
        container["resources"][field]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), milli(v)))
            .collect()
    };
    let (mut requests, mut limits) = (read("requests"), read("limits"));
    for (resource, limit) in &limits {
        // The API server's own default: a limit without a request is also the request.
        requests.entry(resource.clone()).or_insert(*limit);
    }
    let defaults = &quota.container_defaults;
    for resource in defaulted {
        if let Some(d) = defaults.requests.get(*resource) {
            requests.entry(resource.to_string()).or_insert(d.0);
        }
        if let Some(d) = defaults.limits.get(*resource) {
            limits.entry(resource.to_string()).or_insert(d.0);
        }
    }
    (requests, limits)
}

fn pod(spec: &serde_json::Value, quota: &Quota, fp: &mut Footprint) {
    fp.add_to("pods", 1000);
    let defaulted = backstop::defaulted_resources(quota);
    let mut sums: BTreeMap<String, i128> = BTreeMap::new();
    for c in spec["containers"].as_array().into_iter().flatten() {
        let (requests, limits) = container(c, &defaulted, quota);
        for (resource, amount) in requests {
            *sums.entry(format!("requests.{resource}")).or_default() += amount;
        }
        for (resource, amount) in limits {
            *sums.entry(format!("limits.{resource}")).or_default() += amount;
        }
    }
    // Init containers run one at a time, before the others: the pod needs the most of the
    // largest of them, or of its containers together.
    for c in spec["initContainers"].as_array().into_iter().flatten() {
        let (requests, limits) = container(c, &defaulted, quota);
        let prefixed = requests
            .into_iter()
            .map(|(r, a)| (format!("requests.{r}"), a))
            .chain(limits.into_iter().map(|(r, a)| (format!("limits.{r}"), a)));
        for (key, amount) in prefixed {
            let sum = sums.entry(key).or_default();
            *sum = (*sum).max(amount);
        }
    }
    for (key, amount) in sums {
        fp.add_to(&key, amount);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::quota::Amount;

    #[test]
    fn a_footprint_reads_back_what_it_wrote_and_skips_what_does_not_read() {
        let fp = Footprint::from_pairs([("pods".into(), 1000), ("bytes".into(), 52_000)]);
        assert_eq!(fp.encode(), "bytes=52000,pods=1000");
        assert_eq!(Footprint::decode(&fp.encode()), fp);
        assert_eq!(
            Footprint::decode("pods=1000,junk,cpu=x"),
            Footprint::from_pairs([("pods".into(), 1000)])
        );
    }

    #[test]
    fn a_pod_counts_as_its_resource_quota_would() {
        let mut quota = Quota::default();
        quota.hard.insert("requests.cpu".into(), Amount::units(4));
        let shadow = json!({"spec": {"pod": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}},
                {"name": "c"},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3"}}}],
        }}});
        let fp = of(Allowed::ShadowPod, &shadow, 300, &quota);
        assert_eq!(fp.get("pods"), 1000);
        assert_eq!(fp.get("objects/ShadowPod"), 1000);
        assert_eq!(fp.get("bytes"), 300_000);
        // 200m + 1 (its limit) + 100m (the default, cpu being limited) < the init's 3.
        assert_eq!(fp.get("requests.cpu"), 3000);
        // Memory is not limited: no default, only what is asked.
        assert_eq!(fp.get("requests.memory"), (64_i128 << 20) * 1000);
    }

    #[test]
    fn claims_and_exposed_services_count_their_storage_and_ports() {
        let quota = Quota::default();
        let claim = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
        let fp = of(
            Allowed::Reflected(Kind::PersistentVolumeClaim),
            &claim,
            10,
            &quota,
        );
        assert_eq!(fp.get("persistentvolumeclaims"), 1000);
        assert_eq!(fp.get("requests.storage"), (2_i128 << 30) * 1000);
        let lb = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}]}});
        let fp = of(Allowed::Reflected(Kind::Service), &lb, 10, &quota);
        assert_eq!(fp.get("services.loadbalancers"), 1000);
        assert_eq!(fp.get("services.nodeports"), 2000);
        let plain = json!({"spec": {"ports": [{"port": 80}]}});
        let fp = of(Allowed::Reflected(Kind::Service), &plain, 10, &quota);
        assert_eq!(fp.get("services.nodeports"), 0);
        let ns = of(Allowed::Namespace, &json!({}), 10, &quota);
        assert_eq!(ns.get("namespaces"), 1000);
    }
}
