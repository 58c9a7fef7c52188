//! The policy file, followed while the agent runs: a valid change is in force for the next
//! request, and every object the agent keeps whole is judged again at once; a file that does
//! not parse, or names a field or tenant entry it should not, is refused whole (the error
//! names the line where the parser can) and the last good policy stays in force.
//!
//! What the new policy refuses is counted per tenant and logged; where the tenant's policy says
//! `removeRefused`, a refused ShadowPod is deleted with its pod's grace period, and the origin
//! is told (its pod shows Pending with the reason, and a Warning event).

use std::path::PathBuf;
use std::time::Duration;

use refract_wire::proto::{remote_message, Ack, Delete, Outcome, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::apply::{answer, Applier, ApplyError, ObjectKey};
use crate::kinds::Allowed;
use crate::metrics::{label, PolicyMetrics};
use crate::outbox::{Outbox, Subject};
use crate::policy::{Policies, TenantPolicy};

/// How often the file is read again.
pub const POLL: Duration = Duration::from_secs(1);

/// Follows the policy file at `path` (whose text `last_text` is in force), until `shutdown`.
pub fn follow(
    path: PathBuf,
    mut last_text: String,
    base: TenantPolicy,
    applier: Applier,
    outbox: Outbox,
    metrics: PolicyMetrics,
    shutdown: CancellationToken,
) {
    metrics.valid.set(1);
    tokio::spawn(async move {
        // Said once per distinct problem, not every second.
        let mut last_error = String::new();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(error) => {
                    refuse(
                        &metrics,
                        &mut last_error,
                        format!("cannot read {}: {error}", path.display()),
                    );
                    continue;
                }
            };
            if text == last_text {
                if metrics.valid.get() == 0 {
                    // Back to the text in force.
                    metrics.valid.set(1);
                    last_error.clear();
                }
                continue;
            }
            let policies = match Policies::parse(&text, base.clone()) {
                Ok(policies) => policies,
                Err(error) => {
                    refuse(
                        &metrics,
                        &mut last_error,
                        format!("{}: {error}", path.display()),
                    );
                    continue;
                }
            };
            last_text = text;
            last_error.clear();
            metrics.valid.set(1);
            let refused = applier.set_policies(policies);
            tracing::info!(file = %path.display(), refused = refused.len(), "policy file changed; in force from now on, and every object kept whole judged again");
            for (key, error) in refused {
                act_on_refusal(&applier, &outbox, &metrics, key, error).await;
            }
            applier.write_backstops().await;
        }
    });
}

fn refuse(metrics: &PolicyMetrics, last_error: &mut String, error: String) {
    metrics.valid.set(0);
    if error != *last_error {
        tracing::error!(%error, "policy file refused; the last good policy stays in force");
        *last_error = error;
    }
}

/// Reports an object the new policy refuses, and removes a ShadowPod where the tenant's
/// policy says so.
async fn act_on_refusal(
    applier: &Applier,
    outbox: &Outbox,
    metrics: &PolicyMetrics,
    key: ObjectKey,
    error: ApplyError,
) {
    metrics
        .refused
        .get_or_create(&label("tenant", key.tenant.as_str()))
        .inc();
    let remove = key.kind == Allowed::ShadowPod && applier.policy_of(&key.tenant).remove_refused;
    tracing::warn!(
        tenant = %key.tenant, kind = key.kind.kind(), namespace = %key.namespace, name = %key.name,
        %error, remove, "an object already written is refused by the changed policy"
    );
    if !remove {
        return;
    }
    let object = key.object_ref();
    let delete = Delete {
        object: Some(object.clone()),
        ..Delete::default()
    };
    if let Err(failed) = applier.delete(&key.tenant, &delete).await {
        tracing::warn!(tenant = %key.tenant, namespace = %key.namespace, name = %key.name, error = %failed, "removing a refused ShadowPod failed");
        return;
    }
    // The origin's pod shows why, as for a pod refused when it was first sent.
    let (outcome, message) = answer(&Err(error));
    debug_assert_ne!(outcome, Outcome::Applied);
    let notice = RemoteMessage {
        kind: Some(remote_message::Kind::Ack(Ack {
            object: Some(object),
            revision: String::new(),
            outcome: outcome as i32,
            message: format!("removed after a policy change: {message}"),
        })),
    };
    let subject = Subject::notice(key.kind.kind(), &key.namespace, &key.name);
    outbox.put(&key.tenant, subject, String::new(), notice);
}
