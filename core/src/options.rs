//! What the reflection rules depend on: cluster ids, policies, skip lists, remapping.
//!
//! The same options come from flags, from a YAML file mirroring Liqo's Helm values
//! (`offloading.reflection.<resource>.type|workers`, `offloading.reflection.skip.labels|annotations`),
//! or from `local-agent preview`.

use std::collections::{BTreeMap, BTreeSet};

use crate::custom_kind::CustomKind;
use crate::policy::Policy;
use crate::remap::Remapping;

/// A kind the local agent reflects to the provider.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// core/v1 ConfigMap.
    ConfigMap,
    /// core/v1 Secret.
    Secret,
    /// core/v1 Service.
    Service,
    /// networking.k8s.io/v1 Ingress.
    Ingress,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// core/v1 PersistentVolumeClaim of the virtual storage class.
    PersistentVolumeClaim,
    /// A custom resource kind the reflection values list (`customKinds`).
    Custom(CustomKind),
}

impl Kind {
    /// Every built-in reflected kind (custom kinds are the reflection values').
    pub const ALL: [Kind; 6] = [
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::Ingress,
        Kind::EndpointSlice,
        Kind::PersistentVolumeClaim,
    ];

    /// The Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::Service => "Service",
            Kind::Ingress => "Ingress",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::Custom(custom) => custom.kind(),
        }
    }

    /// The Kubernetes apiVersion.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::ConfigMap | Kind::Secret | Kind::Service | Kind::PersistentVolumeClaim => "v1",
            Kind::Ingress => "networking.k8s.io/v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::Custom(custom) => custom.api_version(),
        }
    }

    /// The key in Helm values and flag names (`configmap`, `endpointslice`, ...).
    pub fn key(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
            Kind::Service => "service",
            Kind::Ingress => "ingress",
            Kind::EndpointSlice => "endpointslice",
            Kind::PersistentVolumeClaim => "persistentvolumeclaim",
            Kind::Custom(custom) => custom.resource_name(),
        }
    }

    /// The built-in or registered custom kind of `api_version` and `kind`.
    pub fn lookup(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::from_kind(kind)
            .filter(|k| k.api_version() == api_version)
            .or_else(|| crate::custom_kind::lookup(api_version, kind).map(Kind::Custom))
    }

    /// Looks a built-in kind up by its Kubernetes kind.
    pub fn from_kind(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.kind() == kind)
    }

    /// Default number of workers (Liqo's defaults).
    pub fn default_workers(self) -> u32 {
        match self {
            Kind::EndpointSlice => 10,
            _ => 3,
        }
    }
}

/// Per-kind settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KindOptions {
    /// DenyList or AllowList. EndpointSlices inherit the Service policy.
    pub policy: Policy,
    /// Concurrent workers; 0 disables the kind.
    pub workers: u32,
}

/// Annotations never reflected by default: set by cloud controllers for the origin cluster,
/// or (kubectl's last-applied configuration) describing the origin object, which would
/// mislead `kubectl apply` on the provider.
pub const DEFAULT_SKIP_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    "cloud.google.com/neg",
    "cloud.google.com/neg-status",
    "kubernetes.digitalocean.com/load-balancer-id",
    "ingress.kubernetes.io/backends",
    "ingress.kubernetes.io/forwarding-rule",
    "ingress.kubernetes.io/target-proxy",
    "ingress.kubernetes.io/url-map",
    "metallb.universe.tf/address-pool",
    "metallb.universe.tf/ip-allocated-from-pool",
    "metallb.universe.tf/loadBalancerIPs",
    "loadbalancer.openstack.org/load-balancer-id",
];

