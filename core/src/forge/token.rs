//! ServiceAccount tokens for offloaded pods, so they can talk to the origin API server.
//!
//! Each projected `serviceAccountToken` source of an offloaded pod (and the legacy token
//! Secret volume older clusters mount, see [`is_legacy_token_volume`]) is served on the provider
//! from one Secret per pod (`<pod>-token`), one key per source (`<volume>-<first 6 hex of
//! sha256(path)>`). The local agent fills it with bound tokens from the origin's TokenRequest
//! API, with the audience and lifetime the pod asks for; the pod forge mounts that key where
//! the token would have been. Turned off by `--enable-apiserver-support=false`, or for one pod
//! by its annotation `liqo.io/api-server-support: disabled`; with `remote` the pod uses a
//! provider ServiceAccount's token instead ([`ApiServerAccess`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use sha2::{Digest, Sha256};

use super::Context;
use crate::keys::{
    API_SERVER_SUPPORT_ANNOTATION, DESTINATION_LABEL, EXPIRATION_ANNOTATION, FOR_POD_ANNOTATION,
    FOR_POD_UID_ANNOTATION, NODE_NAME_LABEL, ORIGIN_LABEL, REMOTE_SERVICE_ACCOUNT_ANNOTATION,
    SERVICE_ACCOUNT_LABEL,
};

/// Lifetime of a projected token that does not say (the Kubernetes default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The longest lifetime of an origin token handed to the provider. The default
/// `kube-api-access` volume asks 3607 s, which origin API servers extend to a year by default
/// (`--service-account-extend-token-expiration`); a provider then holds a token of the origin
/// for a year. Capped, every token the provider holds expires within the hour, and the local
/// agent renews it before then.
pub const MAX_EXPIRATION_SECONDS: i64 = 3600;

/// The lifetime the local agent asks the origin for, for a token the pod asks `asked` seconds
/// of: at most [`MAX_EXPIRATION_SECONDS`], and never the 3607 s an API server would extend.
pub fn requested_lifetime(asked: i64) -> i64 {
    asked.min(MAX_EXPIRATION_SECONDS)
}

/// One projected token a pod mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSource {
    /// The key in the token Secret.
    pub key: String,
    /// The audience asked for; `None` means the API server's own.
    pub audience: Option<String>,
    /// The lifetime asked for.
    pub expiration_seconds: i64,
}

/// The name of the provider Secret holding `pod`'s tokens.
pub fn token_secret_name(pod: &str) -> String {
    format!("{pod}-token")
}

/// The Secret key for the token projected at `path` of volume `volume`.
pub fn token_key(volume: &str, path: &str) -> String {
    let digest = Sha256::digest(path.as_bytes());
    let hex: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    format!("{volume}-{hex}")
}

/// Which API server an offloaded pod's in-cluster clients reach, and with whose credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiServerAccess {
    /// None: the pod's tokens are removed (`--enable-apiserver-support=false`, or the pod's
    /// annotation `liqo.io/api-server-support: disabled`).
    Disabled,
    /// The origin's, as the pod's own ServiceAccount: origin tokens are served from the pod's
    /// token Secret (the default).
    Origin,
    /// The provider's, as the provider ServiceAccount `service_account` in the twin namespace
    /// (annotation `liqo.io/api-server-support: remote`): the provider mounts its own token,
    /// if its policy lets the tenant use that ServiceAccount.
    Provider {
        /// The provider ServiceAccount.
        service_account: String,
    },
}

/// How `pod` reaches an API server: the pod's `liqo.io/api-server-support` annotation
/// (`disabled` or `remote`) overrides the agent's setting; other values are ignored, as in Liqo.
pub fn api_server_access(pod: &Pod, ctx: &Context<'_>) -> ApiServerAccess {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    match annotation(API_SERVER_SUPPORT_ANNOTATION) {
        Some("disabled") => ApiServerAccess::Disabled,
        Some("remote") => ApiServerAccess::Provider {
            service_account: annotation(REMOTE_SERVICE_ACCOUNT_ANNOTATION)
                .map(str::to_string)
                .unwrap_or_else(|| service_account_of(pod)),
        },
        _ if ctx.options.api_server.enabled => ApiServerAccess::Origin,
        _ => ApiServerAccess::Disabled,
    }
}

/// Whether `pod` gets origin tokens from the local agent.
pub fn origin_tokens(pod: &Pod, ctx: &Context<'_>) -> bool {
    api_server_access(pod, ctx) == ApiServerAccess::Origin
}

