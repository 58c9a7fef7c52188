//! The fights ledger ([`super::fights`]) shared by the restorer (which finds foreign writes
//! and restores what it keeps whole), the write path (which lands the copies the origin sends
//! again) and Inspect (which shows it and lets an operator clear a quarantine); with its
//! metrics and what it tells the origin.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use refract_core::lock::Locked;
use refract_wire::proto::{remote_message, Ack, Outcome, RemoteMessage};
use tokio::sync::mpsc;

use super::fights::{FightRule, FightView, Fights, Verdict};
use crate::apply::ObjectKey;
use crate::metrics::DriftMetrics;
use crate::outbox::{Outbox, Subject};

/// The shared ledger of fights over tenant copies.
#[derive(Clone)]
pub struct Drift {
    fights: Arc<Mutex<Fights<ObjectKey>>>,
    metrics: DriftMetrics,
    outbox: Outbox,
    /// Tells the restorer to restore an object an operator released.
    cleared: mpsc::UnboundedSender<ObjectKey>,
}

/// Objects an operator released from quarantine, for the restorer to restore.
pub struct Cleared(pub(super) mpsc::UnboundedReceiver<ObjectKey>);

impl Drift {
    /// A ledger following `rule`, counted in `metrics`, telling tenants through `outbox`.
    pub fn new(rule: FightRule, metrics: DriftMetrics, outbox: Outbox) -> (Self, Cleared) {
        let (cleared, receiver) = mpsc::unbounded_channel();
        let drift = Self {
            fights: Arc::new(Mutex::new(Fights::new(rule))),
            metrics,
            outbox,
            cleared,
        };
        (drift, Cleared(receiver))
    }

    /// Someone else wrote `key`: whether to restore it (see [`Fights::foreign_write`]).
    pub(super) fn foreign_write(&self, key: &ObjectKey) -> bool {
        self.fights.locked().foreign_write(key, Instant::now())
    }

    /// The origin is asked to send `key` again, someone else's write seen at `seen` (see
    /// [`Fights::await_resend`]).
    pub(super) fn await_resend(&self, key: &ObjectKey, seen: Option<&str>) {
        let seen = seen.map(str::to_string);
        self.fights.locked().await_resend(key, seen, Instant::now());
    }

    /// Whether this write of `key` lands the copy the origin was asked to send again, and
    /// the resourceVersion the other writer left (see [`Fights::take_awaited`]).
    pub fn take_awaited(&self, key: &ObjectKey) -> Option<Option<String>> {
        self.fights.locked().take_awaited(key)
    }

    /// `key` was restored and the restore changed it: counted, and told to the origin at a
    /// fight's first restore (then once a window), or when it quarantines the object.
    pub fn restored(&self, key: &ObjectKey, what: &str) {
        let verdict = self.fights.locked().restored(key, Instant::now());
        let labels = vec![
            ("tenant".to_string(), key.tenant.to_string()),
            ("kind".to_string(), key.kind.kind().to_string()),
        ];
        self.metrics.restores.get_or_create(&labels).inc();
        match verdict {
            Verdict::Restore {
                count,
                report: true,
            } => {
                let message = format!(
                    "the copy was {what} on the provider by someone else, and restored ({} in this fight)",
                    times(count)
                );
                self.notify(key, Outcome::Drifted, count, message);
            }
            Verdict::Restore { report: false, .. } => {}
            Verdict::Quarantine { count } => {
                self.metrics.quarantines.get_or_create(&labels).inc();
                self.quarantined_gauge(key).inc();
                let rule = self.rule();
                let (window, quiet) = (
                    refract_core::duration::format(rule.window),
                    refract_core::duration::format(rule.quiet),
                );
                tracing::warn!(
                    tenant = %key.tenant, kind = key.kind.kind(), namespace = %key.namespace, name = %key.name, restores = count, %window, %quiet,
                    "reflected object quarantined: something on the provider keeps rewriting it; it is no longer restored"
                );
                let message = format!(
                    "the copy was restored {} in {window}: something on the provider keeps rewriting it, so it is no longer restored (quarantined). It is restored again once nobody else writes it for {quiet}, or when a provider operator clears it (refract.v1.Inspect/ClearQuarantine)",
                    times(count)
                );
                self.notify(key, Outcome::Quarantined, count, message);
            }
        }
    }

    /// Puts an unsolicited answer about `key` in the provider's outbox. Each differs from the
    /// one before (its hash), so a newer notice replaces one not yet sent.
    pub(super) fn notify(&self, key: &ObjectKey, outcome: Outcome, restores: u32, message: String) {
        let message = RemoteMessage {
            kind: Some(remote_message::Kind::Ack(Ack {
                object: Some(key.object_ref()),
                revision: String::new(),
                outcome: outcome as i32,
                message,
                awaited: false,
                restores,
            })),
        };
        let subject = Subject::notice(key.kind.kind(), &key.namespace, &key.name);
        let hash = format!("{}/{restores}", outcome.label());
        self.outbox.put(&key.tenant, subject, hash, message);
    }

    /// The quarantined objects whose quiet period has passed, released (see
    /// [`Fights::release_due`]).
    pub(super) fn release_due(&self) -> Vec<ObjectKey> {
        let released = self.fights.locked().release_due(Instant::now());
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

fn times(count: u32) -> String {
    match count {
        1 => "once".to_string(),
        n => format!("{n} times"),
    }
}
