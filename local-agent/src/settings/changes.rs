//! What a settings change changes, said in the operator's terms.

use std::collections::BTreeSet;
use std::fmt::Display;

use refract_core::options::{Kind, ReflectionOptions};

use crate::config::Settings;

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
}
