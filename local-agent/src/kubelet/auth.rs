//! Who may call the virtual node's kubelet API, decided as a kubelet decides it: the caller is
//! the subject of a client certificate signed by `--kubelet-client-ca` (how the API server
//! calls kubelets) or the owner of a bearer token the origin's TokenReview accepts; the origin's
//! SubjectAccessReview then decides whether that user may use the `nodes` subresource of this
//! node with the request's verb. There is no anonymous access.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::lock::Locked;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// An authenticated caller.
#[derive(Debug, Clone, Default)]
pub struct User {
    /// The user name.
    pub name: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its UID, when the token review gave one.
    pub uid: Option<String>,
    /// Extra attributes from the token review.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is not let in.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Neither a client certificate nor a bearer token.
    #[error("Unauthorized: no client certificate or bearer token")]
    Anonymous,
    /// The token was not accepted.
    #[error("Unauthorized: {0}")]
    BadToken(String),
    /// The user may not do this.
    #[error(
        "Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource}): {reason}"
    )]
    Forbidden {
        /// Who.
        user: String,
        /// The verb.
        verb: String,
        /// The subresource.
        subresource: String,
        /// The reviewer's reason.
        reason: String,
    },
    /// The origin's API server could not be asked.
    #[error("the origin's API server could not review the request: {0}")]
    Review(#[from] kube::Error),
}

/// Reads a bearer token from an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// Authenticates a bearer token with the origin's TokenReview.
pub async fn review_token(client: &kube::Client, token: &str) -> Result<User, AuthError> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(AuthError::BadToken(
            status.error.unwrap_or_else(|| "token not accepted".into()),
        ));
    }
    let user = status.user.unwrap_or_default();
    Ok(User {
        name: user.username.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        uid: user.uid,
        extra: user.extra.unwrap_or_default(),
    })
}

/// How long an allowed decision is reused, as a kubelet's webhook authorizer does by default.
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// Decisions remembered at most; the oldest half is dropped beyond that.
const MAX_DECISIONS: usize = 1024;

/// A decision's subject and attributes: user, groups, verb, subresource.
type DecisionKey = (String, Vec<String>, String, String);

/// Allowed decisions, so that a busy caller (the API server) is not reviewed on every request.
/// Denials are never remembered: a grant takes effect at once.
#[derive(Default)]
pub struct DecisionCache {
    allowed: Mutex<HashMap<DecisionKey, Instant>>,
}

impl DecisionCache {
    /// Like [`authorize`], reusing an allowed decision younger than five minutes.
    pub async fn authorize(
        &self,
        client: &kube::Client,
        user: &User,
        access: &Access<'_>,
    ) -> Result<(), AuthError> {
        let key = (
            user.name.clone(),
            user.groups.clone(),
            access.verb.to_string(),
            access.subresource.to_string(),
        );
        // Only certificate users are cached: a token's user can carry extras and a UID that
        // the key does not hold.
        let cacheable = user.uid.is_none() && user.extra.is_empty();
        if cacheable {
            let allowed = self.allowed.locked();
            if allowed
                .get(&key)
                .is_some_and(|at| at.elapsed() < ALLOWED_TTL)
            {
                return Ok(());
            }
        }
        authorize(client, user, access).await?;
        if cacheable {
            let mut allowed = self.allowed.locked();
            if allowed.len() >= MAX_DECISIONS {
                allowed.retain(|_, at| at.elapsed() < ALLOWED_TTL / 2);
            }
            allowed.insert(key, Instant::now());
        }
        Ok(())
    }
}

/// What a request does to the node, in authorization terms.
#[derive(Debug, Clone, Copy)]
pub struct Access<'a> {
    /// `get`, `create`, ...
    pub verb: &'a str,
    /// The `nodes` subresource: `proxy`, `stats` or `metrics`.
    pub subresource: &'a str,
    /// The virtual node's name.
    pub node: &'a str,
}

/// Asks the origin whether `user` may have `access` to the node.
pub async fn authorize(
    client: &kube::Client,
    user: &User,
    access: &Access<'_>,
) -> Result<(), AuthError> {
    let Access {
        verb,
        subresource,
        node,
    } = *access;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            groups: Some(user.groups.clone()),
            uid: user.uid.clone(),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                resource: Some("nodes".into()),
                subresource: Some(subresource.to_string()),
                name: Some(node.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer.status.unwrap_or_default();
    if status.allowed {
        return Ok(());
    }
    Err(AuthError::Forbidden {
        user: user.name.clone(),
        verb: verb.to_string(),
        subresource: subresource.to_string(),
        reason: status.reason.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }
}
