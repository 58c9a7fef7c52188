//! What each tenant may have the provider write: the policy the remote agent enforces on every
//! object, whatever the origin sent.
//!
//! The policy is configured per tenant in a YAML file (`--policy`): `defaults` apply to every
//! tenant, and an entry under `tenants` overrides them field by field for one cluster id.
//! Without a file every tenant gets [`TenantPolicy::default`], with the pod security level of
//! `--pod-security-level`. The checks ([`check`]) are pure: they look at the desired object and
//! the policy, refuse with a [`Violation`] or normalize the object in place.

use std::collections::BTreeMap;
use std::path::Path;

use ipnet::IpNet;
use refract_shared::tls::ClusterId;
use serde::Deserialize;

use crate::kinds::{Allowed, CustomKind, CustomKindName};
use crate::network_fence::NetworkFence;
use crate::quota::Quota;

mod exposition;
pub mod namespace;
mod pod;
pub mod pod_security;
mod scheduling;
mod secret;
mod storage;

pub use namespace::ReservedNames;
pub use pod::secrets_read;
pub use pod_security::Level;

/// Why the provider refuses an object: the field and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Violation {
    /// The offending field, as a JSON path such as `spec.externalIPs`.
    pub field: String,
    /// What the rule is.
    pub reason: String,
}

impl Violation {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// One tenant's rights on this provider. Every field has a default; see the README's
/// "Provider policy" for the file format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TenantPolicy {
    /// The Pod Security Standards level the tenant's pods must meet (and the Pod Security
    /// Admission label on its namespaces).
    pub pod_security: Level,
    /// PriorityClasses the tenant's pods may name. Empty: none.
    pub priority_classes: Vec<String>,
    /// RuntimeClasses the tenant's pods may name. Empty: none (the provider's default runtime).
    pub runtime_classes: Vec<String>,
    /// Taint keys the tenant's pods may tolerate (a toleration without a key, i.e. of every
    /// taint, is never allowed). Empty: any key but the control plane's.
    pub toleration_keys: Vec<String>,
    /// Services.
    pub services: ServicePolicy,
    /// Ranges every EndpointSlice address must fall in: the addresses this provider assigned to
    /// the tenant's cluster. Empty: any address that is not forbidden outright (loopback,
    /// link-local, unspecified, multicast, or `--provider-cidr`).
    pub endpoint_ranges: Vec<IpNet>,
    /// Ingresses.
    pub ingress: IngressPolicy,
    /// StorageClasses the tenant's claims may use. Empty: any.
    pub storage_classes: Vec<String>,
    /// ServiceAccounts of the tenant's own namespaces on the provider its pods may run as, with
    /// that ServiceAccount's token mounted (pods annotated `liqo.io/api-server-support:
    /// remote`). The provider's operator creates them and grants their rights. Empty: none;
    /// tenant pods run as `default` without any provider token.
    pub service_accounts: Vec<String>,
    /// Names the tenant's twin namespaces may have besides those carrying its identity
    /// (`<namespace>-<tenant>`, the default naming): exact names, or prefixes ending in `*`
    /// (`*` alone: any name but the provider's own). Empty: only names carrying its identity.
    pub namespaces: Vec<String>,
    /// Node label keys the tenant's pods may select (`nodeSelector`, node affinity, and the
    /// topology keys of pod affinity and spread constraints): exact keys, or prefixes ending in
    /// `*`. Default: the well-known topology and platform labels
    /// ([`scheduling::DEFAULT_NODE_LABEL_KEYS`]).
    pub node_label_keys: Vec<String>,
    /// When the policy file changes and refuses a ShadowPod already running, delete it (its
    /// pod stops with its grace period, and the origin is told why). Otherwise it is reported
    /// and runs on until the origin sends it again.
    pub remove_refused: bool,
    /// How much of the provider the tenant may hold, all its namespaces together.
    pub quota: Quota,
    /// What the tenant's pods may reach and be reached from.
    pub network: NetworkFence,
    /// Custom resource kinds the tenant may write, each checked against the provider's own
    /// CustomResourceDefinition before it is written. Empty: none.
    pub custom_kinds: Vec<CustomKindName>,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        Self {
            pod_security: Level::Baseline,
            priority_classes: Vec::new(),
            runtime_classes: Vec::new(),
            toleration_keys: Vec::new(),
            services: ServicePolicy::default(),
            endpoint_ranges: Vec::new(),
            ingress: IngressPolicy::default(),
            storage_classes: Vec::new(),
            service_accounts: Vec::new(),
            namespaces: Vec::new(),
            node_label_keys: scheduling::DEFAULT_NODE_LABEL_KEYS
                .iter()
                .map(|k| k.to_string())
                .collect(),
            remove_refused: false,
            quota: Quota::default(),
            network: NetworkFence::default(),
            custom_kinds: Vec::new(),
        }
    }
}

