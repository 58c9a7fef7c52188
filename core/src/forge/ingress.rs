//! Ingresses: reflected verbatim, with the ingress class left to the provider's default.

use k8s_openapi::api::networking::v1::{Ingress, IngressSpec};

use super::meta::{name_of, remote_meta};
use super::{reflect, Context, Decision, ForgeError};
use crate::options::Kind;

/// The legacy class annotation, removed like `ingressClassName`.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Forges an Ingress: `ingressClassName` and the legacy class annotation are dropped so the
/// provider's default class serves it (the origin's class may not exist there).
pub fn forge(ing: &Ingress, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
    let name = name_of(&ing.metadata, "Ingress")?;
    let mut metadata = remote_meta(&ing.metadata, name, ctx);
    if let Some(a) = metadata.annotations.as_mut() {
        a.remove(LEGACY_CLASS_ANNOTATION);
        if a.is_empty() {
            metadata.annotations = None;
        }
    }
    let spec = ing.spec.as_ref().map(|s| IngressSpec {
        ingress_class_name: None,
        default_backend: s.default_backend.clone(),
        rules: s.rules.clone(),
        tls: s.tls.clone(),
    });
    let out = Ingress {
        metadata,
        spec,
        status: None,
    };
    Ok(reflect(Kind::Ingress, ctx.remote_namespace, name, &out))
}
