//! The forge: pure rules that turn an origin object into the object the provider should hold.
//!
//! One module per kind ([`configmap`], [`secret`], [`service`], [`ingress`], [`endpointslice`],
//! [`pvc`], [`pod`]), sharing [`meta`]; [`volume`] forges the origin PV of a provider PV and
//! [`token`] the provider Secret of an offloaded pod's ServiceAccount tokens. [`forge`] dispatches by kind and applies the reflection policy. The local
//! agent and `local-agent preview` both call [`forge`]; nothing here touches the network.

pub mod configmap;
pub mod custom;
pub mod endpointslice;
pub mod ingress;
pub mod meta;
pub mod pod;
pub mod pvc;
pub mod secret;
pub mod service;
pub mod token;
pub mod volume;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;

use crate::options::{Kind, ReflectionOptions};
use crate::policy;

/// What the forge needs besides the object itself.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// Peering options.
    pub options: &'a ReflectionOptions,
    /// The twin namespace on the provider.
    pub remote_namespace: &'a str,
    /// For an EndpointSlice: its Service (label `kubernetes.io/service-name`), when known.
    pub service: Option<&'a Service>,
    /// For an EndpointSlice: where the nodes its endpoints name are.
    pub nodes: &'a dyn Nodes,
}

/// Where an origin node is, as far as its endpoints are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeSite {
    /// A virtual node of this peering: its pods run on the provider, whose own control plane
    /// publishes their endpoints, so they are not reflected.
    Provider,
    /// A node of the origin (or a virtual node of another peering): reflected.
    Origin,
    /// A node the origin does not have (yet, or any more): dropped.
    Unknown,
}

/// Finds origin nodes by name.
///
/// The local agent looks each endpoint's node up in its watch of origin nodes, so forging a
/// slice costs a lookup per endpoint rather than a pass over every node of the origin.
pub trait Nodes: std::fmt::Debug + Sync {
    /// Where the node called `name` is.
    fn site(&self, name: &str) -> NodeSite;
}

/// Nodes given as lists up front (`local-agent preview`, the golden tests, kinds that name no
/// nodes).
#[derive(Debug, Clone, Default)]
pub struct NodeLists {
    /// This peering's virtual nodes.
    pub provider: BTreeSet<String>,
    /// Every origin node, when known; without it every node not in `provider` is the origin's.
    pub known: Option<BTreeSet<String>>,
}

/// No node lists: for kinds that name no nodes, every node counts as the origin's.
pub static NO_NODES: NodeLists = NodeLists {
    provider: BTreeSet::new(),
    known: None,
};

impl Nodes for NodeLists {
    fn site(&self, name: &str) -> NodeSite {
        if self.provider.contains(name) {
            NodeSite::Provider
        } else if self.known.as_ref().is_none_or(|known| known.contains(name)) {
            NodeSite::Origin
        } else {
            NodeSite::Unknown
        }
    }
}

/// The provider's desired object.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Desired {
    /// Its kind.
    pub kind: Kind,
    /// Provider namespace.
    pub namespace: String,
    /// Provider name.
    pub name: String,
    /// The complete object, as sent for server-side apply.
    pub object: serde_json::Value,
}

/// The forge's verdict on one object.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "decision")]
pub enum Decision {
    /// Reflect as this object.
    Reflect(Desired),
    /// Do not reflect, for this reason (a remote copy, if any, is removed).
    Skip {
        /// Why.
        reason: String,
    },
}

/// Why an object could not be forged.
#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    /// The object does not parse as its kind.
    #[error("malformed {kind}: {source}")]
    Malformed {
        /// The kind expected.
        kind: &'static str,
        /// The cause.
        source: serde_json::Error,
    },
    /// The object has no name.
    #[error("{0} has no metadata.name")]
    Unnamed(&'static str),
    /// The object's annotations contradict each other.
    #[error("{0}")]
    Annotations(String),
}

fn skip(reason: impl Into<String>) -> Decision {
    Decision::Skip {
        reason: reason.into(),
    }
}

/// Why `kind`'s reflection policy skips an object with `meta`, if it does.
fn policy_skip(kind: Kind, meta: &ObjectMeta, ctx: &Context<'_>) -> Option<String> {
    policy::skip_reason(ctx.options.kind(kind).policy, meta.annotations.as_ref())
}

/// Skips for `reason` when there is one, else forges.
fn skip_or(
    reason: Option<String>,
    forge: impl FnOnce() -> Result<Decision, ForgeError>,
) -> Result<Decision, ForgeError> {
    match reason {
        Some(reason) => Ok(skip(reason)),
        None => forge(),
    }
}