/// Everything the forge needs to turn an origin object into the provider's desired object.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReflectionOptions {
    /// The origin cluster id.
    pub local_cluster_id: String,
    /// The provider cluster id.
    pub remote_cluster_id: String,
    /// Rewrites endpoint addresses for the provider.
    #[serde(default)]
    pub remapping: Remapping,
    /// Label keys never reflected.
    #[serde(default)]
    pub skip_labels: BTreeSet<String>,
    /// Annotation keys never reflected.
    #[serde(default = "default_skip_annotations")]
    pub skip_annotations: BTreeSet<String>,
    /// Per-kind policy and workers; kinds not listed use the defaults.
    #[serde(default)]
    pub kinds: BTreeMap<Kind, KindOptions>,
    /// The virtual node standing for the provider; empty means `refract-<provider id>`.
    #[serde(default)]
    pub virtual_node: String,
    /// The storage fabric: which claims are reflected and with which class.
    #[serde(default)]
    pub storage: StorageOptions,
    /// Offloaded pods' access to the origin API server (ServiceAccount tokens).
    #[serde(default)]
    pub api_server: ApiServerOptions,
    /// What every pod offloaded through this peering gets on the provider (Liqo's VirtualNode
    /// `spec.offloadingPatch`).
    #[serde(default)]
    pub offloading_patch: OffloadingPatch,
    /// Provider events recorded on the origin objects they are about: the policy is read on
    /// the provider event's own annotations, and 0 workers records none.
    #[serde(default = "default_event_options")]
    pub events: KindOptions,
    /// Custom resource kinds reflected besides the built-in ones, with their settings.
    #[serde(default)]
    pub custom_kinds: Vec<CustomReflection>,
}

/// A custom resource kind the local agent reflects, and how.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CustomReflection {
    /// The kind.
    pub kind: CustomKind,
    /// Its policy and workers.
    #[serde(flatten)]
    pub options: KindOptions,
    /// The fields of the copies' `status` brought back to the origin objects ([`ALL_STATUS`]:
    /// the whole status); empty: none.
    #[serde(default)]
    pub status: Vec<String>,
}

/// In a custom kind's `status` list: every field of the status.
pub const ALL_STATUS: &str = "*";

impl CustomReflection {
    /// What of a copy's `status` comes back: the fields listed, or all of it; `None` when
    /// nothing does.
    pub fn status_back(
        &self,
        status: &serde_json::Map<String, serde_json::Value>,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        if self.status.is_empty() {
            return None;
        }
        if self.status.iter().any(|f| f == ALL_STATUS) {
            return Some(status.clone());
        }
        Some(
            status
                .iter()
                .filter(|(key, _)| self.status.contains(key))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }
}

/// The key of provider events in Helm values (`offloading.reflection.event`).
pub const EVENT_KEY: &str = "event";

/// Liqo's defaults for the event reflector: DenyList, 3 workers.
pub fn default_event_options() -> KindOptions {
    KindOptions {
        policy: Policy::DenyList,
        workers: 3,
    }
}

/// Placement every offloaded pod gets on the provider, in Liqo's VirtualNode
/// `spec.offloadingPatch` terms. The origin pod's own node selector and affinity speak of the
/// origin and are dropped; these speak of the provider.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OffloadingPatch {
    /// Label keys not reflected to the provider (joins the skipped labels).
    #[serde(default)]
    pub labels_not_reflected: Vec<String>,
    /// Annotation keys not reflected to the provider (joins the skipped annotations).
    #[serde(default)]
    pub annotations_not_reflected: Vec<String>,
    /// The provider pod's node selector.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations added to the provider pod's.
    #[serde(default)]
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    /// The provider pod's node affinity (`affinity.nodeAffinity`; other affinities are not
    /// accepted).
    #[serde(default)]
    pub affinity: Option<PatchAffinity>,
    /// The provider pod's RuntimeClass when neither the pod's annotation nor its own (other
    /// than `liqo`) names one.
    #[serde(default)]
    pub runtime_class_name: Option<String>,
}

/// The affinity an offloading patch may set: node affinity only.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchAffinity {
    /// Where on the provider offloaded pods may run.
    #[serde(default)]
    pub node_affinity: Option<k8s_openapi::api::core::v1::NodeAffinity>,
}

impl OffloadingPatch {
    /// Reads a patch file (YAML or JSON), naming any unknown field.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    }
}

