//! Secrets: reflected verbatim (data, type, immutable), except service-account tokens.

use k8s_openapi::api::core::v1::Secret;

use super::meta::{name_of, remote_meta};
use super::{reflect, skip, Context, Decision, ForgeError};
use crate::options::Kind;

/// The type of legacy service-account token Secrets.
pub const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

/// Forges a Secret. Legacy service-account token Secrets are never reflected: they would let
/// anyone who reads Secrets on the provider act as the origin's service account, and offloaded
/// pods get bound tokens instead.
pub fn forge(secret: &Secret, ctx: &Context<'_>) -> Result<Decision, ForgeError> {
    let name = name_of(&secret.metadata, "Secret")?;
    if secret.type_.as_deref() == Some(SA_TOKEN_TYPE) {
        return Ok(skip(format!(
            "Secrets of type {SA_TOKEN_TYPE} are never reflected"
        )));
    }
    let out = Secret {
        metadata: remote_meta(&secret.metadata, name, ctx),
        data: secret.data.clone(),
        string_data: secret.string_data.clone(),
        type_: secret.type_.clone(),
        immutable: secret.immutable,
    };
    Ok(reflect(Kind::Secret, ctx.remote_namespace, name, &out))
}