/// Whether `volume` is the legacy ServiceAccount token volume of a pod running as
/// `service_account`: what the ServiceAccount admission plugin of Kubernetes up to 1.20 mounts,
/// a Secret volume named after its Secret `<service account>-token-<suffix>`. That Secret never
/// leaves the origin (legacy token Secrets are never reflected), so the forge serves the token
/// from the pod's token Secret instead, as for a projected token at path `token`.
pub fn is_legacy_token_volume(volume: &Volume, service_account: &str) -> bool {
    volume.secret.as_ref().is_some_and(|s| {
        s.secret_name.as_deref() == Some(volume.name.as_str())
            && volume
                .name
                .strip_prefix(service_account)
                .is_some_and(|rest| rest.starts_with("-token-"))
    })
}

/// The token file's name in a legacy ServiceAccount token volume.
pub const LEGACY_TOKEN_PATH: &str = "token";

/// Every token `pod` mounts: its projected `serviceAccountToken` sources and its legacy token
/// volume (see [`is_legacy_token_volume`]).
pub fn token_sources(pod: &Pod) -> Vec<TokenSource> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let service_account = service_account_of(pod);
    let legacy = volumes
        .into_iter()
        .flatten()
        .filter(|v| is_legacy_token_volume(v, &service_account))
        .map(|v| TokenSource {
            key: token_key(&v.name, LEGACY_TOKEN_PATH),
            audience: None,
            expiration_seconds: DEFAULT_EXPIRATION_SECONDS,
        });
    let projected = volumes.into_iter().flatten().flat_map(|v| {
        let sources = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        sources
            .into_iter()
            .flatten()
            .filter_map(|s| s.service_account_token.as_ref())
            .map(|t| TokenSource {
                key: token_key(&v.name, &t.path),
                audience: t.audience.clone().filter(|a| !a.is_empty()),
                expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
            })
    });
    projected.chain(legacy).collect()
}

/// The service account whose tokens `pod` mounts.
pub fn service_account_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// The provider Secret holding `tokens` (key → token) for `pod`, whose earliest token expires
/// at `expiration` (RFC 3339).
pub fn token_secret(
    pod: &Pod,
    tokens: &BTreeMap<String, String>,
    expiration: &str,
    ctx: &Context<'_>,
) -> serde_json::Value {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let o = ctx.options;
    let labels = BTreeMap::from([
        (ORIGIN_LABEL.to_string(), o.local_cluster_id.clone()),
        (DESTINATION_LABEL.to_string(), o.remote_cluster_id.clone()),
        (SERVICE_ACCOUNT_LABEL.to_string(), service_account_of(pod)),
        (NODE_NAME_LABEL.to_string(), o.virtual_node_name()),
    ]);
    let annotations = BTreeMap::from([
        (FOR_POD_ANNOTATION.to_string(), name.clone()),
        (
            FOR_POD_UID_ANNOTATION.to_string(),
            pod.metadata.uid.clone().unwrap_or_default(),
        ),
        (EXPIRATION_ANNOTATION.to_string(), expiration.to_string()),
    ]);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(token_secret_name(&name)),
            namespace: Some(ctx.remote_namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        data: Some(
            tokens
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        immutable: Some(false),
        string_data: None,
    };
    let mut value = crate::json::to_value(&secret);
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_tokens_are_asked_for_an_hour_at_most() {
        // The default kube-api-access volume's 3607 s, which an API server extends to a year.
        assert_eq!(requested_lifetime(3607), 3600);
        assert_eq!(requested_lifetime(86_400), 3600);
        assert_eq!(requested_lifetime(600), 600);
        assert_eq!(requested_lifetime(DEFAULT_EXPIRATION_SECONDS), 3600);
    }

    #[test]
    fn keys_are_stable_and_distinguish_paths() {
        assert_eq!(
            token_key("kube-api-access-x", "token"),
            token_key("kube-api-access-x", "token")
        );
        assert_ne!(token_key("v", "token"), token_key("v", "other"));
        assert!(token_key("v", "token").starts_with("v-"));
        assert_eq!(token_key("v", "token").len(), "v-".len() + 6);
    }

    #[test]
    fn the_legacy_token_volume_is_a_token_source_and_look_alikes_are_not() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {
                "containers": [{"name": "c"}],
                "volumes": [
                    {"name": "default-token-ab12c", "secret": {"secretName": "default-token-ab12c"}},
                    {"name": "data", "secret": {"secretName": "default-token-other"}},
                    {"name": "builder-token-zz", "secret": {"secretName": "builder-token-zz"}}
                ]
            }
        }))
        .unwrap();
        assert_eq!(
            token_sources(&pod),
            vec![TokenSource {
                key: token_key("default-token-ab12c", LEGACY_TOKEN_PATH),
                audience: None,
                expiration_seconds: DEFAULT_EXPIRATION_SECONDS,
            }]
        );
    }
}
