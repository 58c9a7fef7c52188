//! The fights ledger ([`super::fights`]) shared by the restorer, which records into it, and
//! Inspect, which shows it and lets an operator clear a quarantine; with its metrics.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use refract_core::lock::Locked;
use tokio::sync::mpsc;

use super::fights::{FightRule, FightView, Fights, Verdict};
use crate::apply::ObjectKey;
use crate::metrics::DriftMetrics;

/// The shared ledger of fights over tenant copies.
#[derive(Clone)]
pub struct Drift {
    fights: Arc<Mutex<Fights<ObjectKey>>>,
    metrics: DriftMetrics,
    /// Tells the restorer to restore an object an operator released.
    cleared: mpsc::UnboundedSender<ObjectKey>,
}

/// Objects an operator released from quarantine, for the restorer to restore.
pub struct Cleared(pub(super) mpsc::UnboundedReceiver<ObjectKey>);

impl Drift {
    /// A ledger following `rule`, counted in `metrics`.
    pub fn new(rule: FightRule, metrics: DriftMetrics) -> (Self, Cleared) {
        let (cleared, receiver) = mpsc::unbounded_channel();
        let drift = Self {
            fights: Arc::new(Mutex::new(Fights::new(rule))),
            metrics,
            cleared,
        };
        (drift, Cleared(receiver))
    }

    /// Records a foreign write of `key` (see [`Fights::record`]).
    pub(super) fn record(&self, key: &ObjectKey, now: Instant) -> Verdict {
        let verdict = self.fights.locked().record(key, now);
        let kind = [
            ("tenant".to_string(), key.tenant.to_string()),
            ("kind".to_string(), key.kind.kind().to_string()),
        ];
        match verdict {
            Verdict::Restore { .. } => {
                self.metrics.restores.get_or_create(&kind.to_vec()).inc();
            }
            Verdict::Quarantine { .. } => {
                self.metrics.quarantines.get_or_create(&kind.to_vec()).inc();
                self.quarantined_gauge(key).inc();
            }
            Verdict::Quarantined => {}
        }
        verdict
    }

    /// The quarantined objects whose quiet period has passed, released (see
    /// [`Fights::release_due`]).
    pub(super) fn release_due(&self, now: Instant) -> Vec<ObjectKey> {
        let released = self.fights.locked().release_due(now);
        for key in &released {
            self.quarantined_gauge(key).dec();
        }
        released
    }

    /// When the restorer next has a fight to look at.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.fights.locked().next_due()
    }

    /// Ends `key`'s quarantine as an operator asks, and has the restorer restore it; false
    /// when it was not quarantined.
    pub fn clear(&self, key: &ObjectKey) -> bool {
        let cleared = self.fights.locked().clear(key);
        if cleared {
            self.quarantined_gauge(key).dec();
            let _ = self.cleared.send(key.clone());
        }
        cleared
    }

    /// What is known of `key`'s fight.
    pub fn view(&self, key: &ObjectKey) -> Option<FightView> {
        self.fights.locked().view(key)
    }

    /// The rule in force.
    pub fn rule(&self) -> FightRule {
        self.fights.locked().rule()
    }

    fn quarantined_gauge(&self, key: &ObjectKey) -> prometheus_client::metrics::gauge::Gauge {
        self.metrics
            .quarantined
            .get_or_create(&vec![("tenant".to_string(), key.tenant.to_string())])
            .clone()
    }
}