/// The storage fabric's settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageOptions {
    /// The origin storage class whose claims are provisioned on the provider.
    #[serde(default = "default_virtual_storage_class")]
    pub virtual_storage_class: String,
    /// The provider storage class reflected claims ask for; none means the provider's default.
    #[serde(default)]
    pub remote_storage_class: Option<String>,
}

/// Liqo's virtual storage class.
pub const DEFAULT_VIRTUAL_STORAGE_CLASS: &str = "liqo";

fn default_virtual_storage_class() -> String {
    DEFAULT_VIRTUAL_STORAGE_CLASS.into()
}

impl Default for StorageOptions {
    fn default() -> Self {
        Self {
            virtual_storage_class: default_virtual_storage_class(),
            remote_storage_class: None,
        }
    }
}

/// How offloaded pods reach the origin API server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerOptions {
    /// Reflect bound ServiceAccount tokens and point pods at the origin API server
    /// (`--enable-apiserver-support`).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The origin API server's host as the provider's pods reach it.
    #[serde(default)]
    pub host: Option<String>,
    /// The origin API server's port as the provider's pods reach it.
    #[serde(default)]
    pub port: Option<u16>,
}

fn enabled() -> bool {
    true
}

impl Default for ApiServerOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            host: None,
            port: None,
        }
    }
}

impl ApiServerOptions {
    /// `host:port` when both are configured (IPv6 hosts bracketed).
    pub fn address(&self) -> Option<(String, u16)> {
        let host = self.host.as_ref().filter(|h| !h.is_empty())?;
        Some((host.clone(), self.port?))
    }
}

fn default_skip_annotations() -> BTreeSet<String> {
    DEFAULT_SKIP_ANNOTATIONS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

impl ReflectionOptions {
    /// Options with Liqo's defaults for a peering.
    pub fn new(local_cluster_id: &str, remote_cluster_id: &str) -> Self {
        Self {
            local_cluster_id: local_cluster_id.to_string(),
            remote_cluster_id: remote_cluster_id.to_string(),
            remapping: Remapping::default(),
            skip_labels: BTreeSet::new(),
            skip_annotations: default_skip_annotations(),
            kinds: BTreeMap::new(),
            virtual_node: String::new(),
            storage: StorageOptions::default(),
            api_server: ApiServerOptions::default(),
            offloading_patch: OffloadingPatch::default(),
            events: default_event_options(),
            custom_kinds: Vec::new(),
        }
    }

    /// The virtual node's name (`refract-<provider id>` unless set).
    pub fn virtual_node_name(&self) -> String {
        if self.virtual_node.is_empty() {
            format!("refract-{}", self.remote_cluster_id)
        } else {
            self.virtual_node.clone()
        }
    }

    /// The settings of `kind` (EndpointSlices take the Service policy; a custom kind the
    /// values do not list has no workers).
    pub fn kind(&self, kind: Kind) -> KindOptions {
        if let Kind::Custom(custom) = kind {
            return self.custom_kinds.iter().find(|c| c.kind == custom).map_or(
                KindOptions {
                    policy: Policy::DenyList,
                    workers: 0,
                },
                |c| c.options,
            );
        }
        let mut o = self.kinds.get(&kind).copied().unwrap_or(KindOptions {
            policy: Policy::DenyList,
            workers: kind.default_workers(),
        });
        if kind == Kind::EndpointSlice {
            o.policy = self.kind(Kind::Service).policy;
        }
        o
    }

    /// Applies a Helm-values-shaped YAML document on top of these options.
    pub fn merge_values(&mut self, values: &HelmValues) {
        // The older spelling first, so that the current one wins where both say something.
        let current = values
            .offloading
            .as_ref()
            .and_then(|o| o.reflection.as_ref());
        for reflection in [values.reflection.as_ref(), current].into_iter().flatten() {
            self.merge_reflection(reflection);
        }
    }

    fn merge_reflection(&mut self, reflection: &ReflectionValues) {
        for kind in Kind::ALL {
            if let Some(r) = reflection.resources.get(kind.key()) {
                let mut o = self.kind(kind);
                if let Some(p) = r.r#type {
                    o.policy = p;
                }
                if let Some(w) = r.workers {
                    o.workers = w;
                }
                self.kinds.insert(kind, o);
            }
        }
        if let Some(r) = reflection.resources.get(EVENT_KEY) {
            self.events.policy = r.r#type.unwrap_or(self.events.policy);
            self.events.workers = r.workers.unwrap_or(self.events.workers);
        }
        for custom in &reflection.custom_kinds {
            // `HelmValues::from_yaml` registered every kind it accepted.
            let Ok(kind) = crate::custom_kind::register(&custom.name()) else {
                continue;
            };
            let reflection = CustomReflection {
                kind,
                options: KindOptions {
                    policy: custom.r#type.unwrap_or(Policy::DenyList),
                    workers: (custom.workers).unwrap_or(Kind::Custom(kind).default_workers()),
                },
                status: custom.status.clone(),
            };
            match self.custom_kinds.iter_mut().find(|c| c.kind == kind) {
                Some(existing) => *existing = reflection,
                None => self.custom_kinds.push(reflection),
            }
        }
        if let Some(skip) = &reflection.skip {
            self.skip_labels.extend(skip.labels.iter().cloned());
            self.skip_annotations
                .extend(skip.annotations.iter().cloned());
        }
    }
}

