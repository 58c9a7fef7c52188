//! The provider's free resources, as the virtual node's capacity.
//!
//! Capacity arrives as Kubernetes quantity text. Each quantity is parsed by the bounded parser
//! ([`crate::quantity::parse_milli`]: no loop, no overflow), capped at a sane maximum for its
//! resource (so a provider cannot advertise a million-core node and draw every pod), and shared
//! by `--sharing-percentage`. Unknown resource names must still be valid names; at most
//! [`MAX_RESOURCES`] are kept.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::labels::is_qualified_name;
use crate::quantity::{format_milli, parse_milli, share};

/// The most resource names a provider may advertise.
pub const MAX_RESOURCES: usize = 64;
/// The longest quantity text parsed.
const MAX_QUANTITY_TEXT: usize = 64;

const MILLI: i128 = 1000;
/// One million cores.
const MAX_CPU: i128 = 1_000_000 * MILLI;
/// 2^60 bytes (1 EiB), for memory, storage and huge pages.
const MAX_BYTES: i128 = (1 << 60) * MILLI;
/// One million: pods, GPUs, any counted resource.
const MAX_COUNT: i128 = 1_000_000 * MILLI;

/// The largest value, in milli-units, the origin believes for `resource`.
pub fn cap(resource: &str) -> i128 {
    match resource {
        "cpu" => MAX_CPU,
        "memory" | "ephemeral-storage" | "storage" => MAX_BYTES,
        r if r.starts_with("hugepages-") => MAX_BYTES,
        _ => MAX_COUNT,
    }
}

/// The virtual node's resources, and a reason for each entry refused or capped.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NodeResources {
    /// Resource name → quantity.
    pub resources: BTreeMap<String, Quantity>,
    /// `name: reason` for every entry dropped or capped.
    pub refused: Vec<String>,
}

/// `percent` of the provider's free resources, every entry checked.
pub fn node_resources(free: &BTreeMap<String, String>, percent: u32) -> NodeResources {
    let mut out = NodeResources::default();
    for (resource, text) in free {
        let name = super::excerpt(resource);
        if !is_qualified_name(resource) {
            out.refused
                .push(format!("{name}: not a valid resource name"));
            continue;
        }
        if out.resources.len() >= MAX_RESOURCES {
            out.refused.push(format!(
                "{name}: over the limit of {MAX_RESOURCES} resources"
            ));
            continue;
        }
        let parsed = (text.len() <= MAX_QUANTITY_TEXT)
            .then(|| parse_milli(text))
            .flatten();
        let Some(milli) = parsed else {
            out.refused.push(format!(
                "{name}: {:?} is not a quantity",
                super::excerpt(text)
            ));
            continue;
        };
        let limit = cap(resource);
        let milli = if milli > limit {
            out.refused.push(format!(
                "{name}: {} capped at {}",
                super::excerpt(text),
                format_milli(resource, limit)
            ));
            limit
        } else {
            milli
        };
        out.resources.insert(
            resource.clone(),
            Quantity(format_milli(resource, share(resource, milli, percent))),
        );
    }
    out
}

/// `resources` offered no more than the tenant's `quota` on the provider (resource name →
/// quantity), whatever share of free resources they are. A quota can only lower what is
/// offered: an entry for a resource not offered, or that does not read, changes nothing (the
/// latter is named in `refused`).
pub fn cap_by_quota(resources: &mut NodeResources, quota: &BTreeMap<String, String>) {
    for (resource, text) in quota.iter().take(MAX_RESOURCES) {
        let Some(offered) = resources.resources.get_mut(resource) else {
            continue;
        };
        let parsed = (text.len() <= MAX_QUANTITY_TEXT)
            .then(|| parse_milli(text))
            .flatten()
            .filter(|m| *m >= 0);
        let Some(limit) = parsed else {
            resources.refused.push(format!(
                "{}: quota {:?} is not a quantity",
                super::excerpt(resource),
                super::excerpt(text)
            ));
            continue;
        };
        let current = parse_milli(&offered.0).unwrap_or(0);
        if limit < current {
            *offered = Quantity(format_milli(resource, limit));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenants_quota_caps_what_is_offered_and_never_raises_it() {
        let mut r = node_resources(
            &free(&[("cpu", "10"), ("memory", "1Gi"), ("pods", "100")]),
            100,
        );
        cap_by_quota(
            &mut r,
            &free(&[
                ("cpu", "2"),
                ("memory", "4Gi"),
                ("nvidia.com/gpu", "1"),
                ("pods", "-1"),
            ]),
        );
        assert_eq!(r.resources["cpu"].0, "2000m");
        assert_eq!(r.resources["memory"].0, (1u64 << 30).to_string());
        assert!(!r.resources.contains_key("nvidia.com/gpu"));
        assert_eq!(r.resources["pods"].0, "100");
        assert_eq!(
            r.refused,
            vec![r#"pods: quota "-1" is not a quantity"#.to_string()]
        );
    }

    use crate::test_support::string_map as free;

    #[test]
    fn shares_free_resources() {
        let r = node_resources(
            &free(&[
                ("cpu", "7500m"),
                ("memory", "1000"),
                ("pods", "100"),
                ("nvidia.com/gpu", "1"),
            ]),
            90,
        );
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        let r = r.resources;
        assert_eq!(r["cpu"].0, "6750m");
        assert_eq!(r["memory"].0, "900");
        assert_eq!(r["pods"].0, "90");
        assert_eq!(r["nvidia.com/gpu"].0, "0");
    }

    #[test]
    fn hostile_capacity_is_capped_or_dropped() {
        let started = std::time::Instant::now();
        let r = node_resources(
            &free(&[
                ("cpu", "1e2147483647"),
                ("memory", "2000Pi"),
                ("pods", "-5"),
                ("bad name!", "1"),
                ("example.com/huge", "1e15"),
                ("example.com/long", &"9".repeat(10_000)),
            ]),
            100,
        );
        assert!(started.elapsed() < std::time::Duration::from_millis(100));
        assert!(!r.resources.contains_key("cpu"), "not a quantity: dropped");
        assert_eq!(r.resources["memory"].0, "1152921504606846976");
        assert_eq!(r.resources["pods"].0, "0", "negative counts become zero");
        assert_eq!(r.resources["example.com/huge"].0, "1000000");
        assert!(!r.resources.contains_key("example.com/long"));
        assert!(!r.resources.contains_key("bad name!"));
        assert_eq!(r.refused.len(), 5, "{:?}", r.refused);
    }

    #[test]
    fn keeps_at_most_the_limit() {
        let many: BTreeMap<String, String> = (0..500)
            .map(|i| (format!("example.com/r{i:03}"), "1".to_string()))
            .collect();
        let r = node_resources(&many, 100);
        assert_eq!(r.resources.len(), MAX_RESOURCES);
        assert_eq!(r.refused.len(), 500 - MAX_RESOURCES);
    }
}