/// An origin object type the forge knows: its kind and its rules.
///
/// The local agent forges the typed objects its watches hold through this trait, so an object
/// is not serialized into a JSON tree and parsed back on every change (the profile of the local
/// agent's steady load found that round trip at 7 % of its CPU); [`forge`] is the same rules for
/// an object that arrives as JSON (`local-agent preview`, the golden tests).
pub trait Forgeable: DeserializeOwned {
    /// The kind of this type.
    const KIND: Kind;

    /// Forges the provider's object, or says why the object is skipped.
    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError>;

    /// The origin nodes whose [`NodeSite`] the forge asks [`Context::nodes`] about: when one
    /// of them joins, leaves or changes site, the object must be forged again.
    fn nodes_read(&self) -> Vec<&str> {
        Vec::new()
    }
}

impl Forgeable for k8s_openapi::api::core::v1::ConfigMap {
    const KIND: Kind = Kind::ConfigMap;

    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
        let annotations = self.metadata.annotations.as_ref();
        // The root CA ConfigMap is reflected whatever the policy, unless forced.
        let skipped = if configmap::is_root_ca(self) {
            match policy::forced(annotations).map_err(ForgeError::Annotations)? {
                Some(false) => Some("root CA ConfigMap explicitly skipped".to_string()),
                _ => None,
            }
        } else {
            policy_skip(Self::KIND, &self.metadata, ctx)
        };
        skip_or(skipped, || configmap::forge(self, ctx))
    }
}

impl Forgeable for k8s_openapi::api::core::v1::Secret {
    const KIND: Kind = Kind::Secret;

    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
        let skipped = policy_skip(Self::KIND, &self.metadata, ctx);
        skip_or(skipped, || secret::forge(self, ctx))
    }
}

impl Forgeable for Service {
    const KIND: Kind = Kind::Service;

    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
        if service::is_default_kubernetes(&self.metadata) {
            return Ok(skip("the default/kubernetes Service is never reflected"));
        }
        let skipped = policy_skip(Self::KIND, &self.metadata, ctx);
        skip_or(skipped, || service::forge(self, ctx))
    }
}

impl Forgeable for k8s_openapi::api::networking::v1::Ingress {
    const KIND: Kind = Kind::Ingress;

    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
        let skipped = policy_skip(Self::KIND, &self.metadata, ctx);
        skip_or(skipped, || ingress::forge(self, ctx))
    }
}

impl Forgeable for k8s_openapi::api::discovery::v1::EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;

    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
        let skipped = endpointslice::skip_reason(self, ctx)?;
        skip_or(skipped, || endpointslice::forge(self, ctx))
    }

    fn nodes_read(&self) -> Vec<&str> {
        endpointslice::nodes_named(self)
    }
}

impl Forgeable for k8s_openapi::api::core::v1::PersistentVolumeClaim {
    const KIND: Kind = Kind::PersistentVolumeClaim;

    /// Claims follow the storage fabric's fixed rules, not a reflection policy (as in Liqo).
    fn forge(&self, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
        pvc::forge(self, ctx)
    }
}

/// Forges the provider's object for one origin object of `kind` given as JSON, or says why it
/// is skipped.
pub fn forge(
    kind: Kind,
    object: &serde_json::Value,
    ctx: &Context<'_>,
) -> Result<Decision, ForgeError> {
    use k8s_openapi::api::{core::v1, discovery, networking};
    match kind {
        Kind::ConfigMap => parse::<v1::ConfigMap>(object)?.forge(ctx),
        Kind::Secret => parse::<v1::Secret>(object)?.forge(ctx),
        Kind::Service => parse::<Service>(object)?.forge(ctx),
        Kind::Ingress => parse::<networking::v1::Ingress>(object)?.forge(ctx),
        Kind::EndpointSlice => parse::<discovery::v1::EndpointSlice>(object)?.forge(ctx),
        Kind::PersistentVolumeClaim => parse::<v1::PersistentVolumeClaim>(object)?.forge(ctx),
        Kind::Custom(_) => custom::forge(kind, object, ctx),
    }
}

fn parse<T: Forgeable>(object: &serde_json::Value) -> Result<T, ForgeError> {
    // Deserializing from a borrowed value copies only what the type keeps, not the whole tree.
    T::deserialize(object).map_err(|source| ForgeError::Malformed {
        kind: T::KIND.kind(),
        source,
    })
}

fn reflect<T: serde::Serialize>(kind: Kind, namespace: &str, name: &str, typed: &T) -> Decision {
    let mut object = crate::json::to_value(typed);
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), kind.api_version().into());
        map.insert("kind".into(), kind.kind().into());
    }
    Decision::Reflect(Desired {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        object,
    })
}