/// The subset of Liqo's Helm values Refract understands. Any other key is refused by name.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelmValues {
    /// `offloading:`
    pub offloading: Option<OffloadingValues>,
    /// `reflection:` at the top level, as older Liqo versions spell it (the same keys as
    /// `offloading.reflection`, which wins where both say something).
    pub reflection: Option<ReflectionValues>,
    /// `controllerManager:` (the resource sharing percentage only).
    #[serde(rename = "controllerManager")]
    pub controller_manager: Option<ControllerManagerValues>,
}

/// `controllerManager:`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerManagerValues {
    /// `controllerManager.config:`
    pub config: Option<ControllerManagerConfig>,
}

/// `controllerManager.config:`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ControllerManagerConfig {
    /// `resourceSharingPercentage: N`: the share of the provider's free resources the virtual
    /// node offers, 1 to 100.
    pub resource_sharing_percentage: Option<u32>,
}

impl HelmValues {
    /// Parses a values file; unknown keys are refused with their path, and the keys known there.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let values: HelmValues = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        if let Some(p) = values.sharing_percentage() {
            if !(1..=100).contains(&p) {
                return Err(format!(
                    "controllerManager.config.resourceSharingPercentage is {p}; it must be 1 to 100"
                ));
            }
        }
        let mut problems = Vec::new();
        let current = values
            .offloading
            .as_ref()
            .and_then(|o| o.reflection.as_ref());
        for (path, reflection) in [
            ("reflection", values.reflection.as_ref()),
            ("offloading.reflection", current),
        ] {
            let Some(reflection) = reflection else {
                continue;
            };
            for (i, custom) in reflection.custom_kinds.iter().enumerate() {
                if let Err(e) = crate::custom_kind::register(&custom.name()) {
                    problems.push(format!("{path}.customKinds[{i}]: {e}"));
                }
            }
            for key in reflection.resources.keys() {
                if key == EVENT_KEY || Kind::ALL.iter().any(|k| k.key() == key) {
                    continue;
                }
                problems.push(match ELSEWHERE.iter().find(|(liqo, _)| liqo == key) {
                    Some((_, flag)) => format!("{path}.{key} is set with {flag} here"),
                    None => format!("unknown key {path}.{key}"),
                });
            }
        }
        if problems.is_empty() {
            return Ok(values);
        }
        let known: Vec<&str> = Kind::ALL
            .iter()
            .map(|k| k.key())
            .chain([EVENT_KEY, "skip", "customKinds"])
            .collect();
        Err(format!(
            "{}; the keys under reflection are {}",
            problems.join("; "),
            known.join(", ")
        ))
    }
}

impl HelmValues {
    /// `controllerManager.config.resourceSharingPercentage`, when set.
    pub fn sharing_percentage(&self) -> Option<u32> {
        self.controller_manager
            .as_ref()?
            .config
            .as_ref()?
            .resource_sharing_percentage
    }
}

