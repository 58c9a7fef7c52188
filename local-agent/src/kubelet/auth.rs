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
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// The caller's address failed to authenticate too often lately.
    #[error("Too many failed authentications from this address; try again in a few seconds")]
    TooManyFailures,
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
/// How long a denial is reused, as a kubelet's webhook authorizer does by default: a grant
/// takes effect within this.
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Decisions remembered at most; the older ones are dropped beyond that.
const MAX_DECISIONS: usize = 1024;

/// A decision's subject and attributes: user, groups, UID, extras, verb, subresource.
type DecisionKey = (
    String,
    Vec<String>,
    Option<String>,
    BTreeMap<String, Vec<String>>,
    String,
    String,
);

/// A decision and when it was made: `None` when allowed, the reviewer's reason when denied.
type Decision = (Instant, Option<String>);

/// Recent decisions, so that a busy caller (the API server) is not reviewed on every request,
/// nor a refused one on each of its retries.
#[derive(Default)]
pub struct DecisionCache {
    decided: Mutex<HashMap<DecisionKey, Decision>>,
}

fn fresh((at, denied): &Decision) -> bool {
    at.elapsed()
        < if denied.is_none() {
            ALLOWED_TTL
        } else {
            DENIED_TTL
        }
}

impl DecisionCache {
    /// Like [`authorize`], reusing an allowed decision younger than five minutes and a denial
    /// younger than thirty seconds.
    pub async fn authorize(
        &self,
        client: &kube::Client,
        user: &User,
        access: &Access<'_>,
    ) -> Result<(), AuthError> {
        let key = (
            user.name.clone(),
            user.groups.clone(),
            user.uid.clone(),
            user.extra.clone(),
            access.verb.to_string(),
            access.subresource.to_string(),
        );
        let forbidden = |reason: String| AuthError::Forbidden {
            user: user.name.clone(),
            verb: access.verb.to_string(),
            subresource: access.subresource.to_string(),
            reason,
        };
        {
            let decided = self.decided.locked();
            if let Some(decision) = decided.get(&key).filter(|d| fresh(d)) {
                return match &decision.1 {
                    None => Ok(()),
                    Some(reason) => Err(forbidden(reason.clone())),
                };
            }
        }
        let result = authorize(client, user, access).await;
        let denied = match &result {
            Ok(()) => None,
            Err(AuthError::Forbidden { reason, .. }) => Some(reason.clone()),
            Err(_) => return result, // not a decision: asked again next time
        };
        let mut decided = self.decided.locked();
        if decided.len() >= MAX_DECISIONS {
            decided.retain(|_, d| fresh(d));
            if decided.len() >= MAX_DECISIONS {
                decided.clear();
            }
        }
        decided.insert(key, (Instant::now(), denied));
        result
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
