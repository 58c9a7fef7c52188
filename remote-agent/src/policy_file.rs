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

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use refract_wire::proto::{remote_message, Ack, Delete, Outcome, RemoteMessage};
use tokio_util::sync::CancellationToken;

use crate::apply::{answer, Applier, ApplyError, ObjectKey};
use crate::kinds::Allowed;
use crate::metrics::{label, PolicyMetrics};
use crate::outbox::{Outbox, Subject};
use crate::policy::{Policies, TenantPolicy};
use crate::registry::Registry;

/// How often the file is read again.
pub const POLL: Duration = Duration::from_secs(1);

/// Follows the policy file at `path` (whose text `last_text` is in force), until `shutdown`.
pub fn follow(
    path: PathBuf,
    mut last_text: String,
    base: TenantPolicy,
    effects: Effects,
    shutdown: CancellationToken,
) {
    let Effects {
        applier,
        outbox,
        metrics,
        registry,
        client,
        leading,
        custom_kinds,
    } = effects;
    let reporting = Reporting {
        registry,
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "refract-remote-agent".into(),
                instance: None,
            },
        ),
    };
    metrics.valid.set(1);
    // The file's text was accepted at start; a policy is compared with the one before it.
    let mut in_force = Policies::parse(&last_text, base.clone()).unwrap_or_default();
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
            let changed = policies.changes_from(&in_force);
            // Before the new policy judges anything: a kind it adds is known by then.
            custom_kinds.watch_new(&policies.custom_kinds()).await;
            let was = std::mem::replace(&mut in_force, policies.clone());
            let refused = applier.set_policies(policies);
            tracing::info!(file = %path.display(), changed = %changed.join("; "), refused = refused.len(), "policy file changed; in force from now on, and every object kept whole judged again");
            let just_refused: Vec<ObjectKey> = refused.iter().map(|(key, _)| key.clone()).collect();
            for (key, error) in refused {
                act_on_refusal(&applier, &outbox, &metrics, &reporting, key, error).await;
            }
            let changed = Changed {
                was: &was,
                is: &in_force,
                refused: &just_refused,
            };
            ask_for_denied_again(&applier, &reporting.registry, &outbox, &changed);
            if *leading.borrow() {
                applier.write_all_fences().await;
            }
        }
    });
}

/// Asks each connected tenant whose policy changed to send again every object the provider
/// denied it and does not hold (as Inspect records them), so that the new policy judges them
/// now rather than at their next change: an object refused for a kind, a class or an address
/// the policy now allows is written at once; one it still refuses is denied again, with the
/// reason. Left out: an object the provider holds and a policy refused later, which stays as
/// it is (see `report`), and one this change refused (the tenant was just told what became of
/// it): denying either again would tell the origin something else.
fn ask_for_denied_again(
    applier: &Applier,
    registry: &Registry,
    outbox: &Outbox,
    changed: &Changed<'_>,
) {
    let held = |object: &refract_wire::proto::ObjectRef| {
        Allowed::lookup(&object.api_version, &object.kind).is_some_and(|kind| {
            applier
                .objects()
                .get(kind, &object.namespace, &object.name)
                .is_some()
        })
    };
    for tenant in registry.connected() {
        if changed.was.of(&tenant) == changed.is.of(&tenant) {
            continue;
        }
        let just_refused = |object: &refract_wire::proto::ObjectRef| {
            changed.refused.iter().any(|key| {
                key.tenant == tenant
                    && key.kind.kind() == object.kind
                    && key.namespace == object.namespace
                    && key.name == object.name
            })
        };
        let denied: Vec<_> = registry
            .objects(&tenant, "", "")
            .into_iter()
            .filter(|o| o.outcome == Outcome::Denied as i32)
            .filter_map(|o| o.object)
            .filter(|object| !held(object) && !just_refused(object))
            .collect();
        if denied.is_empty() {
            continue;
        }
        tracing::info!(%tenant, objects = denied.len(), "asking the tenant to send the objects the provider denied it again, for the changed policy to judge");
        for object in denied {
            let subject = Subject::notice(&object.kind, &object.namespace, &object.name);
            let notice = RemoteMessage {
                kind: Some(remote_message::Kind::Ack(Ack {
                    object: Some(object),
                    revision: String::new(),
                    outcome: Outcome::Resend as i32,
                    message: "the provider's policy changed; send it again to be judged by it"
                        .into(),
                    awaited: false,
                    restores: 0,
                })),
            };
            outbox.put(&tenant, subject, String::new(), notice);
        }
    }
}

/// A policy change: the policies before and after, and the objects the new one refused.
struct Changed<'a> {
    was: &'a Policies,
    is: &'a Policies,
    refused: &'a [ObjectKey],
}

fn refuse(metrics: &PolicyMetrics, last_error: &mut String, error: String) {
    metrics.valid.set(0);
    if error != *last_error {
        tracing::error!(%error, "policy file refused; the last good policy stays in force");
        *last_error = error;
    }
}

/// What a followed policy file acts on.
pub struct Effects {
    /// Judges objects again and removes refused ShadowPods.
    pub applier: Applier,
    /// Tells an origin that its pod was removed.
    pub outbox: Outbox,
    /// The file's state and its refusals.
    pub metrics: PolicyMetrics,
    /// Where Inspect shows a refusal.
    pub registry: Registry,
    /// Records the Warning events that reach the origin objects.
    pub client: kube::Client,
    /// Whether this replica writes the fences of every twin namespace.
    pub leading: tokio::sync::watch::Receiver<bool>,
    /// Watches the custom kinds the file adds.
    pub custom_kinds: crate::custom_kinds::CustomKindWatches,
}

/// Where a refusal that leaves the object in place is shown.
struct Reporting {
    registry: Registry,
    recorder: Recorder,
}

/// The reason of the event on an object a changed policy refuses.
const REFUSED_REASON: &str = "RefusedByPolicy";

/// Shows a refusal that leaves the object running: a Warning event on the provider object,
/// which the event stream takes to the origin object, and the object's line in Inspect.
async fn report(reporting: &Reporting, key: &ObjectKey, error: &ApplyError) {
    let object = key.object_ref();
    let message = format!(
        "the provider's changed policy refuses this object; it stays as it is until the origin changes it: {error}"
    );
    reporting
        .registry
        .record(&key.tenant, &object, "", error.outcome(), &message);
    let reference = ObjectReference {
        api_version: Some(object.api_version.clone()),
        kind: Some(object.kind.clone()),
        namespace: (!object.namespace.is_empty()).then(|| object.namespace.clone()),
        name: Some(object.name.clone()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: REFUSED_REASON.into(),
        note: Some(message.chars().take(1000).collect()),
        action: "JudgeAgain".into(),
        secondary: None,
    };
    if let Err(failed) = reporting.recorder.publish(&event, &reference).await {
        tracing::warn!(tenant = %key.tenant, namespace = %key.namespace, name = %key.name, error = %failed, "failed to record the refusal's event");
    }
}

/// Reports an object the new policy refuses, and removes a ShadowPod where the tenant's
/// policy says so.
async fn act_on_refusal(
    applier: &Applier,
    outbox: &Outbox,
    metrics: &PolicyMetrics,
    reporting: &Reporting,
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
        report(reporting, &key, &error).await;
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
            awaited: false,
            restores: 0,
        })),
    };
    let subject = Subject::notice(key.kind.kind(), &key.namespace, &key.name);
    outbox.put(&key.tenant, subject, String::new(), notice);
}