/// Liqo's reflection keys whose setting is a flag of the local agent here.
const ELSEWHERE: [(&str, &str); 2] = [
    ("pod", "--pod-reflection-workers"),
    (
        "serviceaccount",
        "--enable-apiserver-support (tokens are requested per offloaded pod)",
    ),
];

/// `offloading:`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffloadingValues {
    /// `offloading.reflection:`
    pub reflection: Option<ReflectionValues>,
}

/// `offloading.reflection:`
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct ReflectionValues {
    /// `offloading.reflection.skip:`
    pub skip: Option<SkipValues>,
    /// `offloading.reflection.customKinds:`
    #[serde(rename = "customKinds", default)]
    pub custom_kinds: Vec<CustomKindValues>,
    /// `offloading.reflection.<resource>:`
    #[serde(flatten)]
    pub resources: BTreeMap<String, ResourceValues>,
}

/// `offloading.reflection.skip:`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipValues {
    /// Label keys never reflected.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Annotation keys never reflected.
    #[serde(default)]
    pub annotations: Vec<String>,
}

/// One entry of `offloading.reflection.customKinds:` a custom resource kind to reflect, named
/// as in its CustomResourceDefinition, with the settings of a built-in kind.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomKindValues {
    /// `group: example.com`
    pub group: String,
    /// `version: v1`
    pub version: String,
    /// `kind: Widget`
    pub kind: String,
    /// `plural: widgets`
    pub plural: String,
    /// `type: DenyList|AllowList` (default DenyList)
    pub r#type: Option<Policy>,
    /// `workers: N` (default 3; 0 does not reflect the kind)
    pub workers: Option<u32>,
    /// `status: [field, ...]`: the copies' status fields brought back to the origin objects,
    /// `["*"]` for the whole status (default: none)
    #[serde(default)]
    pub status: Vec<String>,
}

