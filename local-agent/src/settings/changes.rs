//! What a settings change changes, said in the operator's terms, and what of it waits for a
//! restart.

use std::collections::BTreeSet;
use std::fmt::Display;

use refract_core::options::{Kind, ReflectionOptions};

use crate::config::Settings;
use crate::reflect::start::SWITCHABLE;

/// Takes the settings just read, with each kind whose reflection they turn on (workers from
/// 0) kept off, unless it is one switched while the agent runs ([`SWITCHABLE`]) or its
/// reflector runs already (it was on when the agent started, and was turned off since): the
/// others wait for a restart. Returns them and the kinds so kept. Turning a kind off always
/// takes effect.
pub fn held_for_restart(
    started: &ReflectionOptions,
    in_force: &ReflectionOptions,
    mut read: Settings,
) -> (Settings, Vec<Kind>) {
    let mut held = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| !SWITCHABLE.contains(k)) {
        let (was, is) = (in_force.kind(kind), read.options.kind(kind));
        let running = started.kind(kind).workers > 0;
        if was.workers == 0 && is.workers > 0 && !running {
            let mut kept = is;
            kept.workers = was.workers;
            read.options.kinds.insert(kind, kept);
            held.push(kind);
        }
    }
    // A custom kind's reflector is started with the agent (and switched off, not stopped, when
    // the settings drop it): one the settings add waits.
    read.options.custom_kinds.retain(|custom| {
        let started = started.custom_kinds.iter().any(|c| c.kind == custom.kind);
        if !started {
            held.push(Kind::Custom(custom.kind));
        }
        started
    });
    (read, held)
}

/// Whether an object forged with `old` may come out otherwise with `new`: anything but the
/// workers differs.
pub fn forged_differently(old: &ReflectionOptions, new: &ReflectionOptions) -> bool {
    let policies = |o: &ReflectionOptions| {
        let custom = o.custom_kinds.iter().map(|c| Kind::Custom(c.kind));
        Kind::ALL
            .into_iter()
            .chain(custom)
            .map(|kind| (kind, o.kind(kind).policy))
            .collect::<Vec<_>>()
    };
    let rest = |o: &ReflectionOptions| {
        let mut o = o.clone();
        o.kinds.clear();
        o.custom_kinds.clear();
        o.events.workers = 0;
        o
    };
    old != new && (policies(old) != policies(new) || rest(old) != rest(new))
}

/// One line per setting that differs between `old` and `new`; none when they are the same.
pub fn describe(old: &Settings, new: &Settings) -> Vec<String> {
    let mut lines = Vec::new();
    let mut compare = |what: String, was: &dyn Display, is: &dyn Display| {
        let (was, is) = (was.to_string(), is.to_string());
        if was != is {
            lines.push(format!("{what} {was} -> {is}"));
        }
    };
    compare(
        "sharing percentage".into(),
        &old.sharing_percentage,
        &new.sharing_percentage,
    );
    let (o, n) = (&old.options, &new.options);
    let custom: BTreeSet<Kind> = o
        .custom_kinds
        .iter()
        .chain(&n.custom_kinds)
        .map(|c| Kind::Custom(c.kind))
        .collect();
    for kind in Kind::ALL.into_iter().chain(custom) {
        let (was, is) = (o.kind(kind), n.kind(kind));
        // A slice's policy is its Service's: said once, there.
        if kind != Kind::EndpointSlice {
            compare(
                format!("{} policy", kind.kind()),
                &was.policy.as_str(),
                &is.policy.as_str(),
            );
        }
        compare(
            format!("{} workers", kind.kind()),
            &was.workers,
            &is.workers,
        );
    }
    compare(
        "Event policy".into(),
        &o.events.policy.as_str(),
        &n.events.policy.as_str(),
    );
    compare("Event workers".into(), &o.events.workers, &n.events.workers);
    if let Some(line) = set_change("skipped labels", &o.skip_labels, &n.skip_labels) {
        lines.push(line);
    }
    if let Some(line) = set_change(
        "skipped annotations",
        &o.skip_annotations,
        &n.skip_annotations,
    ) {
        lines.push(line);
    }
    if o.offloading_patch != n.offloading_patch {
        lines.push("offloading patch changed".into());
    }
    lines
}

