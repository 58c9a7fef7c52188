//! What each tenant holds on the provider against its quota, as operators see it: the
//! `refract_remote_tenant_usage` and `refract_remote_tenant_quota` series, and the lines of
//! Inspect's view. Read when asked, from the watch of tenant objects: nothing is kept here.

use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use refract_shared::tls::ClusterId;

use crate::apply::Applier;
use crate::metrics::Labels;

/// One tenant's use of one quota key.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The footprint key (`pods`, `requests.cpu`, `objects/ConfigMap`, `bytes`, ...).
    pub resource: String,
    /// What the tenant holds, in units (cores, bytes, counts).
    pub used: f64,
    /// Its quota, in the same units; `None` when not limited.
    pub limit: Option<f64>,
}

/// Every key `tenant` holds something of or has a limit on, in key order.
pub fn lines(applier: &Applier, tenant: &ClusterId) -> Vec<Line> {
    let usage = applier.objects().usage(tenant);
    let quota = applier.quota_of(tenant);
    let mut keys: std::collections::BTreeSet<String> =
        usage.iter().map(|(k, _)| k.to_string()).collect();
    keys.extend(
        [crate::quota::NAMESPACES, crate::quota::BYTES]
            .into_iter()
            .map(String::from),
    );
    keys.extend(quota.hard.keys().cloned());
    keys.into_iter()
        .map(|resource| Line {
            used: units(usage.get(&resource)),
            limit: quota.limit_of(&resource).map(|(l, _)| units(l.0)),
            resource,
        })
        .collect()
}

fn units(milli: i128) -> f64 {
    milli as f64 / 1000.0
}

/// The per-tenant usage and quota series, computed at each scrape.
#[derive(Clone)]
pub struct UsageCollector {
    applier: Applier,
}

impl std::fmt::Debug for UsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UsageCollector")
    }
}

impl UsageCollector {
    /// Reports what `applier`'s tenants hold.
    pub fn new(applier: Applier) -> Self {
        Self { applier }
    }
}

type Series = Family<Labels, Gauge<f64, AtomicU64>>;

impl Collector for UsageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (used, limits) = (Series::default(), Series::default());
        for tenant in self.applier.objects().usage_by_tenant().keys() {
            let Ok(tenant) = ClusterId::parse(tenant) else {
                continue;
            };
            for line in lines(&self.applier, &tenant) {
                let labels = vec![
                    ("tenant".to_string(), tenant.to_string()),
                    ("resource".to_string(), line.resource.clone()),
                ];
                used.get_or_create(&labels).set(line.used);
                if let Some(limit) = line.limit {
                    limits.get_or_create(&labels).set(limit);
                }
            }
        }
        let metric = encoder.encode_descriptor(
            "tenant_usage",
            "What each tenant holds on the provider, by quota resource (cores, bytes, counts)",
            None,
            used.metric_type(),
        )?;
        used.encode(metric)?;
        let metric = encoder.encode_descriptor(
            "tenant_quota",
            "Each tenant's quota, by resource, in the units of refract_remote_tenant_usage",
            None,
            limits.metric_type(),
        )?;
        limits.encode(metric)
    }
}