impl CustomKindValues {
    /// The kind's name.
    pub fn name(&self) -> crate::custom_kind::CustomKindName {
        crate::custom_kind::CustomKindName {
            group: self.group.clone(),
            version: self.version.clone(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }
}

/// `offloading.reflection.<resource>:`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceValues {
    /// `type: DenyList|AllowList`
    pub r#type: Option<Policy>,
    /// `workers: N`
    pub workers: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_older_top_level_spelling_is_accepted_and_the_current_one_wins() {
        let values = HelmValues::from_yaml(
            "reflection:\n  secret: {type: AllowList, workers: 1}\n  ingress: {workers: 0}\noffloading:\n  reflection:\n    secret: {workers: 2}\n",
        )
        .unwrap();
        let mut o = ReflectionOptions::new("origin", "provider");
        o.merge_values(&values);
        assert_eq!(o.kind(Kind::Secret).policy, Policy::AllowList);
        assert_eq!(o.kind(Kind::Secret).workers, 2);
        assert_eq!(o.kind(Kind::Ingress).workers, 0);
    }

    #[test]
    fn events_take_a_policy_and_workers_as_liqo_spells_them() {
        let mut o = ReflectionOptions::new("origin", "provider");
        assert_eq!(o.events, default_event_options());
        let values =
            HelmValues::from_yaml("offloading:\n  reflection:\n    event: {type: AllowList}\n")
                .unwrap();
        o.merge_values(&values);
        assert_eq!(o.events.policy, Policy::AllowList);
        assert_eq!(o.events.workers, 3);
        let values = HelmValues::from_yaml("reflection:\n  event: {workers: 0}\n").unwrap();
        o.merge_values(&values);
        assert_eq!((o.events.policy, o.events.workers), (Policy::AllowList, 0));
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = HelmValues::from_yaml("reflection:\n  secrets: {workers: 0}\n  configmap: {workers: 1}\noffloading:\n  reflection:\n    pods: {workers: 1}\n")
            .unwrap_err();
        assert!(err.contains("unknown key reflection.secrets"), "{err}");
        assert!(
            err.contains("unknown key offloading.reflection.pods"),
            "{err}"
        );
        let err = HelmValues::from_yaml("offloading:\n  reflection:\n    pod: {workers: 4}\n")
            .unwrap_err();
        assert!(err.contains("--pod-reflection-workers"), "{err}");
        assert!(err.contains("secret, service"), "{err}");
        let err = HelmValues::from_yaml("networking:\n  enabled: true\n").unwrap_err();
        assert!(err.contains("networking"), "{err}");
        let err = HelmValues::from_yaml("reflection:\n  secret: {type: AllowList, worker: 2}\n")
            .unwrap_err();
        assert!(err.contains("worker"), "{err}");
    }

    #[test]
    fn custom_kinds_are_read_from_the_values_with_the_settings_of_a_kind() {
        let values = HelmValues::from_yaml(
            "offloading:\n  reflection:\n    customKinds:\n    - {group: values.test.refract.example, version: v1, kind: Widget, plural: widgets, type: AllowList}\n    - {group: values.test.refract.example, version: v1, kind: Doohickey, plural: doohickeys, workers: 0}\n",
        )
        .unwrap();
        let mut o = ReflectionOptions::new("a", "b");
        o.merge_values(&values);
        let widget = Kind::lookup("values.test.refract.example/v1", "Widget").unwrap();
        assert_eq!(o.kind(widget).policy, Policy::AllowList);
        assert_eq!(o.kind(widget).workers, 3);
        let gadget = Kind::lookup("values.test.refract.example/v1", "Doohickey").unwrap();
        assert_eq!(o.kind(gadget).workers, 0);
        assert_eq!(o.custom_kinds.len(), 2);

        let e = HelmValues::from_yaml(
            "offloading:\n  reflection:\n    customKinds:\n    - {group: apps, version: v1, kind: Deployment, plural: deployments}\n",
        )
        .unwrap_err();
        assert!(
            e.contains("offloading.reflection.customKinds[0]") && e.contains("apps"),
            "{e}"
        );
        let e = HelmValues::from_yaml(
            "offloading:\n  reflection:\n    customKinds:\n    - {group: x.example, version: v1, kind: Widget}\n",
        )
        .unwrap_err();
        assert!(e.contains("plural"), "{e}");
    }

    #[test]
    fn helm_values_override_defaults() {
        let values: HelmValues = serde_yaml_ng::from_str(
            "offloading:\n  reflection:\n    secret:\n      type: AllowList\n    configmap:\n      workers: 0\n    service:\n      type: AllowList\n    skip:\n      labels: [team]\n      annotations: [a.b/c]\n",
        )
        .unwrap();
        let mut o = ReflectionOptions::new("origin", "provider");
        o.merge_values(&values);
        assert_eq!(o.kind(Kind::Secret).policy, Policy::AllowList);
        assert_eq!(o.kind(Kind::Secret).workers, 3);
        assert_eq!(o.kind(Kind::ConfigMap).workers, 0);
        assert_eq!(o.kind(Kind::EndpointSlice).policy, Policy::AllowList);
        assert_eq!(o.kind(Kind::EndpointSlice).workers, 10);
        assert!(o.skip_labels.contains("team"));
        assert!(o.skip_annotations.contains("a.b/c"));
        assert!(o.skip_annotations.contains("cloud.google.com/neg"));
    }

    #[test]
    fn the_sharing_percentage_is_read_where_liqo_values_put_it_and_bounded() {
        let values = HelmValues::from_yaml(
            "controllerManager:\n  config:\n    resourceSharingPercentage: 40\n",
        )
        .unwrap();
        assert_eq!(values.sharing_percentage(), Some(40));
        assert_eq!(HelmValues::default().sharing_percentage(), None);
        let err = HelmValues::from_yaml(
            "controllerManager:\n  config:\n    resourceSharingPercentage: 0\n",
        )
        .unwrap_err();
        assert!(err.contains("1 to 100"), "{err}");
        let err = HelmValues::from_yaml("controllerManager:\n  replicas: 2\n").unwrap_err();
        assert!(err.contains("replicas"), "{err}");
    }
}
