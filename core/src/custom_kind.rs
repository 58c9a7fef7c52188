//! Custom resource kinds: reflected by the local agent when its reflection values list them
//! (`offloading.reflection.customKinds`), written by the remote agent for the tenants whose
//! policy lists them (`customKinds`).
//!
//! A custom kind is named by an operator (group, version, kind, plural), never by what crosses
//! the link: a request naming a kind is only looked up among the registered ones. An agent
//! registers the kinds its configuration names when it starts ([`register`]) and watches them
//! like the built-in kinds; one named later waits for a restart, and says so.
//!
//! [`CustomKind`] is a `Copy` handle, like the built-in kinds, so that each agent keeps one
//! kind type through its stores, queues and write path. Each registered name is leaked once:
//! the set is the configuration's (a handful of kinds, at most [`MAX_CUSTOM_KINDS`]),
//! registering a name again returns the same handle, and the names live as long as the
//! process does anyway.

use std::sync::RwLock;

use crate::lock::RwLocked as _;
use serde::{Deserialize, Serialize};

/// How many custom kinds one agent registers at most: a policy naming more is refused.
pub const MAX_CUSTOM_KINDS: usize = 64;

/// Kind names no custom kind may have: the agents tell reflected objects, their acks and
/// events apart by kind name, so these stay the built-in kinds' (and the ones the provider
/// reports about).
const RESERVED_KINDS: [&str; 12] = [
    "ConfigMap",
    "Secret",
    "Service",
    "Ingress",
    "EndpointSlice",
    "PersistentVolumeClaim",
    "PersistentVolume",
    "Pod",
    "ShadowPod",
    "Namespace",
    "Event",
    "Node",
];

/// Groups no custom kind may be in: Kubernetes' own APIs (`apps`, `networking.k8s.io`, ...
/// are reached only through the built-in kinds, whose checks a custom name would skip), and
/// Refract's own.
const RESERVED_GROUP_SUFFIXES: [&str; 3] = ["k8s.io", "kubernetes.io", "refract.io"];

/// A custom kind as the policy names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomKindName {
    /// The API group, as in the CustomResourceDefinition (`example.com`).
    pub group: String,
    /// The version tenants write (`v1`).
    pub version: String,
    /// The kind (`Widget`).
    pub kind: String,
    /// The resource's plural name in URLs (`widgets`).
    pub plural: String,
}

impl CustomKindName {
    /// The apiVersion objects of this kind carry (`example.com/v1`).
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// Checks the name could be a CustomResourceDefinition's and is not one of the kinds
    /// Kubernetes or Refract serve themselves.
    pub fn validate(&self) -> Result<(), String> {
        let shown = format!("{} {}", self.api_version(), self.kind);
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        if !self.group.contains('.') || !self.group.split('.').all(dns_label) {
            return Err(format!(
                "{shown}: group {:?} is not a custom resource group (a DNS name with at least one dot)",
                self.group
            ));
        }
        if RESERVED_GROUP_SUFFIXES
            .iter()
            .any(|s| self.group == *s || self.group.ends_with(&format!(".{s}")))
        {
            return Err(format!(
                "{shown}: group {:?} is Kubernetes' or Refract's own; its kinds are not custom kinds",
                self.group
            ));
        }
        if !dns_label(&self.version) {
            return Err(format!("{shown}: version {:?} is not valid", self.version));
        }
        if !self.kind.starts_with(|c: char| c.is_ascii_uppercase())
            || !self.kind.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err(format!(
                "{shown}: kind {:?} is not a Kubernetes kind (letters and digits, from a capital)",
                self.kind
            ));
        }
        if RESERVED_KINDS.contains(&self.kind.as_str()) {
            return Err(format!(
                "{shown}: kind {:?} is a kind Refract reflects or reports itself; a custom kind needs another name",
                self.kind
            ));
        }
        if !dns_label(&self.plural) {
            return Err(format!("{shown}: plural {:?} is not valid", self.plural));
        }
        Ok(())
    }
}

impl std::fmt::Display for CustomKindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.api_version(), self.kind, self.plural)
    }
}

/// A registered custom kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CustomKind(&'static Registered);

/// What a registration keeps: the name, and the strings readers take by reference.
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Registered {
    name: CustomKindName,
    api_version: &'static str,
    /// `<plural>.<group>`, as Kubernetes names the resource (and its CRD).
    resource: &'static str,
}

impl CustomKind {
    /// The name the policy gave.
    pub fn name(self) -> &'static CustomKindName {
        &self.0.name
    }

    /// The kind (`Widget`).
    pub fn kind(self) -> &'static str {
        &self.0.name.kind
    }

    /// The apiVersion (`example.com/v1`).
    pub fn api_version(self) -> &'static str {
        self.0.api_version
    }

    /// `<plural>.<group>` (`widgets.example.com`): the resource, as in its CRD's name.
    pub fn resource_name(self) -> &'static str {
        self.0.resource
    }
}