/// `what +added -removed`, when the sets differ.
fn set_change(what: &str, old: &BTreeSet<String>, new: &BTreeSet<String>) -> Option<String> {
    let added: Vec<String> = new.difference(old).map(|k| format!("+{k}")).collect();
    let removed: Vec<String> = old.difference(new).map(|k| format!("-{k}")).collect();
    if added.is_empty() && removed.is_empty() {
        return None;
    }
    Some(format!("{what} {}", [added, removed].concat().join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_core::options::KindOptions;
    use refract_core::policy::Policy;

    fn settings() -> Settings {
        Settings {
            options: ReflectionOptions::new("origin", "provider"),
            sharing_percentage: 90,
        }
    }

    #[test]
    fn each_changed_setting_is_one_line_and_nothing_changed_is_none() {
        let old = settings();
        assert!(describe(&old, &old.clone()).is_empty());
        let mut new = settings();
        new.sharing_percentage = 40;
        new.options.kinds.insert(
            Kind::ConfigMap,
            KindOptions {
                policy: Policy::AllowList,
                workers: 5,
            },
        );
        new.options.skip_labels.insert("team".into());
        new.options.skip_annotations.remove("cloud.google.com/neg");
        new.options.events.workers = 0;
        new.options.offloading_patch.runtime_class_name = Some("gvisor".into());
        assert_eq!(
            describe(&old, &new),
            [
                "sharing percentage 90 -> 40",
                "ConfigMap policy DenyList -> AllowList",
                "ConfigMap workers 3 -> 5",
                "Event workers 3 -> 0",
                "skipped labels +team",
                "skipped annotations -cloud.google.com/neg",
                "offloading patch changed",
            ]
        );
    }

    #[test]
    fn only_what_the_forge_reads_forges_again() {
        let old = ReflectionOptions::new("origin", "provider");
        let mut new = old.clone();
        new.events.workers = 9;
        new.kinds.insert(
            Kind::Secret,
            KindOptions {
                policy: Policy::DenyList,
                workers: 8,
            },
        );
        assert!(!forged_differently(&old, &new));
        new.skip_labels.insert("team".into());
        assert!(forged_differently(&old, &new));
    }

    #[test]
    fn a_service_policy_change_is_not_said_again_for_its_slices() {
        let old = settings();
        let mut new = settings();
        new.options.kinds.insert(
            Kind::Service,
            KindOptions {
                policy: Policy::AllowList,
                workers: 3,
            },
        );
        assert_eq!(
            describe(&old, &new),
            ["Service policy DenyList -> AllowList"]
        );
    }

    #[test]
    fn only_turning_on_a_kind_off_since_the_start_is_held_and_other_changes_pass() {
        let off = |workers| KindOptions {
            policy: Policy::DenyList,
            workers,
        };
        // Started with EndpointSlices off and Services on; Services turned off since.
        let mut started = ReflectionOptions::new("origin", "provider");
        started.kinds.insert(Kind::EndpointSlice, off(0));
        let mut in_force = started.clone();
        in_force.kinds.insert(Kind::Service, off(0));
        let mut read = settings();
        read.options = in_force.clone();
        for (kind, workers) in [
            (Kind::Secret, 0),
            (Kind::Service, 2),
            (Kind::EndpointSlice, 4),
            (Kind::PersistentVolumeClaim, 0),
            (Kind::ConfigMap, 7),
        ] {
            read.options.kinds.insert(
                kind,
                KindOptions {
                    policy: Policy::AllowList,
                    workers,
                },
            );
        }
        let (next, held) = held_for_restart(&started, &in_force, read);
        assert_eq!(
            held,
            [Kind::EndpointSlice],
            "off since the start, turned on"
        );
        let slices = next.options.kind(Kind::EndpointSlice);
        assert_eq!(slices.workers, 0);
        assert_eq!(
            next.options.kind(Kind::Service).workers,
            2,
            "on again: its reflector runs"
        );
        assert_eq!(
            next.options.kind(Kind::PersistentVolumeClaim).workers,
            0,
            "turning off takes effect"
        );
        assert_eq!(next.options.kind(Kind::Secret).workers, 0);
        assert_eq!(next.options.kind(Kind::ConfigMap).workers, 7);
    }

    #[test]
    fn a_custom_kind_started_with_the_agent_comes_back_and_a_new_one_waits() {
        use refract_core::custom_kind::{register, CustomKindName};
        use refract_core::options::CustomReflection;
        let custom = |kind: &str| CustomReflection {
            kind: register(&CustomKindName {
                group: "settings.test.refract.example".into(),
                version: "v1".into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_lowercase()),
            })
            .unwrap(),
            options: KindOptions {
                policy: Policy::DenyList,
                workers: 3,
            },
            status: Vec::new(),
        };
        let mut started = ReflectionOptions::new("origin", "provider");
        started.custom_kinds.push(custom("Bolt"));
        // Dropped from the settings since, and added again with one the agent never had.
        let in_force = ReflectionOptions::new("origin", "provider");
        let mut read = settings();
        read.options.custom_kinds = vec![custom("Bolt"), custom("Nut")];
        let (next, held) = held_for_restart(&started, &in_force, read);
        assert_eq!(held, [Kind::Custom(custom("Nut").kind)]);
        assert_eq!(next.options.custom_kinds, [custom("Bolt")]);
    }
}