/// What a tenant's Services may ask of the provider's network.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServicePolicy {
    /// Services of type LoadBalancer.
    pub allow_load_balancer: bool,
    /// A chosen `loadBalancerIP`.
    #[serde(rename = "allowLoadBalancerIP")]
    pub allow_load_balancer_ip: bool,
    /// Chosen node port numbers (otherwise the provider allocates them).
    pub allow_node_ports: bool,
    /// Services of type ExternalName: a name in the provider's DNS that the tenant chooses,
    /// which could be one of the provider's own Services (`kubernetes.default.svc`) reached
    /// through the tenant's Ingresses. Off by default.
    pub allow_external_name: bool,
}

impl Default for ServicePolicy {
    fn default() -> Self {
        Self {
            allow_load_balancer: true,
            allow_load_balancer_ip: false,
            allow_node_ports: false,
            allow_external_name: false,
        }
    }
}

/// What a tenant's Ingresses may ask of the provider's ingress controllers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IngressPolicy {
    /// Annotation keys allowed on Ingresses: exact keys, or prefixes ending in `*`. Keys
    /// naming a configuration snippet are refused whatever this says. Default:
    /// [`SAFE_INGRESS_ANNOTATIONS`].
    pub allowed_annotations: Vec<String>,
    /// Ingress classes the tenant may use. Empty: any.
    pub classes: Vec<String>,
}

/// Ingress annotations allowed by default: routing, TLS redirects, timeouts and sizes, CORS,
/// rate limits and session affinity of ingress-nginx, which act on the tenant's own traffic
/// only. Left out: authentication (`auth-url`, `auth-tls-*`: requests to and trust in
/// addresses the tenant chooses), mirroring (`mirror-*`: copies of traffic sent anywhere),
/// snippets and the other configuration families, custom backends and upstream rewrites, and
/// certificate issuers (the provider's to grant). A provider widens the list per tenant in its
/// policy.
pub const SAFE_INGRESS_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    "kubernetes.io/ingress.class",
    "nginx.ingress.kubernetes.io/rewrite-target",
    "nginx.ingress.kubernetes.io/use-regex",
    "nginx.ingress.kubernetes.io/app-root",
    "nginx.ingress.kubernetes.io/ssl-redirect",
    "nginx.ingress.kubernetes.io/force-ssl-redirect",
    "nginx.ingress.kubernetes.io/backend-protocol",
    "nginx.ingress.kubernetes.io/proxy-body-size",
    "nginx.ingress.kubernetes.io/proxy-connect-timeout",
    "nginx.ingress.kubernetes.io/proxy-read-timeout",
    "nginx.ingress.kubernetes.io/proxy-send-timeout",
    "nginx.ingress.kubernetes.io/proxy-buffering",
    "nginx.ingress.kubernetes.io/enable-cors",
    "nginx.ingress.kubernetes.io/cors-allow-origin",
    "nginx.ingress.kubernetes.io/cors-allow-methods",
    "nginx.ingress.kubernetes.io/cors-allow-headers",
    "nginx.ingress.kubernetes.io/cors-allow-credentials",
    "nginx.ingress.kubernetes.io/cors-max-age",
    "nginx.ingress.kubernetes.io/limit-rps",
    "nginx.ingress.kubernetes.io/limit-rpm",
    "nginx.ingress.kubernetes.io/limit-connections",
    "nginx.ingress.kubernetes.io/whitelist-source-range",
    "nginx.ingress.kubernetes.io/affinity",
    "nginx.ingress.kubernetes.io/affinity-mode",
    "nginx.ingress.kubernetes.io/session-cookie-name",
    "nginx.ingress.kubernetes.io/session-cookie-path",
    "nginx.ingress.kubernetes.io/session-cookie-max-age",
    "nginx.ingress.kubernetes.io/session-cookie-expires",
];