impl serde::Serialize for CustomKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.name().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for CustomKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = CustomKindName::deserialize(d)?;
        register(&name).map_err(serde::de::Error::custom)
    }
}

static REGISTRY: RwLock<Vec<CustomKind>> = RwLock::new(Vec::new());

/// Why a custom kind was not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The name is not a custom kind's.
    #[error("{0}")]
    Invalid(String),
    /// Another registered kind has the same kind name (the agents tell kinds apart by it).
    #[error("{new} and {registered} have the same kind name; one custom kind per kind name")]
    Ambiguous {
        /// The kind being registered.
        new: Box<CustomKindName>,
        /// The one registered before.
        registered: Box<CustomKindName>,
    },
    /// The agent has as many custom kinds as it takes.
    #[error("more than {MAX_CUSTOM_KINDS} custom kinds")]
    TooMany,
}

/// Registers `name`, returning its handle (the same one for a name registered before).
pub fn register(name: &CustomKindName) -> Result<CustomKind, RegisterError> {
    name.validate().map_err(RegisterError::Invalid)?;
    let mut registry = REGISTRY.write_locked();
    if let Some(same) = registry.iter().find(|k| k.kind() == name.kind) {
        return if same.name() == name {
            Ok(*same)
        } else {
            Err(RegisterError::Ambiguous {
                new: Box::new(name.clone()),
                registered: Box::new(same.name().clone()),
            })
        };
    }
    if registry.len() >= MAX_CUSTOM_KINDS {
        return Err(RegisterError::TooMany);
    }
    let registered: &'static Registered = Box::leak(Box::new(Registered {
        name: name.clone(),
        api_version: Box::leak(name.api_version().into_boxed_str()),
        resource: Box::leak(format!("{}.{}", name.plural, name.group).into_boxed_str()),
    }));
    let kind = CustomKind(registered);
    registry.push(kind);
    Ok(kind)
}

/// The registered kind of `api_version` and `kind`, if any.
pub fn lookup(api_version: &str, kind: &str) -> Option<CustomKind> {
    REGISTRY
        .read_locked()
        .iter()
        .find(|k| k.kind() == kind && k.api_version() == api_version)
        .copied()
}

/// Every registered kind, in the order registered.
pub fn registered() -> Vec<CustomKind> {
    REGISTRY.read_locked().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(group: &str, kind: &str, plural: &str) -> CustomKindName {
        CustomKindName {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    #[test]
    fn a_registered_kind_is_found_by_its_api_version_and_kind_only() {
        let gadget = register(&name("gadgets.test.refract.example", "Gadget", "gadgets")).unwrap();
        assert_eq!(gadget.api_version(), "gadgets.test.refract.example/v1");
        assert_eq!(
            lookup("gadgets.test.refract.example/v1", "Gadget"),
            Some(gadget)
        );
        assert_eq!(lookup("gadgets.test.refract.example/v2", "Gadget"), None);
        assert_eq!(
            register(&name("gadgets.test.refract.example", "Gadget", "gadgets")),
            Ok(gadget),
            "registering again returns the same handle"
        );
        for other in [
            name("gadgets.test.refract.example", "Gadget", "gizmos"),
            name("other.test.refract.example", "Gadget", "gadgets"),
        ] {
            assert!(matches!(
                register(&other),
                Err(RegisterError::Ambiguous { .. })
            ));
        }
        assert_eq!(
            gadget.resource_name(),
            "gadgets.gadgets.test.refract.example"
        );
    }

    #[test]
    fn kubernetes_and_refract_groups_and_malformed_names_are_refused() {
        for (group, kind, plural, says) in [
            ("", "Pod", "pods", "not a custom resource group"),
            (
                "apps",
                "Deployment",
                "deployments",
                "not a custom resource group",
            ),
            ("networking.k8s.io", "Ingress", "ingresses", "Kubernetes'"),
            ("metrics.k8s.io", "PodMetrics", "pods", "Kubernetes'"),
            (
                "offloading.refract.io",
                "ShadowPod",
                "shadowpods",
                "Refract's",
            ),
            ("example.com", "widget", "widgets", "not a Kubernetes kind"),
            ("example.com", "Widget", "Widgets", "plural"),
            (
                "Example.com",
                "Widget",
                "widgets",
                "not a custom resource group",
            ),
            ("example.com", "Service", "services", "reflects or reports"),
            ("example.com", "Pod", "pods", "reflects or reports"),
        ] {
            let error = name(group, kind, plural).validate().unwrap_err();
            assert!(error.contains(says), "{group} {kind}: {error}");
        }
        assert_eq!(name("example.com", "Widget", "widgets").validate(), Ok(()));
    }
}
