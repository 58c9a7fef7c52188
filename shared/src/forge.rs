//! The forge: pure rules that turn an origin object into the object the provider should hold.
//!
//! One module per kind ([`configmap`], [`secret`], [`service`], [`ingress`], [`endpointslice`],
//! [`pvc`], [`pod`]), sharing [`meta`]; [`volume`] forges the origin PV of a provider PV and
//! [`token`] the provider Secret of an offloaded pod's ServiceAccount tokens. [`forge`] dispatches by kind and applies the reflection policy. The local
//! agent and `local-agent preview` both call [`forge`]; nothing here touches the network.

pub mod configmap;
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
    /// Origin nodes whose pods run on this provider (virtual nodes of this peering): their
    /// endpoints are not reflected, the provider has them already.
    pub provider_nodes: &'a BTreeSet<String>,
    /// Every origin node, when known; endpoints on unknown nodes are dropped.
    pub known_nodes: Option<&'a BTreeSet<String>>,
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

fn parse<T: DeserializeOwned>(kind: Kind, object: &serde_json::Value) -> Result<T, ForgeError> {
    serde_json::from_value(object.clone()).map_err(|source| ForgeError::Malformed {
        kind: kind.kind(),
        source,
    })
}

fn skip(reason: impl Into<String>) -> Decision {
    Decision::Skip {
        reason: reason.into(),
    }
}

/// Forges the provider's object for one origin object of `kind`, or says why it is skipped.
pub fn forge(
    kind: Kind,
    object: &serde_json::Value,
    ctx: &Context<'_>,
) -> Result<Decision, ForgeError> {
    let policy = ctx.options.kind(kind).policy;
    let decision = match kind {
        Kind::ConfigMap => {
            let cm: k8s_openapi::api::core::v1::ConfigMap = parse(kind, object)?;
            let root_ca = configmap::is_root_ca(&cm);
            let annotations = cm.metadata.annotations.as_ref();
            // The root CA ConfigMap is reflected whatever the policy, unless forced.
            let skipped = if root_ca {
                match policy::forced(annotations).map_err(ForgeError::Annotations)? {
                    Some(false) => Some("root CA ConfigMap explicitly skipped".to_string()),
                    _ => None,
                }
            } else {
                policy::skip_reason(policy, annotations)
            };
            match skipped {
                Some(reason) => skip(reason),
                None => configmap::forge(&cm, ctx)?,
            }
        }
        Kind::Secret => {
            let secret: k8s_openapi::api::core::v1::Secret = parse(kind, object)?;
            match policy::skip_reason(policy, secret.metadata.annotations.as_ref()) {
                Some(reason) => skip(reason),
                None => secret::forge(&secret, ctx)?,
            }
        }
        Kind::Service => {
            let svc: Service = parse(kind, object)?;
            if service::is_default_kubernetes(&svc.metadata) {
                return Ok(skip("the default/kubernetes Service is never reflected"));
            }
            match policy::skip_reason(policy, svc.metadata.annotations.as_ref()) {
                Some(reason) => skip(reason),
                None => service::forge(&svc, ctx)?,
            }
        }
        Kind::Ingress => {
            let ing: k8s_openapi::api::networking::v1::Ingress = parse(kind, object)?;
            match policy::skip_reason(policy, ing.metadata.annotations.as_ref()) {
                Some(reason) => skip(reason),
                None => ingress::forge(&ing, ctx)?,
            }
        }
        Kind::EndpointSlice => {
            let slice: k8s_openapi::api::discovery::v1::EndpointSlice = parse(kind, object)?;
            match endpointslice::skip_reason(&slice, ctx)? {
                Some(reason) => skip(reason),
                None => endpointslice::forge(&slice, ctx)?,
            }
        }
        // Claims follow the storage fabric's fixed rules, not a reflection policy (as in Liqo).
        Kind::PersistentVolumeClaim => {
            let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = parse(kind, object)?;
            pvc::forge(&claim, ctx)?
        }
    };
    Ok(decision)
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