impl Default for IngressPolicy {
    fn default() -> Self {
        Self {
            allowed_annotations: SAFE_INGRESS_ANNOTATIONS
                .iter()
                .map(|a| a.to_string())
                .collect(),
            classes: Vec::new(),
        }
    }
}

/// The provider's own networks, from `--provider-cidr`.
#[derive(Debug, Clone, Default)]
pub struct ProviderNetworks {
    /// The provider's own pod and Service ranges: no tenant endpoint may point into them.
    pub cidrs: Vec<IpNet>,
}

/// The policy file: defaults and per-tenant overrides.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    defaults: TenantPolicy,
    tenants: BTreeMap<String, TenantPolicy>,
}

/// A policy file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("failed to read policy file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid policy.
    #[error("invalid policy file {path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: serde_json::Value,
    #[serde(default)]
    tenants: BTreeMap<String, serde_json::Value>,
}

impl Policies {
    /// Whose policy differs from `old`'s: `defaults` and each tenant entry changed, added or
    /// removed (a tenant without an entry follows the defaults).
    pub fn changes_from(&self, old: &Policies) -> Vec<String> {
        let mut changes = Vec::new();
        if self.defaults != old.defaults {
            changes.push("defaults changed".to_string());
        }
        let tenants: std::collections::BTreeSet<&String> =
            self.tenants.keys().chain(old.tenants.keys()).collect();
        for tenant in tenants {
            match (old.tenants.get(tenant), self.tenants.get(tenant)) {
                (None, Some(_)) => changes.push(format!("tenant {tenant} added")),
                (Some(_), None) => changes.push(format!("tenant {tenant} removed")),
                (Some(was), Some(is)) if was != is => {
                    changes.push(format!("tenant {tenant} changed"))
                }
                _ => {}
            }
        }
        changes
    }

    /// Every tenant gets `defaults`.
    pub fn uniform(defaults: TenantPolicy) -> Self {
        Self {
            defaults,
            tenants: BTreeMap::new(),
        }
    }

    /// Reads a policy file; fields it does not set keep `base`'s values.
    pub fn load(path: &Path, base: TenantPolicy) -> Result<Self, PolicyError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, base).map_err(|message| PolicyError::Invalid {
            path: shown,
            message,
        })
    }

    /// Parses a policy file's text.
    pub fn parse(text: &str, base: TenantPolicy) -> Result<Self, String> {
        // An empty file (or one of comments only) sets nothing.
        let file: File = match serde_yaml_ng::from_str::<Option<File>>(text) {
            Ok(file) => file.unwrap_or_default(),
            Err(e) => return Err(e.to_string()),
        };
        let base = serde_json::to_value(BaseView(&base)).map_err(|e| e.to_string())?;
        let defaults_value = overlay(base, file.defaults);
        let at = |key: &str, error: String| match line_of(text, key) {
            Some(line) => format!("line {line}: {error}"),
            None => error,
        };
        let defaults: TenantPolicy = serde_json::from_value(defaults_value.clone())
            .map_err(|e| at("defaults", format!("defaults: {e}")))?;
        defaults
            .quota
            .validate()
            .map_err(|e| at("defaults", format!("defaults.{e}")))?;
        validate_custom_kinds(&defaults.custom_kinds)
            .map_err(|e| at("customKinds", format!("defaults.customKinds: {e}")))?;
        let mut tenants = BTreeMap::new();
        for (tenant, value) in file.tenants {
            ClusterId::parse(&tenant).map_err(|e| at(&tenant, format!("tenants.{tenant}: {e}")))?;
            let policy: TenantPolicy =
                serde_json::from_value(overlay(defaults_value.clone(), value))
                    .map_err(|e| at(&tenant, format!("tenants.{tenant}: {e}")))?;
            policy
                .quota
                .validate()
                .map_err(|e| at(&tenant, format!("tenants.{tenant}.{e}")))?;
            validate_custom_kinds(&policy.custom_kinds)
                .map_err(|e| at(&tenant, format!("tenants.{tenant}.customKinds: {e}")))?;
            tenants.insert(tenant, policy);
        }
        let every = Self { defaults, tenants };
        validate_custom_kinds(&every.custom_kinds().into_iter().collect::<Vec<_>>())?;
        Ok(every)
    }

    /// Every custom kind some tenant may write.
    pub fn custom_kinds(&self) -> std::collections::BTreeSet<CustomKindName> {
        std::iter::once(&self.defaults)
            .chain(self.tenants.values())
            .flat_map(|p| p.custom_kinds.iter().cloned())
            .collect()
    }

    /// The policy of `tenant`.
    pub fn of(&self, tenant: &ClusterId) -> &TenantPolicy {
        self.tenants.get(tenant.as_str()).unwrap_or(&self.defaults)
    }

    /// The tenants the file names.
    pub fn named_tenants(&self) -> Vec<String> {
        self.tenants.keys().cloned().collect()
    }
}

/// Checks each custom kind's name, and that no two differ but share their kind name (the
/// agents tell kinds apart by it).
fn validate_custom_kinds(kinds: &[CustomKindName]) -> Result<(), String> {
    for (i, kind) in kinds.iter().enumerate() {
        kind.validate()?;
        let same_kind = |other: &&CustomKindName| other.kind == kind.kind;
        if let Some(other) = kinds[..i].iter().find(same_kind).filter(|o| *o != kind) {
            return Err(format!(
                "{kind} and {other} have the same kind name; one custom kind per kind name"
            ));
        }
    }
    Ok(())
}

/// The line (from 1) where the policy file's text first names `key` as a map key (`defaults`,
/// or a tenant's entry; plain, quoted, or in a flow map); `None` when not found. The YAML
/// parser gives lines for its own errors; an entry that parses but is not a valid policy is
/// only known by its key.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let forms = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ];
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            forms.iter().any(|f| {
                line.starts_with(f.as_str())
                    || line.contains(&format!("{{{f}"))
                    || line.contains(&format!(" {f}"))
            })
        })
        .map(|i| i + 1)
}

/// `top` laid over `base`: maps are merged key by key, anything else replaces.
fn overlay(base: serde_json::Value, top: serde_json::Value) -> serde_json::Value {
    match (base, top) {
        (serde_json::Value::Object(mut base), serde_json::Value::Object(top)) => {
            for (k, v) in top {
                let merged = match base.remove(&k) {
                    Some(b) => overlay(b, v),
                    None => v,
                };
                base.insert(k, merged);
            }
            serde_json::Value::Object(base)
        }
        (base, serde_json::Value::Null) => base,
        (_, top) => top,
    }
}

/// [`TenantPolicy`] in the file's own format, for laying a file over it.
struct BaseView<'a>(&'a TenantPolicy);

impl serde::Serialize for BaseView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.0;
        serde_json::json!({
            "podSecurity": p.pod_security.as_str(),
            "priorityClasses": p.priority_classes,
            "runtimeClasses": p.runtime_classes,
            "tolerationKeys": p.toleration_keys,
            "services": {
                "allowLoadBalancer": p.services.allow_load_balancer,
                "allowLoadBalancerIP": p.services.allow_load_balancer_ip,
                "allowNodePorts": p.services.allow_node_ports,
                "allowExternalName": p.services.allow_external_name,
            },
            "endpointRanges": p.endpoint_ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "ingress": {
                "allowedAnnotations": p.ingress.allowed_annotations,
                "classes": p.ingress.classes,
            },
            "storageClasses": p.storage_classes,
            "serviceAccounts": p.service_accounts,
            "namespaces": p.namespaces,
            "nodeLabelKeys": p.node_label_keys,
            "removeRefused": p.remove_refused,
            "quota": p.quota,
            "network": p.network,
            "customKinds": p.custom_kinds,
        })
        .serialize(s)
    }
}

/// Checks `object` (the whole desired object of `kind`) against `policy`, normalizing what
/// the provider decides on its own (labels of namespaces, service account mounts of pods).
pub fn check(
    kind: Allowed,
    object: &mut serde_json::Value,
    policy: &TenantPolicy,
    provider: &ProviderNetworks,
) -> Result<(), Violation> {
    use refract_core::options::Kind;
    match kind {
        Allowed::Namespace => namespace::check(object),
        Allowed::ShadowPod => pod::check(object, policy),
        Allowed::Reflected(Kind::Service) => exposition::check_service(object, &policy.services),
        Allowed::Reflected(Kind::EndpointSlice) => {
            exposition::check_endpoint_slice(object, policy, provider)
        }
        Allowed::Reflected(Kind::Ingress) => exposition::check_ingress(object, &policy.ingress),
        Allowed::Reflected(Kind::PersistentVolumeClaim) => storage::check_claim(object, policy),
        Allowed::Reflected(Kind::Secret) => secret::check(object),
        Allowed::Reflected(Kind::ConfigMap) => Ok(()),
        // What the object holds is its schema's to check, on the provider's API server
        // (`apply::schema`); the policy says only whether the tenant may have the kind.
        Allowed::Reflected(Kind::Custom(custom)) => custom_kind_allowed(custom, policy),
    }
}

/// Whether `policy` lets the tenant write objects of `custom`.
fn custom_kind_allowed(custom: CustomKind, policy: &TenantPolicy) -> Result<(), Violation> {
    if policy.custom_kinds.iter().any(|k| k == custom.name()) {
        return Ok(());
    }
    Err(Violation::new(
        "kind",
        format!(
            "{} {} is not among the custom kinds this tenant may write (customKinds)",
            custom.api_version(),
            custom.kind()
        ),
    ))
}

/// Removes what only the provider's API server sets, or what would tie the object to objects
/// that are not the tenant's: identity and version fields, owner references, finalizers (a
/// tenant's finalizer could keep an object from ever being deleted), managed fields and status.
pub fn strip_server_fields(object: &mut serde_json::Value) {
    if let Some(o) = object.as_object_mut() {
        o.remove("status");
    }
    if let Some(meta) = object["metadata"].as_object_mut() {
        for field in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "ownerReferences",
            "finalizers",
            "managedFields",
            "selfLink",
            "generateName",
        ] {
            meta.remove(field);
        }
    }
}

/// Decodes `value` as `T`, or says which field is malformed.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    field: &str,
) -> Result<T, Violation> {
    serde_json::from_value(value.clone())
        .map_err(|e| Violation::new(field, format!("is not well-formed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_entry_overrides_the_defaults_field_by_field() {
        let text = "defaults:\n  podSecurity: restricted\n  services: {allowNodePorts: true}\ntenants:\n  origin-a:\n    services: {allowLoadBalancer: false}\n    storageClasses: [fast]\n";
        let p = Policies::parse(text, TenantPolicy::default()).unwrap();
        let a = p.of(&ClusterId::parse("origin-a").unwrap());
        assert_eq!(a.pod_security, Level::Restricted);
        assert!(a.services.allow_node_ports, "inherited from defaults");
        assert!(!a.services.allow_load_balancer);
        assert_eq!(a.storage_classes, vec!["fast".to_string()]);
        let b = p.of(&ClusterId::parse("origin-b").unwrap());
        assert!(b.services.allow_load_balancer);
        assert!(b.storage_classes.is_empty());
    }

    #[test]
    fn a_change_says_whose_policy_changed() {
        let parse = |text| Policies::parse(text, TenantPolicy::default()).unwrap();
        let old = parse("tenants:\n  a: {podSecurity: baseline}\n  b: {podSecurity: baseline}\n");
        let new = parse("defaults: {podSecurity: restricted}\ntenants:\n  a: {podSecurity: restricted}\n  b: {podSecurity: baseline}\n  c: {}\n");
        assert_eq!(
            new.changes_from(&old),
            ["defaults changed", "tenant a changed", "tenant c added"]
        );
        assert_eq!(old.changes_from(&new).last().unwrap(), "tenant c removed");
        assert!(new.changes_from(&new).is_empty());
    }

    #[test]
    fn an_empty_file_sets_nothing() {
        let p = Policies::parse("# nothing yet\n", TenantPolicy::default()).unwrap();
        assert_eq!(
            p.of(&ClusterId::parse("x").unwrap()),
            &TenantPolicy::default()
        );
    }

    #[test]
    fn fields_not_in_the_file_keep_the_base() {
        let base = TenantPolicy {
            pod_security: Level::Privileged,
            ..TenantPolicy::default()
        };
        let p = Policies::parse("tenants: {}\n", base.clone()).unwrap();
        assert_eq!(p.of(&ClusterId::parse("x").unwrap()), &base);
    }

    #[test]
    fn only_the_tenants_the_policy_names_may_write_a_custom_kind() {
        let text = "tenants:\n  shop:\n    customKinds:\n    - {group: policy.test.refract.example, version: v1, kind: Gear, plural: gears}\n  lab: {}\n";
        let p = Policies::parse(text, TenantPolicy::default()).unwrap();
        let names = p.custom_kinds();
        assert_eq!(names.len(), 1);
        let widget = crate::kinds::custom::register(names.first().unwrap()).unwrap();
        let mut object = serde_json::json!({"spec": {"anything": 1}});
        let shop = p.of(&ClusterId::parse("shop").unwrap());
        let none = ProviderNetworks::default();
        assert_eq!(
            check(
                Allowed::Reflected(refract_core::options::Kind::Custom(widget)),
                &mut object,
                shop,
                &none
            ),
            Ok(())
        );
        let lab = p.of(&ClusterId::parse("lab").unwrap());
        let refused = check(
            Allowed::Reflected(refract_core::options::Kind::Custom(widget)),
            &mut object,
            lab,
            &none,
        )
        .unwrap_err();
        assert!(
            refused.reason.contains("not among the custom kinds"),
            "{refused}"
        );
    }

    #[test]
    fn a_custom_kind_of_kubernetes_or_named_twice_is_refused_with_where() {
        let e = Policies::parse(
            "defaults:\n  customKinds: [{group: networking.k8s.io, version: v1, kind: Ingress, plural: ingresses}]\n",
            TenantPolicy::default(),
        )
        .unwrap_err();
        assert!(
            e.contains("defaults.customKinds") && e.contains("Kubernetes'"),
            "{e}"
        );
        let e = Policies::parse(
            "tenants:\n  a:\n    customKinds: [{group: example.com, version: v1, kind: Widget, plural: widgets}]\n  b:\n    customKinds: [{group: example.com, version: v1, kind: Widget, plural: gadgets}]\n",
            TenantPolicy::default(),
        )
        .unwrap_err();
        assert!(e.contains("same kind name"), "{e}");
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused_with_where() {
        let e = Policies::parse(
            "defaults: {podSecurty: baseline}\n",
            TenantPolicy::default(),
        )
        .unwrap_err();
        assert!(e.contains("podSecurty"), "{e}");
        let e = Policies::parse(
            "tenants: {a: {endpointRanges: [not-a-cidr]}}\n",
            TenantPolicy::default(),
        )
        .unwrap_err();
        assert!(e.contains("tenants.a"), "{e}");
        let e = Policies::parse(
            "defaults:\n  podSecurity: baseline\ntenants:\n  shop:\n    services: {allowNodePorts: true}\n  lab:\n    quota: {hard: {cpu: 1}}\n",
            TenantPolicy::default(),
        )
        .unwrap_err();
        assert!(e.starts_with("line 6: tenants.lab.quota.hard.cpu"), "{e}");
        let e =
            Policies::parse("tenants: {\"Bad_Id\": {}}\n", TenantPolicy::default()).unwrap_err();
        assert!(e.contains("Bad_Id"), "{e}");
    }

    #[test]
    fn a_tenants_network_fence_overrides_the_defaults_field_by_field() {
        let policies = Policies::parse(
            "defaults:\n  network: {egressDenied: [10.50.0.0/16]}\ntenants:\n  lab:\n    network: {enabled: false}\n  shop:\n    network: {ingressFromNamespaces: [{team: ingress}], ingressAllowed: [10.121.0.0/16]}\n",
            TenantPolicy::default(),
        )
        .unwrap();
        let lab = &policies.of(&ClusterId::parse("lab").unwrap()).network;
        assert!(!lab.enabled);
        let shop = &policies.of(&ClusterId::parse("shop").unwrap()).network;
        assert!(shop.enabled);
        assert_eq!(
            shop.egress_denied,
            ["10.50.0.0/16".parse::<IpNet>().unwrap()]
        );
        assert_eq!(shop.ingress_from_namespaces[0]["team"], "ingress");
        assert_eq!(
            shop.ingress_allowed,
            ["10.121.0.0/16".parse::<IpNet>().unwrap()]
        );
        let e = Policies::parse(
            "tenants: {a: {network: {egressDenied: [nope]}}}\n",
            TenantPolicy::default(),
        )
        .unwrap_err();
        assert!(e.contains("tenants.a"), "{e}");
    }
}
